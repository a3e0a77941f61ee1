#!/usr/bin/python3
"""demi against PyTorch on this machine, interleaved (BENCHMARKS.md protocol), models A, B, C at
O0 / O2-bf16 / O2-fp16 (demi; and O2-fp16bp: O2-fp16 with `--f16-products bf16`, its matrix products' f16
values rounded to bf16 on the pair kernel, where the CPU has AVX512-BF16) and fp32 / bf16 autocast / fp16
autocast with GradScaler("cpu") (PyTorch). Several repetitions; the table shows the
median of each setting's samples/s and the ratios; every measurement is also appended to
bench/results/compare.jsonl so runs can be compared over time.

    bench/compare.py [--reps 3] [--models A,B,C] [--demi build/release/tools/demi/demi] [--torch-python PY ...]
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Samples per run (two epochs: the first is warm-up) and PyTorch steps, sized to a few seconds per run.
SIZES = {"A": (1024, 30), "B": (2560, 20), "C": (5120, 20)}
TORCH_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "1073741824",
             "MALLOC_TOP_PAD_": "268435456", "OPENBLAS_NUM_THREADS": "2"}


def run_json_lines(cmd, env=None):
    """Every JSON line the command prints ([] when it fails, with its stderr passed on)."""
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        sys.stderr.write(f"failed: {' '.join(cmd)}\n{out.stderr}\n")
        return []
    return [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]


def run_json(cmd, env=None):
    """The command's summary line (the last JSON line of kind "summary", or without a kind)."""
    for d in reversed(run_json_lines(cmd, env)):
        if d.get("kind", "summary") == "summary":
            return d
    return None


def has_bf16_products(demi):
    """Whether this CPU takes `--f16-products bf16` (it needs AVX512-BF16, as `demi info` lists)."""
    info = subprocess.run([demi, "info"], capture_output=True, text=True, check=False).stdout
    return any(l.startswith("features:") and "avx512_bf16" in l.split("(not:")[0] for l in info.splitlines())


def demi_run(demi, model, amp, dtype, bf16_products=False):
    samples, _ = SIZES[model]
    d = run_json([demi, "train", "--json", "--model", model, "--data", "synthetic", "--amp", amp, "--dtype", dtype,
                  "--epochs", "2", "--train-samples", str(samples)]
                 + (["--f16-products", "bf16"] if bf16_products else []))
    if d is None:
        return None
    batch = {"A": 32, "B": 128, "C": 256}[model]
    setting = "O0" if amp == "O0" else f"{amp}-{dtype}" + ("bp" if bf16_products else "")
    return {"framework": "demi", "model": model, "setting": setting,
            "samples_per_second": batch / (d["median_step_ms"] / 1e3), "median_step_ms": d["median_step_ms"],
            "peak_rss": d["peak_rss"], "peak_tracked": d["peak_total"], "peak_train": d["peak_train"],
            "peak_activation": d["peak_activation"], "system_allocs_per_step": d["system_allocs_per_step"],
            "page_faults_per_step": d["page_faults_per_step"]}


# Training FLOPs per sample (BENCHMARKS.md: forward and both backward products, the first layer without an
# input gradient), for the share of the hardware ceiling.
FLOPS_PER_SAMPLE = {"A": 3.54e6, "B": 25.0e6, "C": 9.56e6}


def ceilings(build):
    """The f32 FMA, bf16 and exact-f16 ceilings (GFLOP/s, all cores) as gemm_bench measures them now: bf16's
    is the faster of vdpbf16ps and the AMX tile unit; exact f16 products' the faster of the FMAs and a quarter
    of the tile unit (demi multiplies an f16 product as four bf16 ones there: cpu/gemm_amx.h)."""
    out = subprocess.run([os.path.join(build, "bench", "gemm_bench"), "--filter", "(no product)", "--rounds", "1"],
                         capture_output=True, text=True, check=False).stdout
    m = re.search(r"f32 FMA (\d+), bf16 vdpbf16ps (\d+), AMX tdpbf16ps (\d+)", out)
    if not m:
        return None
    fma, pairs, amx = (float(m.group(i)) for i in (1, 2, 3))
    return fma, max(pairs, amx), max(fma, amx / 4)


