"""GRAPH_MODE's capture of a Python construct: recorded twice, then replayed in C++ without Python; the same
losses bit for bit as running the Python every step; refused (eager, one warning) where it cannot hold."""
import warnings

import numpy as np
import pytest

import demi as ms
from demi import nn, ops


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="valid")
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(8 * 3 * 3, 4)
        self.scale = ms.Parameter(ms.Tensor(np.ones(4, np.float32)), name="scale")

    def construct(self, x):
        y = self.flatten(self.pool(self.relu(self.conv(x))))
        return ops.softmax(self.fc(y), axis=-1) * self.scale + 0.5 * self.fc(y)


def batches(n, batch=4, seed=0):
    rng = np.random.default_rng(seed)
    return [(ms.Tensor(rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)),
             ms.Tensor(rng.integers(0, 4, batch).astype(np.int32))) for _ in range(n)]


def train(capture, level="O2", data=None, net_class=Net):
    ms.set_context(mode=ms.GRAPH_MODE, python_capture=capture)
    try:
        ms.set_seed(7)
        net = net_class()
        opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
        step = ms.amp.build_train_network(net, opt, nn.SoftmaxCrossEntropyWithLogits(True, "mean"), level=level,
                                          loss_scale_manager=ms.FixedLossScaleManager(256.0, False))
        losses = [step(x, y).item() for x, y in (data or batches(12))]
        return losses, net._capture_stats()
    finally:
        ms.set_context(python_capture=True)


@pytest.mark.parametrize("level", ["O0", "O2"])
def test_replayed_steps_give_the_python_steps_losses_bit_for_bit(level):
    eager, (calls, replays) = train(False, level)
    assert replays == 0 and calls >= 12
    captured, (calls, replays) = train(True, level)
    assert captured == eager
    assert replays >= 8 and calls <= 4  # two recordings per key (and the fusion probe's batch)


def test_a_new_shape_records_its_own_tape():
    data = batches(6) + batches(6, batch=3, seed=1)
    eager, _ = train(False, data=data)
    captured, (calls, replays) = train(True, data=data)
    assert captured == eager and replays >= 4


def test_a_construct_that_reads_values_stays_eager_and_says_why_once():
    class Branchy(Net):
        def construct(self, x):
            y = self.fc(self.flatten(self.pool(self.relu(self.conv(x)))))
            return y * 2 if y.sum().item() > 0 else y

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        eager, _ = train(False, net_class=Branchy)
        captured, (calls, replays) = train(True, net_class=Branchy)
    assert captured == eager and replays == 0
    said = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
    assert len(said) == 1 and "Branchy.construct runs in Python" in said[0] and "item" in said[0]


def test_a_construct_whose_ops_follow_python_state_stays_eager():
    class Counting(Net):
        calls = 0

        def construct(self, x):
            Counting.calls += 1
            y = self.fc(self.flatten(self.pool(self.relu(self.conv(x)))))
            return y * 2 if Counting.calls % 2 else ops.relu(y)

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        Counting.calls = 0
        eager, _ = train(False, net_class=Counting)
        Counting.calls = 0
        captured, (calls, replays) = train(True, net_class=Counting)
    assert replays == 0
    assert any("different ops on two calls" in str(x.message) for x in w)
    # Its alternating ops also keep graph mode's memory plans from holding: the step at which graph mode
    # stops retracing (and fusing) moves with the recordings' allocations, so the last steps' sums may
    # round differently.
    np.testing.assert_allclose(captured, eager, rtol=1e-2)


def test_pynative_never_captures():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        net = Net()
        for x, _ in batches(4):
            net(x)
        assert net._capture_stats() == (4, 0)
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
