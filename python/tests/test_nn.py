import numpy as np
import pytest

import demi as ms
from demi import nn, ops


class SimpleCNN(nn.Cell):
    def __init__(self, pad_mode="valid"):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3, stride=1, padding=0, pad_mode=pad_mode)
        self.relu = nn.ReLU()
        self.max_pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(32 * 15 * 15, 10)

    def construct(self, x):
        return self.fc(self.flatten(self.max_pool(self.relu(self.conv1(x)))))


def twin_of(net):
    """The same layers as demi's C++ SequentialCell, with the same weights."""
    seq = nn.SequentialCell(nn.Conv2d(3, 32, 3, pad_mode="valid"), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                            nn.Dense(32 * 15 * 15, 10))
    weights = {name: t for name, t in net.parameters_and_names()}
    renamed = {"0.weight": weights["conv1.weight"], "4.weight": weights["fc.weight"], "4.bias": weights["fc.bias"]}
    not_loaded, unexpected = ms.load_param_into_net(seq, renamed, strict_load=True)
    assert not not_loaded and not unexpected
    return seq


def batches(n=6, seed=3):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((8, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, 8).astype(np.int32))
            for _ in range(n)]


def test_cell_registers_subcells_and_parameters_by_attribute():
    net = SimpleCNN()
    names = [n for n, _ in net.parameters_and_names()]
    assert names == ["conv1.weight", "fc.weight", "fc.bias"]  # MindSpore's Conv2d has no bias by default
    assert len(net.trainable_params()) == 3
    assert "SimpleCNN<" in repr(net) and "(fc): Dense" in repr(net)
    net.relu = net.relu  # the same cell again: nothing changes
    assert [n for n, _ in net.parameters_and_names()] == ["conv1.weight", "fc.weight", "fc.bias"]
    net.fc = nn.Dense(32 * 15 * 15, 5)  # assigning again replaces the sub-cell
    assert [n for n, _ in net.parameters_and_names()].count("fc.weight") == 1
    assert dict(net.parameters_and_names())["fc.weight"].shape == (5, 7200)


