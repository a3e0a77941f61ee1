#!/usr/bin/env python3
"""What one eager call from Python costs, demi against PyTorch: an add of two one-element tensors and a
Linear/Dense layer call on a (1, 4) input, each timed over many calls (best of 5 rounds). One JSON line.

    PYTHONPATH=build/release/python build/py-venv/bin/python bench/python_op_overhead.py --framework demi
    build/torch-venv/bin/python bench/python_op_overhead.py --framework torch
"""
import argparse
import json
import time


def best_ns(fn, calls, rounds=5):
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=["demi", "torch"], required=True)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    if args.framework == "demi":
        import numpy as np
        import demi as ms
        from demi import nn
        ms.set_context(mode=ms.PYNATIVE_MODE)
        a = ms.Tensor(np.ones(1, np.float32))
        b = ms.Tensor(np.ones(1, np.float32))
        layer = nn.Dense(4, 4)
        x = ms.Tensor(np.ones((1, 4), np.float32))
        version = ms.__version__
    else:
        import torch
        torch.set_num_threads(2)
        a, b = torch.ones(1), torch.ones(1)
        layer = torch.nn.Linear(4, 4)
        x = torch.ones(1, 4)
        version = torch.__version__.split("+")[0]
    out = {"framework": f"{args.framework} {version}",
           "add_ns": best_ns(lambda: a + b, args.calls),
           "layer_ns": best_ns(lambda: layer(x), args.calls)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
