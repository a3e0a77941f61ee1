"""The examples in examples/python, run as a user runs them."""
import os
import re

from conftest import ROOT, run_python

EXAMPLES = os.path.join(ROOT, "examples", "python")


def test_seed_program_as_written_is_refused_naming_the_layer_and_shapes():
    r = run_python([os.path.join(EXAMPLES, "seed_as_written.py")])
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("demi._core.DemiError: in SimpleCNN layer 'fc' (Dense)"), r.stderr
    for part in ("7200", "8192", "pad_mode"):
        assert part in last
    assert "Segmentation" not in r.stderr


def test_seed_program_trains_two_epochs_at_o2_both_ways():
    r = run_python([os.path.join(EXAMPLES, "seed_simple_cnn.py"), "--epochs", "2"])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Model configured with AMP level O2." in out and "Training finished." in out
    assert re.search(r"epoch: 2 step: 32, loss is \d+\.\d+", out), out
    assert len(re.findall(r"epoch time: [\d.]+ ms, per step time: [\d.]+ ms", out)) == 2
    assert "way 2: epoch 2: 32 steps" in out and "Way 2 finished." in out


def test_quick_start_reaches_82_percent_on_fashion_mnist_in_3_epochs(fashion_mnist_dir, tmp_path):
    r = run_python([os.path.join(EXAMPLES, "quick_start.py"), str(fashion_mnist_dir)], timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    accuracies = [float(a) for a in re.findall(r"Accuracy: ([\d.]+)%", r.stdout)]
    assert len(accuracies) == 3, r.stdout
    assert accuracies[-1] >= 82.0, r.stdout
    assert "Saved Model to model.ckpt" in r.stdout and "Predicted:" in r.stdout