def test_own_parameters_of_a_python_cell_train():
    class Scale(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = ms.Parameter(ms.Tensor(np.ones(3, np.float32)), name="w")

        def construct(self, x):
            return x * self.w

    cell = Scale()
    assert [n for n, _ in cell.parameters_and_names()] == ["w"]
    opt = nn.SGD(cell.trainable_params(), 0.5)
    grad_fn = ms.value_and_grad(lambda x: ops.sum(cell(x)), None, opt.parameters)
    _, grads = grad_fn(ms.Tensor(np.array([1.0, 2.0, 3.0], np.float32)))
    opt(grads)
    np.testing.assert_allclose(cell.w.asnumpy(), [0.5, 0.0, -0.5])


@pytest.mark.parametrize("level", ["O0", "O2"])
@pytest.mark.parametrize("mode", ["GRAPH_MODE", "PYNATIVE_MODE"])
def test_python_construct_trains_as_its_cpp_twin(mode, level):
    """GRAPH_MODE fuses any network's Conv2d -> ReLU -> MaxPool2d calls as a SequentialCell's: the Python
    network's losses are its C++ twin's bit for bit. PYNATIVE_MODE runs the Python calls one by one where the
    SequentialCell fuses them: the same up to the fused kernel's summation order."""
    ms.set_context(mode=getattr(ms, mode))
    try:
        ms.set_seed(1)
        net = SimpleCNN()
        seq = twin_of(net)
        (x, y), = batches(1)
        losses = []
        for model in (net, seq):
            opt = nn.Momentum(model.trainable_params(), learning_rate=0.01, momentum=0.9)
            step = ms.amp.build_train_network(model, opt, nn.SoftmaxCrossEntropyWithLogits(True, "mean"), level=level,
                                              loss_scale_manager=ms.FixedLossScaleManager(1024.0, False))
            losses.append([step(ms.Tensor(x), ms.Tensor(y)).item() for _ in range(6)])
        if mode == "GRAPH_MODE":
            assert losses[0] == losses[1]
        else:
            # float16 activations (O2) round the two summation orders apart: float16 tolerances there
            tol = {"rtol": 1e-2, "atol": 1e-3} if level == "O2" else {"rtol": 1e-5, "atol": 1e-6}
            np.testing.assert_allclose(losses[0], losses[1], **tol)
        assert losses[0][-1] < losses[0][0]
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


def test_multi_input_construct_and_tuple_outputs():
    class Masked(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 4)

        def construct(self, x, mask, scale=2.0):
            y = self.fc(x) * mask
            return y * scale, ops.sum(y)

    net = Masked()
    x = ms.Tensor(np.ones((2, 4), np.float32))
    mask = ms.Tensor(np.array([[1, 0, 1, 0], [0, 1, 0, 1]], np.float32))
    y, total = net(x, mask)
    ref = net.fc(x).asnumpy() * mask.asnumpy()
    np.testing.assert_allclose(y.asnumpy(), 2 * ref, rtol=1e-6)
    assert total.item() == pytest.approx(ref.sum(), rel=1e-5)


def test_errors_name_the_layer_op_and_shapes():
    net = SimpleCNN(pad_mode="same")  # the seed as written: 8192 features into Dense(7200)
    with pytest.raises(ms.DemiError) as e:
        net(ms.Tensor(np.zeros((2, 3, 32, 32), np.float32)))
    msg = str(e.value)
    for part in ("'fc'", "Dense", "7200", "8192", "pad_mode"):
        assert part in msg


def test_a_users_exception_in_construct_comes_back_as_itself():
    class Broken(nn.Cell):
        def construct(self, x):
            raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        Broken()(ms.Tensor(np.zeros(2, np.float32)))


def test_a_cell_held_only_by_a_model_stays_alive():
    import gc
    ms.set_seed(2)
    net = SimpleCNN()
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    step = ms.amp.build_train_network(net, opt, nn.SoftmaxCrossEntropyWithLogits(True, "mean"), level="O0")
    del net
    gc.collect()
    (x, y), = batches(1)
    assert np.isfinite(step(ms.Tensor(x), ms.Tensor(y)).item())


def test_build_train_network_returns_mindspores_shapes():
    (x, y), = batches(1)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    net = SimpleCNN()
    step = ms.amp.build_train_network(net, nn.SGD(net.trainable_params(), 0.01), loss_fn, level="O2",
                                      loss_scale_manager=ms.DynamicLossScaleManager(1024.0, 2, 100))
    loss, overflow, scale = step(ms.Tensor(x), ms.Tensor(y))
    assert loss.dtype == ms.float32 and scale.item() == 1024.0 and not overflow.item()
    with pytest.raises(ValueError, match="boost_level"):
        ms.amp.build_train_network(net, nn.SGD(net.trainable_params(), 0.01), loss_fn, level="O2", boost_level="O1")
    with pytest.raises(ValueError, match="O0, O1"):
        ms.amp.build_train_network(net, nn.SGD(net.trainable_params(), 0.01), loss_fn, level="O5")


def test_checkpoint_round_trip(tmp_path):
    net, other = SimpleCNN(), SimpleCNN()
    path = tmp_path / "net.ckpt"
    ms.save_checkpoint(net, path)
    params = ms.load_checkpoint(path)
    assert sorted(params) == ["conv1.weight", "fc.bias", "fc.weight"]
    not_loaded, unexpected = ms.load_param_into_net(other, params)
    assert not_loaded == [] and unexpected == []
    x = ms.Tensor(np.ones((1, 3, 32, 32), np.float32))
    np.testing.assert_array_equal(net(x).asnumpy(), other(x).asnumpy())


def test_initializers_by_object_and_by_name():
    from demi.common.initializer import Constant, Normal
    d = nn.Dense(3, 2, weight_init=Constant(0.5), bias_init="zeros")
    np.testing.assert_array_equal(d.weight.asnumpy(), np.full((2, 3), 0.5, np.float32))
    np.testing.assert_array_equal(d.bias.asnumpy(), np.zeros(2, np.float32))
    w = nn.Dense(200, 100, weight_init=Normal(0.02)).weight.asnumpy()
    assert abs(w.std() - 0.02) < 0.002
    with pytest.raises(ms.DemiError, match="unknown initializer 'glorot'"):
        nn.Dense(3, 2, weight_init="glorot")


def test_what_demi_does_not_do_is_refused():
    class Unprefixed(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)

        def construct(self, x):
            return x

    with pytest.raises(ms.DemiError, match="auto_prefix"):
        Unprefixed()
    with pytest.raises(ValueError, match="capture_mode"):
        ms.jit(capture_mode="bytecode")
    with pytest.raises(ValueError, match="parameter groups"):
        nn.Momentum([{"params": []}], 0.1, 0.9)


def test_sgd_with_momentum_is_mindsporess_momentum():
    ms.set_seed(3)
    a, b = SimpleCNN(), SimpleCNN()
    ms.load_param_into_net(b, dict(a.parameters_and_names()), strict_load=True)
    (x, y), = batches(1)
    losses = []
    for net, opt in ((a, nn.SGD(a.trainable_params(), 0.01, momentum=0.9)),
                     (b, nn.Momentum(b.trainable_params(), 0.01, 0.9))):
        step = ms.amp.build_train_network(net, opt, nn.SoftmaxCrossEntropyWithLogits(True, "mean"), level="O0")
        losses.append([step(ms.Tensor(x), ms.Tensor(y)).item() for _ in range(3)])
    assert losses[0] == losses[1]
