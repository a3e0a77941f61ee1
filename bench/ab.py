#!/usr/bin/python3
"""Two demi builds against each other on one training run, for changes of a few percent on a noisy machine.

A VM's wall-clock speed drifts by tens of percent between periods (another guest, the host's frequency),
so two medians taken minutes apart settle nothing about a 3% change. This runs the same `demi train`
command with each binary in turn, pair after pair, and compares within each pair:

  - CPU seconds of the run (user + system of the process, every thread): time the host takes away from
    the guest (steal) is not charged to it, so it drifts far less than wall time. OpenMP's idle threads
    sleep (OMP_WAIT_POLICY=PASSIVE, as `make test` runs them) so that spinning at a barrier, which
    varies with scheduling, is not counted as work (wall time is then slower: a sleeping thread takes
    tens of microseconds to wake; --spin keeps OpenMP's default);
  - samples/s of the run (its median step, as `demi train --json` reports it).

For each it prints the median of the pairs' ratios (new / base), their range, and in how many pairs the
new build was the better one: a change is measured when nearly every pair agrees, not when one median
moved.

    bench/ab.py BASE_DEMI NEW_DEMI [--pairs 8] [--spin] [-- demi train arguments]
    bench/ab.py /tmp/base/build/release/tools/demi/demi build/release/tools/demi/demi --pairs 8 -- \\
        --model A --amp O2 --dtype bf16 --epochs 30
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys


def run(binary, args, env):
    """(CPU seconds, samples/s) of one `demi train --json` run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([binary, "train", "--json"] + args, capture_output=True, text=True, env=env, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"failed: {binary} train {' '.join(args)}\n{out.stderr}")
    summary = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")][-1]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, summary["samples_per_second"]


def main():
    argv = sys.argv[1:]
    train_args = []
    if "--" in argv:
        train_args = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--spin", action="store_true",
                    help="OpenMP's default wait policy (idle threads spin: faster wall time, noisier CPU time)")
    a = ap.parse_args(argv)
    env = dict(os.environ)
    if a.spin:
        env.pop("OMP_WAIT_POLICY", None)
    else:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    rows = []
    for i in range(a.pairs):
        # Alternate which build goes first, so that a drift within a pair favours neither.
        order = [("base", a.base), ("new", a.new)] if i % 2 == 0 else [("new", a.new), ("base", a.base)]
        got = {name: run(binary, train_args, env) for name, binary in order}
        rows.append(got)
        print(f"pair {i + 1}: CPU s base {got['base'][0]:.3f} new {got['new'][0]:.3f}, samples/s base "
              f"{got['base'][1]:.0f} new {got['new'][1]:.0f}", flush=True)

    def report(what, index, lower_is_better):
        ratios = [r["new"][index] / r["base"][index] for r in rows]
        better = sum(1 for q in ratios if (q < 1) == lower_is_better and q != 1)
        print(f"{what:10} new / base: median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-"
              f"{max(ratios):.3f}); the new build better in {better} of {len(ratios)} pairs; medians base "
              f"{statistics.median(r['base'][index] for r in rows):.3f}, new "
              f"{statistics.median(r['new'][index] for r in rows):.3f}")

    print(f"demi train {' '.join(train_args)}")
    report("CPU s", 0, True)
    report("samples/s", 1, False)


if __name__ == "__main__":
    main()
