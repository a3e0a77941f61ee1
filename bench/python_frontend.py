#!/usr/bin/env python3
"""The Python front end measured (issue 50), interleaved in one run: reference models A and B written in Python
on demi (GRAPH_MODE, construct captured) against the same models from C++ (`demi train`) and PyTorch 2.15 eager,
at fp32/O0, bf16 and fp16, each configuration in its own process, R rounds, medians and ratios; then the cost
of one eager call from Python, demi against PyTorch.

    bench/python_frontend.py [--rounds 3]      (after make build and scripts/setup --bench)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (demi_run, torch_run, torch_peers: the C++ and PyTorch runs of compare.py)

ROOT = compare.ROOT
BUILD = os.path.join(ROOT, "build", "release")
PY = os.path.join(ROOT, "build", "py-venv", "bin", "python")
PY_ENV = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))


def python_run(model, amp, dtype, extra=()):
    samples, _ = compare.SIZES[model]
    out = subprocess.run([PY, os.path.join(ROOT, "bench", "python_models.py"), "--model", model, "--amp", amp,
                          "--dtype", dtype, "--samples", str(samples), *extra],
                         capture_output=True, text=True, env=PY_ENV, check=False)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="AB")
    args = ap.parse_args()
    demi = os.path.join(BUILD, "tools", "demi", "demi")
    peers = [p for p in compare.torch_peers([]) if not p[0].startswith("torch 1.")]
    settings = [("fp32", "O0", "fp16"), ("bf16", "O2", "bf16"), ("fp16", "O2", "fp16")]
    results = {}
    for _ in range(args.rounds):
        for model in args.models:
            for precision, amp, dtype in settings:
                runs = {"demi C++": compare.demi_run(demi, model, amp, dtype),
                        "demi Python": python_run(model, amp, dtype),
                        "demi Python (no capture)": python_run(model, amp, dtype, ["--no-capture"])}
                for label, python in peers:
                    runs[label + " eager"] = compare.torch_run(python, label, model, precision)
                for name, r in runs.items():
                    if r is not None:
                        results.setdefault((model, precision, name), []).append(r["samples_per_second"])
    print(f"{'model':5} {'precision':9} {'framework':26} {'samples/s':>10} {'vs demi C++':>11}")
    for model in args.models:
        for precision, _, _ in settings:
            base = results.get((model, precision, "demi C++"))
            for (m, p, name), v in sorted(results.items()):
                if m != model or p != precision:
                    continue
                med = statistics.median(v)
                ratio = f"{med / statistics.median(base):.2f}x" if base else "-"
                print(f"{model:5} {precision:9} {name:26} {med:10.0f} {ratio:>11}")
    for cmd, env in (([PY, os.path.join(ROOT, "bench", "python_op_overhead.py"), "--framework", "demi"], PY_ENV),
                     *[([py, os.path.join(ROOT, "bench", "python_op_overhead.py"), "--framework", "torch"], None)
                       for _, py in peers]):
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if out.returncode == 0:
            d = json.loads(out.stdout)
            print(f"one eager call from Python, {d['framework']}: add {d['add_ns'] / 1e3:.2f} us, "
                  f"layer {d['layer_ns'] / 1e3:.2f} us")


if __name__ == "__main__":
    main()
