#!/usr/bin/python3
"""GRAPH_MODE against PYNATIVE_MODE (issue 14's table): for each model and AMP setting, `demi train --json`
in both modes, interleaved round by round on one machine. Prints per model x setting:

  - samples/s in each mode (median of the rounds), graph / eager (the median of each round's pair of runs)
    and in how many rounds graph mode was faster;
  - the training peak (tracked tensor bytes), the process's peak RSS and the bytes the allocator holds
    from the system at the end (the caching allocator's blocks, and in graph mode the arena), and whether
    graph mode placed the update in backward (below PYNATIVE's peak where it did);
  - the static plan: its arena against the lower bound (most bytes of step temporaries alive at once) and
    the upper bound (their sum), the step's allocations, the traced step's time (against the median
    step) and the time to plan, and how many updates replayed
    the plan and how many left it (overflow steps).

Then sink mode on model A (where a step is shortest, so per-step work outside the kernels weighs most):
graph mode with every step seen by the callbacks (--sink-size 0) against one sink per epoch (-1) and
sinks of 64 batches, steps/s, interleaved. The CLI's progress bar is the callback (no --json for these
runs; the summary line is parsed).

A-zoo and B-zoo are models A and B written as the seed and MindSpore's model zoo write networks (`demi train
--zoo-style`: each layer called in construct): PYNATIVE runs every call as written, graph mode fuses them
(nn/call_fusion.h), as A's and B's own code does by hand.

    bench/graph_mode.py [--models A,B,C,D,A-zoo,B-zoo] [--rounds 3] [--sink-rounds 5]
                        [--demi build/release/tools/demi/demi]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

from memory import MIB, ROOT, last_json  # bench/memory.py: runs a demi command, returns its last JSON line

SETTINGS = [
    ("O0", ["--amp", "O0"]),
    ("O2-bf16", ["--amp", "O2", "--dtype", "bf16"]),
    ("O2-fp16", ["--amp", "O2", "--dtype", "fp16"]),
]
# Enough samples for a steady second epoch of a second or so on 2 cores.
SAMPLES = {"A": 8192, "B": 4096, "C": 8192, "D": 512, "R": 256}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="A,B,C,D,A-zoo,B-zoo")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sink-rounds", type=int, default=5)
    ap.add_argument("--demi", default=os.path.join(ROOT, "build/release/tools/demi/demi"))
    a = ap.parse_args()
    models = a.models.split(",")
    runs = {}  # (model, setting, mode) -> [summaries]
    ratios = {}  # (model, setting) -> [graph / eager samples/s of each round's pair of runs]
    for r in range(a.rounds):
        for model in models:
            name = model.removesuffix("-zoo")
            base = ["--model", name, "--data", "synthetic", "--epochs", "2",
                    "--train-samples", str(SAMPLES.get(name, 2048))] + (["--zoo-style"] if name != model else [])
            for label, extra in SETTINGS:
                pair = {}
                # (alternating which mode runs first, so that a drift within a pair favours neither)
                for mode in ("pynative", "graph") if r % 2 == 0 else ("graph", "pynative"):
                    s = last_json([a.demi, "train", "--json", "--mode", mode] + base + extra)
                    if s is not None:
                        runs.setdefault((model, label, mode), []).append(s)
                        pair[mode] = float(s["samples_per_second"])
                if len(pair) == 2:
                    ratios.setdefault((model, label), []).append(pair["graph"] / pair["pynative"])
        print(f"round {r + 1} of {a.rounds} done", file=sys.stderr)

    def med(model, label, mode, key):
        v = [float(s[key]) for s in runs.get((model, label, mode), [])]
        return statistics.median(v) if v else float("nan")

    print("GRAPH_MODE against PYNATIVE_MODE: samples/s (median of %d interleaved rounds) and memory, MiB" % a.rounds)
    head = ("model", "setting", "eager/s", "graph/s", "g/e", "g wins", "peak e", "peak g", "RSS e", "RSS g",
            "held e", "held g", "arena", "lower", "a/l", "upper", "allocs", "step ms", "trace ms", "plan ms",
            "replay", "left", "upd.bwd", "fused")
    print(("%-5s %-8s" + " %8s" * (len(head) - 2)) % head)
    for model in models:
        for label, _ in SETTINGS:
            if (model, label, "graph") not in runs or (model, label, "pynative") not in runs:
                continue
            g = runs[(model, label, "graph")][-1]
            e_sps, g_sps = med(model, label, "pynative", "samples_per_second"), med(model, label, "graph",
                                                                                      "samples_per_second")
            arena, lower = float(g["graph_arena"]), float(g["graph_lower_bound"])
            pairs = ratios.get((model, label), [])
            row = (model, label, "%.0f" % e_sps, "%.0f" % g_sps,
                   "%.3f" % statistics.median(pairs) if pairs else "nan",
                   "%d/%d" % (sum(x > 1 for x in pairs), len(pairs)),
                   "%.2f" % (med(model, label, "pynative", "peak_train") / MIB),
                   "%.2f" % (med(model, label, "graph", "peak_train") / MIB),
                   "%.1f" % (med(model, label, "pynative", "peak_rss") / MIB),
                   "%.1f" % (med(model, label, "graph", "peak_rss") / MIB),
                   "%.1f" % (med(model, label, "pynative", "reserved_end") / MIB),
                   "%.1f" % (med(model, label, "graph", "reserved_end") / MIB),
                   "%.2f" % (arena / MIB), "%.2f" % (lower / MIB), "%.3f" % (arena / lower if lower else 1),
                   "%.2f" % (float(g["graph_upper_bound"]) / MIB), "%d" % g["graph_allocations"],
                   "%.2f" % med(model, label, "graph", "median_step_ms"),
                   "%.2f" % med(model, label, "graph", "graph_trace_ms"),
                   "%.2f" % float(g["graph_plan_ms"]), "%d" % g["graph_replayed_steps"],
                   "%d" % g["graph_diverged_steps"], "yes" if g.get("optimizer_in_backward") else "no",
                   "%d" % fused_chains(g.get("graph_rewrites", "")))
            print(("%-5s %-8s" + " %8s" * (len(row) - 2)) % row)
    print("g/e: the median over rounds of each round's graph / eager samples/s (the two runs back to back, in\n"
          "alternating order); g wins: in how many rounds graph mode was the faster; step ms: graph mode's median\n"
          "step; trace ms: the step it traced (its allocations recorded), plan ms: the placement after it;\n"
          "peak: the training peak (tracked tensor bytes but the data set); RSS: the process's peak resident set;\n"
          "held: bytes the allocator holds from the system at the end of training (cache, and the arena in graph\n"
          "mode); arena/lower/upper: graph mode's static plan of one update's temporaries; replay/left: updates\n"
          "that replayed the plan / that left it (an overflow step skips its update and allocates differently);\n"
          "upd.bwd: graph mode updated each parameter in backward (no loss scale, no float16: what puts its\n"
          "peak below PYNATIVE's, which keeps every gradient until the update); fused: chains of layer calls\n"
          "graph mode ran as one fused op (the -zoo models' Conv2d -> ReLU -> MaxPool2d, Dense -> ReLU).")
    if a.sink_rounds > 0:
        sink_mode(a.demi, a.sink_rounds)


def fused_chains(rewrites):
    m = re.match(r"fused (\d+) chains?", rewrites)
    return int(m.group(1)) if m else 0


SINKS = [("every step", "0"), ("1 per epoch", "-1"), ("64 batches", "64")]
SUMMARY = re.compile(r": (\d+) steps, (\d+) samples/s \(median step ([0-9.]+) ms\)")


def sink_mode(demi, rounds):
    """Model A in graph mode, 2 epochs of 8192 samples (256 batches of 32) per run; with --sink-size 64 the
    same 512 batches are 8 sinks (--epochs 8)."""
    got = {}  # (setting, sink) -> [(steps/s, median step ms)]
    for _ in range(rounds):
        for label, extra in SETTINGS:
            for name, sink in SINKS:
                epochs = "8" if sink == "64" else "2"
                cmd = [demi, "train", "--model", "A", "--data", "synthetic", "--train-samples", "8192",
                       "--epochs", epochs, "--sink-size", sink, "--mode", "graph"] + extra
                out = subprocess.run(cmd, capture_output=True, text=True).stdout
                m = SUMMARY.search(out)
                if m:
                    got.setdefault((label, name), []).append((float(m.group(2)) / 32, float(m.group(3))))
    print("\nsink mode, model A in GRAPH_MODE, batch 32: steps/s (median of %d interleaved rounds), median step ms"
          % rounds)
    print("%-8s" % "setting" + "".join(" %14s %8s" % (n, "ms") for n, _ in SINKS) + "   sink/every")
    for label, _ in SETTINGS:
        cells, rates = "", []
        for name, _ in SINKS:
            v = got.get((label, name), [])
            rate = statistics.median([x for x, _ in v]) if v else float("nan")
            ms = statistics.median([y for _, y in v]) if v else float("nan")
            rates.append(rate)
            cells += " %14.0f %8.3f" % (rate, ms)
        print("%-8s%s   %s" % (label, cells, " / ".join("%.3f" % (r / rates[0]) for r in rates[1:])))


if __name__ == "__main__":
    main()
