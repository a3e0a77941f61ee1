#!/usr/bin/env python3
"""Reference models A and B written in Python on demi (nn.Cell subclasses with construct, as a MindSpore user
writes them), trained by Model.train on random data held by demi (NumpySlicesDataset: no Python per row), so
the step time is the network's, called from Python. One JSON line: median step ms and samples/s.

    PYTHONPATH=build/release/python build/py-venv/bin/python bench/python_models.py --model A --amp O2 --dtype bf16
"""
import argparse
import json

import numpy as np

import demi as ms
import demi.dataset as ds
from demi import nn


class ModelA(nn.Cell):  # the seed's SimpleCNN
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3, stride=1, pad_mode="valid")
        self.relu = nn.ReLU()
        self.max_pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(32 * 15 * 15, 10)

    def construct(self, x):
        return self.fc(self.flatten(self.max_pool(self.relu(self.conv1(x)))))


class ModelB(nn.Cell):  # LeNet-style (BENCHMARKS.md)
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, pad_mode="same", has_bias=True)
        self.conv2 = nn.Conv2d(32, 64, 3, pad_mode="same", has_bias=True)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(3136, 128)
        self.fc2 = nn.Dense(128, 10)

    def construct(self, x):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        return self.fc2(self.relu(self.fc1(self.flatten(x))))


SHAPES = {"A": ((3, 32, 32), 32, ModelA), "B": ((1, 28, 28), 128, ModelB)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="A", choices=sorted(SHAPES))
    ap.add_argument("--amp", default="O0")
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--mode", default="GRAPH_MODE", choices=["GRAPH_MODE", "PYNATIVE_MODE"])
    ap.add_argument("--no-capture", action="store_true")
    args = ap.parse_args()

    ms.set_context(mode=getattr(ms, args.mode), python_capture=not args.no_capture)
    ms.set_seed(0)
    shape, batch, cls = SHAPES[args.model]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.samples,) + shape).astype(np.float32)
    y = rng.integers(0, 10, args.samples).astype(np.int32)
    data = ds.NumpySlicesDataset((x, y), column_names=["image", "label"], shuffle=False).batch(batch, True)
    net = cls()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt, amp_level=args.amp,
                     amp_dtype=ms.bfloat16 if args.dtype == "bf16" else ms.float16)
    model.train(args.epochs, data, dataset_sink_mode=True, sink_size=0)
    s = model.last_summary()
    print(json.dumps({"median_step_ms": s.median_step_seconds * 1e3,
                      "samples_per_second": batch / s.median_step_seconds,
                      "peak_train": s.peak_train_bytes, "capture": list(net._capture_stats())}))


if __name__ == "__main__":
    main()
