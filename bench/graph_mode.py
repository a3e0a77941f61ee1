#!/usr/bin/python3
"""GRAPH_MODE against PYNATIVE_MODE (issue 14's table): for each model and AMP setting, `demi train --json`
in both modes, interleaved round by round on one machine. Prints per model x setting:

  - samples/s in each mode (median of the rounds) and graph / eager;
  - the training peak (tracked tensor bytes), the process's peak RSS and the bytes the allocator holds
    from the system at the end (the caching allocator's blocks, and in graph mode the arena);
  - the static plan: its arena against the lower bound (most bytes of step temporaries alive at once) and
    the upper bound (their sum), the step's allocations, the time to plan, and how many updates replayed
    the plan and how many left it (overflow steps).

    bench/graph_mode.py [--models A,B,C,D] [--rounds 3] [--demi build/release/tools/demi/demi]
"""
import argparse
import os
import statistics
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
    ap.add_argument("--models", default="A,B,C,D")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--demi", default=os.path.join(ROOT, "build/release/tools/demi/demi"))
    a = ap.parse_args()
    models = a.models.split(",")
    runs = {}  # (model, setting, mode) -> [summaries]
    for r in range(a.rounds):
        for model in models:
            base = ["--model", model, "--data", "synthetic", "--epochs", "2",
                    "--train-samples", str(SAMPLES.get(model, 2048))]
            for label, extra in SETTINGS:
                for mode in ("pynative", "graph"):
                    s = last_json([a.demi, "train", "--json", "--mode", mode] + base + extra)
                    if s is not None:
                        runs.setdefault((model, label, mode), []).append(s)
        print(f"round {r + 1} of {a.rounds} done", file=sys.stderr)

    def med(model, label, mode, key):
        v = [float(s[key]) for s in runs.get((model, label, mode), [])]
        return statistics.median(v) if v else float("nan")

    print("GRAPH_MODE against PYNATIVE_MODE: samples/s (median of %d interleaved rounds) and memory, MiB" % a.rounds)
    head = ("model", "setting", "eager/s", "graph/s", "g/e", "peak e", "peak g", "RSS e", "RSS g", "held e",
            "held g", "arena", "lower", "a/l", "upper", "allocs", "plan ms", "replay", "left")
    print(("%-5s %-8s" + " %8s" * (len(head) - 2)) % head)
    for model in models:
        for label, _ in SETTINGS:
            if (model, label, "graph") not in runs or (model, label, "pynative") not in runs:
                continue
            g = runs[(model, label, "graph")][-1]
            e_sps, g_sps = med(model, label, "pynative", "samples_per_second"), med(model, label, "graph",
                                                                                      "samples_per_second")
            arena, lower = float(g["graph_arena"]), float(g["graph_lower_bound"])
            row = (model, label, "%.0f" % e_sps, "%.0f" % g_sps, "%.3f" % (g_sps / e_sps),
                   "%.2f" % (med(model, label, "pynative", "peak_train") / MIB),
                   "%.2f" % (med(model, label, "graph", "peak_train") / MIB),
                   "%.1f" % (med(model, label, "pynative", "peak_rss") / MIB),
                   "%.1f" % (med(model, label, "graph", "peak_rss") / MIB),
                   "%.1f" % (med(model, label, "pynative", "reserved_end") / MIB),
                   "%.1f" % (med(model, label, "graph", "reserved_end") / MIB),
                   "%.2f" % (arena / MIB), "%.2f" % (lower / MIB), "%.3f" % (arena / lower if lower else 1),
                   "%.2f" % (float(g["graph_upper_bound"]) / MIB), "%d" % g["graph_allocations"],
                   "%.2f" % float(g["graph_plan_ms"]), "%d" % g["graph_replayed_steps"],
                   "%d" % g["graph_diverged_steps"])
            print(("%-5s %-8s" + " %8s" * (len(row) - 2)) % row)
    print("peak: the training peak (tracked tensor bytes but the data set); RSS: the process's peak resident set;\n"
          "held: bytes the allocator holds from the system at the end of training (cache, and the arena in graph\n"
          "mode); arena/lower/upper: graph mode's static plan of one update's temporaries; replay/left: updates\n"
          "that replayed the plan / that left it (an overflow step skips its update and allocates differently).")


if __name__ == "__main__":
    main()
