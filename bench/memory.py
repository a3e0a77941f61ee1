#!/usr/bin/python3
"""The training peak per model x AMP setting against O0 (issue 15's table), and the memory forecast against
it. For each model and setting: `demi plan --json` (the forecast, nothing trained), then `demi train --json`
for a few steps (the measured training peak: every tracked category but the data set). Prints

  1. the measured training peak, its composition and its ratio to O0's (PYNATIVE mode, forecast and training:
     graph mode places the update in backward where it can, which the +oib rows show);
  2. the floor of each low-precision setting: its own FP32 master weights and optimizer state (which O2
     keeps by MindSpore's definition; bf16 state is an explicit option) plus half of everything else O0
     held at its peak, over O0's peak — the ratio if every gradient, activation and workspace byte halved;
  3. the forecast against the measurement, and the error in percent.

    bench/memory.py [--models A,B,C,D,R] [--steps 6] [--demi build/release/tools/demi/demi]

The kernel choices of a shape are measured at its first use (and kept on disk): run the bench once more
when the choice files were empty, since a first run's choices may differ in workspace.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATS = ["parameter", "gradient", "optimizer_state", "activation", "cast_cache", "workspace", "other"]
SHORT = {"parameter": "param", "gradient": "grad", "optimizer_state": "optim", "activation": "activ.",
         "cast_cache": "cast", "workspace": "work", "other": "other"}
# (label, extra arguments); O0 first: the ratios are against it.
SETTINGS = [
    ("O0", ["--amp", "O0"]),
    ("O1-bf16", ["--amp", "O1", "--dtype", "bf16"]),
    ("O2-fp16", ["--amp", "O2", "--dtype", "fp16"]),
    ("O2-bf16", ["--amp", "O2", "--dtype", "bf16"]),
    ("O2-bf16 +oib", ["--amp", "O2", "--dtype", "bf16", "--optimizer-in-backward", "on"]),
    # bf16 optimizer state changes the numerics: an explicit option, never implied by the level.
    ("O2-fp16 +bf16 state", ["--amp", "O2", "--dtype", "fp16", "--optimizer-state", "bf16"]),
    ("O2-bf16 +bf16 state", ["--amp", "O2", "--dtype", "bf16", "--optimizer-state", "bf16"]),
    ("O2-bf16 +oib +bf16 st.", ["--amp", "O2", "--dtype", "bf16", "--optimizer-in-backward", "on", "--optimizer-state",
                                "bf16"]),
    ("O3-fp16", ["--amp", "O3", "--dtype", "fp16"]),
    ("O3-bf16", ["--amp", "O3", "--dtype", "bf16"]),
]
EXTRA = {"D": [("O2-bf16 +recompute", ["--amp", "O2", "--dtype", "bf16", "--recompute"]),
               ("O0 +recompute-attn", ["--amp", "O0", "--recompute-attention"]),
               ("O2-bf16 +recompute-attn", ["--amp", "O2", "--dtype", "bf16", "--recompute-attention"],
                "O0 +recompute-attn"),
               ("O2-bf16 +rec-attn +bf16 st.", ["--amp", "O2", "--dtype", "bf16", "--recompute-attention",
                                                "--optimizer-state", "bf16"], "O0 +recompute-attn")]}
MIB = float(1 << 20)


def last_json(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.stderr.write(f"failed: {' '.join(cmd)}\n{out.stderr}\n")
        return None
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="A,B,C,D,R")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--demi", default=os.path.join(ROOT, "build/release/tools/demi/demi"))
    a = ap.parse_args()
    rows = []
    for model in a.models.split(","):
        base = ["--model", model, "--data", "synthetic", "--train-samples", str(64 * 32)]
        for setting in SETTINGS + EXTRA.get(model, []):
            label, extra = setting[0], setting[1]
            base_label = setting[2] if len(setting) > 2 else "O0"  # the O0 row its ratios are against
            plan = last_json([a.demi, "plan", "--json", "--mode", "pynative"] + base + extra)
            run = last_json([a.demi, "train", "--json", "--mode", "pynative", "--steps", str(a.steps)] + base + extra)
            if plan is None or run is None:
                continue
            rows.append({"model": model, "setting": label, "base": base_label, "forecast": plan["train_peak"],
                         "measured": run["peak_train"], "rss": run["peak_rss"],
                         "parts": {c: run.get("at_train_peak_" + c, 0) for c in CATS}})
            r = rows[-1]
            print(f"  {model} {label:<28} measured {r['measured'] / MIB:8.2f} MiB, forecast "
                  f"{r['forecast'] / MIB:8.2f} MiB", file=sys.stderr)
    print("\nthe training's own peak (every category but the data set), eager mode, MiB; ratio to O0's (to O0 with"
          " the same recomputation for the +recompute-attn rows)")
    head = f"{'model':<6}{'setting':<28}" + "".join(f"{SHORT[c]:>8}" for c in CATS[:-1]) + \
        f"{'train':>9}{'x O0':>7}{'floor':>7}{'RSS':>8}{'x O0':>7}"
    print(head)
    by_setting = {(r["model"], r["setting"]): r for r in rows}
    for r in rows:
        b = by_setting.get((r["model"], r["base"]))
        ratio = f"{r['measured'] / b['measured']:7.3f}" if b else "      -"
        rss = f"{r['rss'] / b['rss']:7.3f}" if b else "      -"
        floor = "      -"
        if b and r is not b:
            kept = r["parts"]["parameter"] + r["parts"]["optimizer_state"]
            rest = b["measured"] - b["parts"]["parameter"] - b["parts"]["optimizer_state"]
            floor = f"{(kept + rest / 2) / b['measured']:7.3f}"
        print(f"{r['model']:<6}{r['setting']:<28}" + "".join(f"{r['parts'][c] / MIB:8.2f}" for c in CATS[:-1]) +
              f"{r['measured'] / MIB:9.2f}{ratio}{floor}{r['rss'] / MIB:8.1f}{rss}")
    print("floor: the row's FP32 masters and optimizer state plus half of the rest of O0's peak, over O0's peak")
    print("\nthe memory forecast (demi plan: a probe of one batch, nothing trained) against the measured peak")
    print(f"{'model':<6}{'setting':<28}{'forecast MiB':>14}{'measured MiB':>14}{'error':>9}")
    worst = 0.0
    for r in rows:
        err = 100.0 * (r["forecast"] - r["measured"]) / r["measured"]
        worst = max(worst, abs(err))
        print(f"{r['model']:<6}{r['setting']:<28}{r['forecast'] / MIB:14.2f}{r['measured'] / MIB:14.2f}{err:8.2f}%")
    print(f"largest |error|: {worst:.2f}% over {len(rows)} settings")


if __name__ == "__main__":
    main()
