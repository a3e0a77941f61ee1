import numpy as np
import pytest

import demi as ms
import demi.dataset as ds
from demi import nn, Model, LossMonitor, TimeMonitor


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(12, 3)

    def construct(self, x):
        return self.fc(self.flatten(x))


def dataset(n=64, batch=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3, 2, 2)).astype(np.float32)
    y = (x.reshape(n, -1).sum(1) > 0).astype(np.int32) + (x[:, 0, 0, 0] > 1).astype(np.int32)
    return ds.GeneratorDataset(lambda: zip(x, y), column_names=["image", "label"]).batch(batch)


def make_model(level="O2", **kwargs):
    ms.set_seed(5)
    net = Net()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    return Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt,
                 metrics={"Accuracy": nn.Accuracy()}, amp_level=level, **kwargs)


def test_model_trains_prints_mindsporess_monitors_and_evaluates(capsys):
    model = make_model(loss_scale_manager=ms.FixedLossScaleManager(1024.0, drop_overflow_update=False))
    model.train(3, dataset(), callbacks=[TimeMonitor(), LossMonitor(per_print_times=4)], dataset_sink_mode=False)
    out = capsys.readouterr().out
    assert "epoch: 1 step: 4, loss is" in out and "epoch: 3 step: 8, loss is" in out
    assert "epoch time:" in out and "per step time:" in out
    summary = model.last_summary()
    assert summary.steps == 24 and summary.final_loss < 1.0
    metrics = model.eval(dataset(seed=0))
    assert set(metrics) == {"Accuracy"} and metrics["Accuracy"] > 0.6
    assert model.predict(ms.Tensor(np.zeros((2, 3, 2, 2), np.float32))).shape == (2, 3)


def test_o2_in_python_gives_the_same_losses_as_the_same_model_again():
    a, b = make_model(), make_model()
    for m in (a, b):
        m.train(2, dataset(), dataset_sink_mode=True)
    assert a.last_summary().final_loss == b.last_summary().final_loss


def test_python_callbacks_see_mindsporess_names_and_can_stop():
    seen = []

    class Recorder(ms.Callback):
        def on_train_begin(self, run_context):
            seen.append("begin")

        def on_train_step_end(self, run_context):
            p = run_context.original_args()
            seen.append((p.cur_epoch_num, p.cur_step_num, float(p.net_outputs.asnumpy())))
            if p.cur_step_num == 5:
                run_context.request_stop()

        def epoch_end(self, run_context):  # MindSpore 1.x's name
            seen.append("epoch_end")

    model = make_model("O0")
    model.train(3, dataset(), callbacks=Recorder())
    steps = [s for s in seen if isinstance(s, tuple)]
    assert seen[0] == "begin" and [s[1] for s in steps] == [1, 2, 3, 4, 5]
    assert all(np.isfinite(s[2]) for s in steps)


def test_model_refuses_what_it_does_not_do():
    net = Net()
    opt = nn.SGD(net.trainable_params(), 0.1)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True)
    with pytest.raises(ValueError, match="boost_level"):
        Model(net, loss, opt, boost_level="O1")
    with pytest.raises(ValueError, match="frobnicate"):
        Model(net, loss, opt, frobnicate=True)
    with pytest.raises(ValueError, match="unknown metric"):
        Model(net, loss, opt, metrics={"precision"})
    with pytest.raises(ms.DemiError, match="O7|level"):
        Model(net, loss, opt, amp_level="O7")
    with pytest.raises(ValueError, match="device_target|Ascend"):
        try:
            ms.set_context(device_target="Ascend")
        except ms.DemiError as e:
            raise ValueError(str(e))
    with pytest.raises(ValueError, match="max_device_memory"):
        ms.set_context(max_device_memory="4GB")


def test_bfloat16_mixed_precision_is_demis_extra():
    model = make_model("O2", amp_dtype=ms.bfloat16)
    model.train(1, dataset())
    assert np.isfinite(model.last_summary().final_loss)
    with pytest.raises(ValueError, match="amp_dtype"):
        make_model("O2", amp_dtype=ms.int32)


def test_functional_loss_scalers_and_all_finite():
    g = [ms.Tensor(np.array([2.0, -4.0], np.float32))]
    for scaler in (ms.amp.StaticLossScaler(8.0), ms.amp.DynamicLossScaler(8.0, 2.0, 2)):
        assert scaler.scale(ms.Tensor(np.float32(1.5))).item() == 12.0
        np.testing.assert_array_equal(scaler.unscale(g)[0].asnumpy(), [0.25, -0.5])
        np.testing.assert_array_equal(g[0].asnumpy(), [2.0, -4.0])  # a new tensor, as MindSpore's
    dynamic = ms.amp.DynamicLossScaler(8.0, 2.0, 2)
    assert dynamic.adjust(False) is False and dynamic.scale_value == 4.0  # backs off on an overflow
    dynamic.adjust(True)
    dynamic.adjust(True)
    assert dynamic.scale_value == 8.0  # grows after scale_window finite steps
    assert ms.amp.all_finite(g)
    assert not ms.amp.all_finite(g + [ms.Tensor(np.array([np.inf], np.float32))])
