#!/usr/bin/python3
"""The GPT on the King James Bible, demi against PyTorch, interleaved in one run: demi O0, PyTorch fp32, demi
O2-bf16, PyTorch bf16 autocast, demi O2-fp16 (dynamic loss scale), repeated; the same architecture and recipe
(bench/torch_gpt.py). Prints the median tokens/s, the validation loss (nats per character) and demi's
training peak per setting, with ratios; every measurement is appended to bench/results/compare.jsonl.

    /usr/bin/python3 bench/compare_gpt.py [--reps 1] [--steps 200] [--torch-python PY ...]

Parity (validation loss within 1% of O0 after 2,000 steps): --steps 2000 --eval-every 500 --reps 1.
"""
import argparse
import datetime
import json
import os
import statistics
import sys

from compare import ROOT, TORCH_ENV, run_json_lines as run_json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--demi", default=os.path.join(ROOT, "build", "release", "tools", "demi", "demi"))
    ap.add_argument("--torch-python", action="append", default=None,
                    help="a Python with torch (repeat for several: Debian's 1.13, a venv's PyPI torch)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--config", default="default", choices=["default", "nanogpt-cpu"],
                    help="default: 4 layers x 4 heads x 256, context 128, batch 32; nanogpt-cpu: nanoGPT's "
                         "Shakespeare-char CPU run, 4 x 4 x 128, context 64, batch 12")
    ap.add_argument("--eval-windows", type=int, default=256)
    args = ap.parse_args()
    block, dim, batch = (128, 256, 32) if args.config == "default" else (64, 128, 12)
    pythons = [] if args.no_torch else (args.torch_python or ["/usr/bin/python3"])
    text = run_json_text([args.demi, "data", "kjv"])
    common = ["--steps", str(args.steps), "--eval-every", str(args.eval_every), "--eval-windows", str(args.eval_windows),
              "--layers", "4", "--heads", "4", "--dim", str(dim)]
    demi_only = ["--block-size", str(block), "--batch-size", str(batch)]
    torch_only = ["--block", str(block), "--batch", str(batch)]
    stamp = datetime.datetime.utcnow().isoformat(timespec="seconds")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    log = open(os.path.join(ROOT, "bench", "results", "compare.jsonl"), "a")
    results = {}
    for rep in range(args.reps):
        runs = [("demi", "O0", "fp16")] + [("torch", py, "fp32") for py in pythons] + [("demi", "O2", "bf16")] + \
               [("torch", py, "bf16") for py in pythons] + [("demi", "O2", "fp16")]
        for fw, a, b in runs:
            if fw == "demi":
                rows = run_json([args.demi, "train", "--model", "gpt", "--json", "--amp", a, "--dtype", b] + common +
                                demi_only)
                name = "demi " + ("O0" if a == "O0" else f"O2-{b}")
            else:
                env = dict(os.environ, **TORCH_ENV)
                rows = run_json([a, os.path.join(ROOT, "bench", "torch_gpt.py"), "--text", text, "--precision", b] +
                                common + torch_only, env)
                name = f"torch {next((r.get('torch') for r in rows if 'torch' in r), '?')} {b}"
            summary = next((r for r in rows if r.get("kind") == "summary"), None)
            if summary is None:
                continue
            summary.update({"rep": rep, "time": stamp, "model": "gpt", "name": name, "config": args.config})
            log.write(json.dumps(summary) + "\n")
            results.setdefault(name, []).append(summary)
            print(f"  rep {rep} {name:22s} {summary['tokens_per_second']:9.0f} tokens/s  valid loss "
                  f"{summary['valid_loss']:.4f}", file=sys.stderr)
    log.close()

    def med(name, key):
        rs = results.get(name)
        return statistics.median(r[key] for r in rs) if rs else float("nan")

    base = "demi O0"
    print(f"GPT ({args.config}) on the King James Bible, {args.steps} steps, median of {args.reps} interleaved "
          "repetition(s)")
    print(f"  {'setting':24s} {'tokens/s':>9s} {'x demi O0':>9s} {'valid loss':>10s} {'train peak':>10s} "
          f"{'RSS MiB':>8s}")
    for name in results:
        peak = med(name, "peak_train") if "peak_train" in results[name][0] else float("nan")
        print(f"  {name:24s} {med(name, 'tokens_per_second'):9.0f} "
              f"{med(name, 'tokens_per_second') / med(base, 'tokens_per_second'):9.2f} "
              f"{med(name, 'valid_loss'):10.4f} {peak / (1 << 20):10.2f} {med(name, 'peak_rss') / (1 << 20):8.1f}")
    print("  (train peak: demi's tracked training peak; RSS: the process's peak resident set)")


def run_json_text(cmd):
    import subprocess
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


if __name__ == "__main__":
    main()
