#!/usr/bin/env bash
# at_cpu_level.sh LEVEL CACHE_DIR COMMAND...: runs COMMAND at kernel dispatch level LEVEL (DEMI_CPU_LEVEL,
# which caps oneDNN's ISA too), with a kernel-choice cache of its own that starts empty, so that one machine
# runs the kernels, the kernel choices and the oneDNN paths another CPU family runs: an AMX Xeon at
# avx512_bf16 runs as a Zen 4 does, and any machine at avx2 or scalar as an older CPU would.
# A level this CPU cannot run is skipped (exit 77, ctest's SKIP_RETURN_CODE) with the reason; so is the
# level the suite itself already runs at here (the machine's best).
set -uo pipefail
level=$1 cache=$2
shift 2
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
best=scalar
has avx2 fma f16c && best=avx2
[[ $best == avx2 ]] && has avx512f avx512bw avx512vl avx512dq && best=avx512
[[ $best == avx512 ]] && has avx512_bf16 && best=avx512_bf16
[[ $best == avx512_bf16 ]] && has amx_tile amx_bf16 && best=amx
rank() { case $1 in scalar) echo 0 ;; avx2) echo 1 ;; avx512) echo 2 ;; avx512_bf16) echo 3 ;; amx) echo 4 ;; *) echo 9 ;; esac; }
if (($(rank "$level") > $(rank "$best"))); then
  echo "skipped: this CPU runs at most $best, not $level (a CPU with $level runs this test)"
  exit 77
fi
if [[ $level == "$best" ]]; then
  echo "skipped: $level is this CPU's own level, which the whole suite runs at"
  exit 77
fi
rm -rf "$cache" && mkdir -p "$cache" || exit 1
echo "at_cpu_level: $level (this CPU's best: $best), kernel choices in $cache"
DEMI_CPU_LEVEL=$level DEMI_CACHE_DIR=$cache exec "$@"
