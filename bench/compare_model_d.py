#!/usr/bin/python3
"""Model D (BENCHMARKS.md), demi against PyTorch, interleaved: demi O0, PyTorch fp32, demi O2-bf16, PyTorch bf16
autocast, demi O2-fp16, PyTorch fp16 autocast with GradScaler("cpu") (and demi O2-fp16bp: its f16 matrix products
rounded to bf16, `--f16-products bf16`, where the CPU has AVX512-BF16), repeated; prints the median samples/s of each, the ratios, each setting's share of the
hardware ceiling measured in the same run (gemm_bench's f32 FMA and bf16 loops, before each repetition), and demi's
tracked peak memory O2 / O0. Every measurement is appended to bench/results/compare.jsonl, as bench/compare.py does.

    /usr/bin/python3 bench/compare_model_d.py [--reps 3] [--steps 8] [--bench build/release/bench/transformer_bench]
                                              [--no-torch-fp32] [--torch-python PY]
"""
import argparse
import datetime
import json
import os
import statistics
import sys

from compare import ROOT, TORCH_ENV, ceilings, has_bf16_products, run_json_lines as run_json, torch_peers

FLOPS_PER_SAMPLE = 2.62e9  # model D's training FLOPs per sample (BENCHMARKS.md)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "release", "bench", "transformer_bench"))
    ap.add_argument("--no-torch-fp32", action="store_true", help="skip PyTorch fp32 (slow without an optimised BLAS)")
    ap.add_argument("--torch-python", action="append", default=[],
                    help="a Python with torch (repeatable; default: Debian's and build/torch-venv's)")
    args = ap.parse_args()
    peers = torch_peers(args.torch_python)
    bf16_products = has_bf16_products(os.path.join(ROOT, "build", "release", "tools", "demi", "demi"))
    env = dict(os.environ, **TORCH_ENV)
    results = {}
    stamp = datetime.datetime.utcnow().isoformat(timespec="seconds")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    log = open(os.path.join(ROOT, "bench", "results", "compare.jsonl"), "a")
    build = os.path.dirname(os.path.dirname(os.path.abspath(args.bench)))
    peaks = []  # (fma, bf16, exact f16) measured before each repetition: the ceilings of the same run
    for rep in range(args.reps):
        c = ceilings(build)
        if c:
            peaks.append(c)
        runs = [("demi", ["O0"])] + [(peer, "fp32") for peer in peers] + [("demi", ["O2-bf16"])]
        runs += [(peer, "bf16") for peer in peers] + [("demi", ["O2-fp16"])] + [(peer, "fp16") for peer in peers]
        runs += [("demi", ["O2-fp16bp"])] if bf16_products else []
        for fw, setting in runs:
            if fw == "demi":
                rows = run_json([args.bench, "--settings", ",".join(setting), "--steps", str(args.steps)])
            else:
                if setting == "fp32" and args.no_torch_fp32:
                    continue
                e = dict(env, OMP_WAIT_POLICY="PASSIVE") if setting == "fp32" else env
                rows = run_json([fw[1], os.path.join(ROOT, "bench", "torch_model_d.py"), "--precision",
                                 setting, "--steps", str(args.steps)], e)
                for r in rows:
                    r["framework"] = fw[0]
            for r in rows:
                r["rep"], r["time"], r["model"] = rep, stamp, "D"
                log.write(json.dumps(r) + "\n")
                results.setdefault((r["framework"], r["setting"]), []).append(r)
                print(f"  rep {rep} {r['framework']:12s} {r['setting']:8s} {r['samples_per_second']:8.1f} samples/s",
                      file=sys.stderr)

    def med(fw, s, key="samples_per_second"):
        rs = results.get((fw, s))
        return statistics.median(r[key] for r in rs) if rs else float("nan")

    log.close()
    print(f"model D, median of {args.reps} interleaved repetitions, samples/s")
    columns = [(label, p) for label, _ in peers for p in ("fp32", "bf16", "fp16")]
    demi_settings = ["O0", "O2-bf16", "O2-fp16"] + (["O2-fp16bp"] if bf16_products else [])
    for fw, s in columns + [("demi", s) for s in demi_settings]:
        print(f"  {fw:12s} {s:8s} {med(fw, s):8.1f}")
    for label, _ in peers:
        print(f"  {f'demi O0 / {label} fp32:':34s}{med('demi', 'O0') / med(label, 'fp32'):.2f}x")
        print(f"  {f'demi O2-bf16 / {label} bf16:':34s}{med('demi', 'O2-bf16') / med(label, 'bf16'):.2f}x")
        print(f"  {f'demi O2-fp16 / {label} fp16:':34s}{med('demi', 'O2-fp16') / med(label, 'fp16'):.2f}x")
    print(f"  demi O2-bf16 / demi O0:           {med('demi', 'O2-bf16') / med('demi', 'O0'):.2f}x")
    print(f"  demi O2-fp16 / demi O0:           {med('demi', 'O2-fp16') / med('demi', 'O0'):.2f}x")
    if bf16_products:
        print(f"  demi O2-fp16bp / demi O0:         {med('demi', 'O2-fp16bp') / med('demi', 'O0'):.2f}x")
    if peaks:
        fma, bf16, f16 = (statistics.median(p[i] for p in peaks) for i in range(3))
        print(f"  share of the ceiling measured in this run (f32 FMA {fma:.0f} GFLOP/s, bf16 (vdpbf16ps or AMX) {bf16:.0f},"
              f" demi's exact f16 (FMAs or a quarter of AMX) {f16:.0f}): training FLOPs per sample x samples/s / the"
              " ceiling of the setting's arithmetic")
        for fw, s in columns + [("demi", s) for s in demi_settings]:
            ceiling = bf16 if s.endswith(("bf16", "bp")) else f16 if fw == "demi" and s == "O2-fp16" else fma
            print(f"    {fw:12s} {s:10s} {100 * FLOPS_PER_SAMPLE * med(fw, s) / (ceiling * 1e9):5.0f}%")
    print(f"  demi tracked peak O2 / O0:        {med('demi', 'O2-bf16', 'peak_tracked') / med('demi', 'O0', 'peak_tracked'):.3f}"
          f" (activations {med('demi', 'O2-bf16', 'peak_activation') / med('demi', 'O0', 'peak_activation'):.3f};"
          f" O2-fp16 / O0 {med('demi', 'O2-fp16', 'peak_tracked') / med('demi', 'O0', 'peak_tracked'):.3f})")


if __name__ == "__main__":
    main()
