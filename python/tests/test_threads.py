"""The GIL, demi's threads and the interpreter's life: each case in its own interpreter, with a timeout, so
that a deadlock fails the test instead of hanging it."""
import signal
import subprocess
import sys
import time

from conftest import run_python

TRAIN = """
import numpy as np, demi as ms, demi.dataset as ds
from demi import nn
class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(64, 4)
    def construct(self, x):
        return self.fc(x)
def rows(n):
    for i in range(n):
        yield np.random.randn(64).astype(np.float32), i % 4
class Count(ms.Callback):
    steps = 0
    def on_train_step_end(self, ctx):
        Count.steps += 1
net = Net()
model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(True, "mean"), nn.SGD(net.trainable_params(), 0.01),
                 amp_level="O2")
"""


def test_python_source_construct_and_callback_together_on_demis_prefetch_thread():
    code = TRAIN + """
model.train(3, ds.GeneratorDataset(lambda: rows(400), column_names=["x", "y"]).batch(8),
            callbacks=[Count()], dataset_sink_mode=True, sink_size=0)
print("steps", Count.steps)
"""
    r = run_python(code, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "steps 150" in r.stdout


def test_interpreter_exits_cleanly_in_the_middle_of_an_epoch():
    code = TRAIN + """
it = ds.GeneratorDataset(lambda: rows(10**6), column_names=["x", "y"]).batch(8).create_tuple_iterator()
next(it)
print("leaving")
"""
    r = run_python(code, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "leaving" in r.stdout


def test_ctrl_c_stops_training_with_keyboard_interrupt():
    code = TRAIN + """
import sys
print("training", flush=True)
try:
    model.train(10**6, ds.GeneratorDataset(lambda: rows(64), column_names=["x", "y"]).batch(8),
                dataset_sink_mode=True, sink_size=0)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "training"
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 3, err
    assert "interrupted" in out