# The Pythons that run the PyTorch twins: Debian's (1.13, python3-torch) and the venv with the newest PyPI torch
# that `scripts/setup --bench` makes (build/torch-venv), each where it exists; --torch-python PY (repeatable)
# names them instead.
VENV_PYTHON = os.path.join(ROOT, "build", "torch-venv", "bin", "python")


def torch_peers(pythons):
    """[(label, python)] for each Python that imports torch; the label carries its torch version."""
    if not pythons:
        pythons = ["/usr/bin/python3"] + ([VENV_PYTHON] if os.path.exists(VENV_PYTHON) else [])
    peers = []
    for py in pythons:
        out = subprocess.run([py, "-c", "import torch; print(torch.__version__.split('+')[0])"],
                             capture_output=True, text=True, check=False)
        if out.returncode == 0:
            peers.append((f"torch {out.stdout.strip()}", py))
        else:
            sys.stderr.write(f"no torch in {py}: skipped as a peer\n")
    return peers


def torch_run(python, label, model, precision):
    _, steps = SIZES[model]
    env = dict(os.environ, **TORCH_ENV)
    if precision == "fp32" and model in ("C", "D"):
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    r = run_json([python, os.path.join(ROOT, "bench", "torch_models.py"), "--model", model,
                  "--precision", precision, "--steps", str(steps)], env)
    if r is not None:
        r["framework"] = label
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", default="A,B,C")
    ap.add_argument("--demi", default=os.path.join(ROOT, "build", "release", "tools", "demi", "demi"))
    ap.add_argument("--torch-python", action="append", default=[],
                    help="a Python with torch (repeatable; default: Debian's and build/torch-venv's)")
    args = ap.parse_args()
    peers = torch_peers(args.torch_python)
    bf16_products = has_bf16_products(args.demi)
    models = args.models.split(",")
    results = {}
    stamp = datetime.datetime.utcnow().isoformat(timespec="seconds")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    log = open(os.path.join(ROOT, "bench", "results", "compare.jsonl"), "a")
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(args.demi))))
    peaks = []  # (fma, bf16, exact f16) measured before each repetition: the ceilings of the same run
    for rep in range(args.reps):
        c = ceilings(build)
        if c:
            peaks.append(c)
        for m in models:
            runs = [lambda: demi_run(args.demi, m, "O0", "bf16")]
            runs += [lambda py=py, label=label: torch_run(py, label, m, "fp32") for label, py in peers]
            runs += [lambda: demi_run(args.demi, m, "O2", "bf16")]
            runs += [lambda py=py, label=label: torch_run(py, label, m, "bf16") for label, py in peers]
            runs += [lambda: demi_run(args.demi, m, "O2", "fp16")]
            runs += [lambda py=py, label=label: torch_run(py, label, m, "fp16") for label, py in peers]
            if bf16_products:
                runs += [lambda: demi_run(args.demi, m, "O2", "fp16", bf16_products=True)]
            for run in runs:
                r = run()
                if r is None:
                    continue
                r["rep"], r["time"] = rep, stamp
                log.write(json.dumps(r) + "\n")
                results.setdefault((m, r["framework"], r["setting"]), []).append(r)
                print(f"  rep {rep} {m} {r['framework']:12s} {r['setting']:8s} {r['samples_per_second']:9.0f} samples/s",
                      file=sys.stderr)
    log.close()

    def med(m, fw, s, key="samples_per_second"):
        rs = results.get((m, fw, s))
        return statistics.median(r[key] for r in rs) if rs else float("nan")

    print(f"\ndemi vs PyTorch {stamp} — median of {args.reps} interleaved repetitions, samples/s (peak RSS MiB)\n")
    columns = [(label, p) for label, _ in peers for p in ("fp32", "bf16", "fp16")]
    columns += [("demi", "O0"), ("demi", "O2-bf16"), ("demi", "O2-fp16")]
    columns += [("demi", "O2-fp16bp")] if bf16_products else []
    ratios = [(f"O0/{label.split()[1]}", ("demi", "O0"), (label, "fp32")) for label, _ in peers]
    ratios += [(f"bf16/{label.split()[1]}", ("demi", "O2-bf16"), (label, "bf16")) for label, _ in peers]
    ratios += [(f"fp16/{label.split()[1]}", ("demi", "O2-fp16"), (label, "fp16")) for label, _ in peers]
    ratios += [("O2b/O0", ("demi", "O2-bf16"), ("demi", "O0")), ("O2h/O0", ("demi", "O2-fp16"), ("demi", "O0"))]
    ratios += [("O2hbp/O0", ("demi", "O2-fp16bp"), ("demi", "O0"))] if bf16_products else []
    print(f"{'model':5} " + " ".join(f"{fw + ' ' + s:>19}" for fw, s in columns) + " "
          + " ".join(f"{name:>12}" for name, _, _ in ratios))
    for m in models:
        cells = [f"{med(m, fw, s):8.0f} ({med(m, fw, s, 'peak_rss') / 2**20:5.0f})" for fw, s in columns]
        rs = [med(m, *a) / med(m, *b) for _, a, b in ratios]
        print(f"{m:5} " + " ".join(f"{c:>19}" for c in cells) + " " + " ".join(f"{r:11.2f}x" for r in rs))
    if peaks:
        fma, bf16, f16 = (statistics.median(p[i] for p in peaks) for i in range(3))
        print(f"\nshare of the hardware ceiling measured in this run (f32 FMA {fma:.0f} GFLOP/s, bf16 (vdpbf16ps or AMX)"
              f" {bf16:.0f}, demi's exact f16 (FMAs or a quarter of AMX) {f16:.0f}): training FLOPs per sample x"
              " samples/s / the ceiling of the setting's arithmetic (fp32 products and PyTorch's fp16 run FMAs on"
              " f32, bf16 ones and O2-fp16bp's bf16 arithmetic, demi's O2-fp16 exact f16)")
        print(f"{'model':5} " + " ".join(f"{fw + ' ' + s:>19}" for fw, s in columns))
        for m in models:
            f = FLOPS_PER_SAMPLE.get(m)
            if f is None:
                continue
            def ceiling(fw, st):
                if st.endswith(("bf16", "bp")):
                    return bf16
                return f16 if fw == "demi" and st == "O2-fp16" else fma

            share = lambda fw, st: 100 * f * med(m, fw, st) / (ceiling(fw, st) * 1e9)
            print(f"{m:5} " + " ".join(f"{share(fw, s):18.0f}%" for fw, s in columns))
    print("\ndemi tracked peak memory O2-bf16 / O0: all tracked memory; training (all but the data set held in"
          " memory); activations")
    for m in models:
        t = med(m, "demi", "O2-bf16", "peak_tracked") / med(m, "demi", "O0", "peak_tracked")
        tr = med(m, "demi", "O2-bf16", "peak_train") / med(m, "demi", "O0", "peak_train")
        a = med(m, "demi", "O2-bf16", "peak_activation") / med(m, "demi", "O0", "peak_activation")
        print(f"  {m}: {t:.3f}  {tr:.3f}  {a:.3f}")
    print("\ndemi steady-state steps (after the warm-up epoch): system allocations / page faults per step")
    for m in models:
        cells = [f"{s} {med(m, 'demi', s, 'system_allocs_per_step'):.2f} / {med(m, 'demi', s, 'page_faults_per_step'):.2f}"
                 for s in ("O0", "O2-bf16", "O2-fp16") + (("O2-fp16bp",) if bf16_products else ())]
        print(f"  {m}: " + ",  ".join(cells))


if __name__ == "__main__":
    main()
