#!/usr/bin/python3
"""PyTorch twins of demi's reference models (BENCHMARKS.md A, B, C), timed the same way demi times them:
the median train step (forward, loss, backward, optimizer update with zero-grad) after warm-up, on random
data held in memory, Momentum(0.01, 0.9). Prints one JSON line.

Run with Debian's interpreter and torch (python3-torch), as bench/compare.py does:
    /usr/bin/python3 bench/torch_models.py --model A --precision bf16 --steps 30
"""
import argparse
import json
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def model_a():
    return nn.Sequential(nn.Conv2d(3, 32, 3, bias=False), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                         nn.Linear(32 * 15 * 15, 10))


def model_b():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def model_c():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def median_step(net, opt, xs, ys, precision, warmup, steps):
    """Median seconds of a train step (zero-grad, forward and loss — under bf16 or fp16 autocast if asked —,
    backward, update; fp16 with a dynamic loss scale, GradScaler("cpu"), as demi's O2-fp16 has) after
    `warmup` steps, cycling over the batches; and the last loss."""
    times = []
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    for i in range(warmup + steps):
        x, y = xs[i % len(xs)], ys[i % len(ys)]
        t0 = time.perf_counter()
        opt.zero_grad()
        if precision in ("bf16", "fp16"):
            with torch.autocast("cpu", dtype=torch.bfloat16 if precision == "bf16" else torch.float16):
                loss = F.cross_entropy(net(x), y)
        else:
            loss = F.cross_entropy(net(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), float(loss)


MODELS = {"A": (model_a, (3, 32, 32), 32), "B": (model_b, (1, 28, 28), 128), "C": (model_c, (1, 28, 28), 256)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="A")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.precision == "fp16" and not hasattr(torch.amp, "GradScaler"):
        sys.exit(f"torch {torch.__version__} has no torch.amp.GradScaler (the CPU loss scaler arrived in "
                 "torch 2.3): its fp16 peer is not run")
    torch.manual_seed(0)
    build, shape, batch = MODELS[args.model]
    net = build()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    xs = [torch.randn(batch, *shape) for _ in range(4)]
    ys = [torch.randint(0, 10, (batch,)) for _ in range(4)]
    med, loss = median_step(net, opt, xs, ys, args.precision, args.warmup, args.steps)
    print(json.dumps({"framework": "pytorch", "model": args.model, "setting": args.precision, "batch": batch,
                      "samples_per_second": batch / med, "median_step_ms": med * 1e3,
                      "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "final_loss": loss}))


if __name__ == "__main__":
    main()
