#!/usr/bin/env bash
# forecast_cli_test.sh DEMI DIR: `demi plan`'s forecast equals the training's peak, and `--max-memory`'s
# batch trains within its budget, each from an empty DEMI_CACHE_DIR (plan, then train in that folder: the
# user's flow). Gradient clipping and adaptive AMP are forecast too (both keep every gradient until the
# update), and the GPT's.
#
# The kernels are pinned (core/settings.h's overrides): a forecast holds for the kernels the run uses, and
# where demi chooses between kernels by timing, a process under load (ctest -j, a build beside it) can pick
# another kernel with another workspace than the process that forecast — a known gap of the forecast,
# noted in docs/DESIGN.md, which this test must not turn into a flaky failure. Tuning's trial runs counting
# in no peak is tested where the choice is made (MemTuningScope, core/memory_test.cc).
set -uo pipefail
demi=$1 dir=$2
export DEMI_MATMUL=onednn DEMI_CONV_BF16=bf16 DEMI_CONV_DIRECT=off DEMI_CONV_GEMM=off
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() {
  echo "forecast_cli_test: $*"
  exit 1
}
# json_field KEY < LINES: KEY's value in the line of kind "summary" or "plan".
json_field() {
  python3 -c 'import json, sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        d = json.loads(line)
        if d.get("kind") in ("summary", "plan"): print(int(d[sys.argv[1]])); break' "$1"
}
n=0
cold() {  # cold ARGS...: demi ARGS... with a cache folder of its own, empty
  n=$((n + 1))
  DEMI_CACHE_DIR="$dir/cache$n" "$demi" "$@"
}
then_warm() {  # then_warm ARGS...: demi ARGS... in the cache folder of the last cold run
  DEMI_CACHE_DIR="$dir/cache$n" "$demi" "$@"
}
check() {  # check NAME ARGS...: plan's forecast against the training's peak, each on a cold cache
  local name=$1
  shift
  local common=(--model A --data synthetic --train-samples 250 --threads 2 --json "$@")
  local forecast peak
  forecast=$(cold plan "${common[@]}" | json_field train_peak) || fail "$name: demi plan failed"
  peak=$(then_warm train "${common[@]}" --epochs 1 | json_field peak_train) || fail "$name: demi train failed"
  echo "$name: forecast $forecast bytes, training peak $peak bytes"
  [[ -n $forecast && -n $peak ]] || fail "$name: no forecast or no peak"
  # Exact where every step allocates alike; 2% for the last, partial batch's different kernels.
  ((peak <= forecast + forecast / 50)) || fail "$name: the training peak $peak is above the forecast $forecast"
  ((forecast <= peak + peak / 5)) || fail "$name: the forecast $forecast is far above the training peak $peak"
}
check "A O0" --amp O0
check "A O0 clip" --amp O0 --clip-grad-norm 1
check "A O2 bf16 adapt" --amp O2 --dtype bf16 --amp-adapt
# The GPT (on a small real text: base-files' GPL): plan's forecast against its training peak.
gpt=(--model gpt --data text:/usr/share/common-licenses/GPL-3 --block-size 16 --layers 1 --heads 2 --dim 32
  --batch-size 4 --threads 2 --json)
forecast=$(cold plan "${gpt[@]}" | json_field train_peak) || fail "gpt: demi plan failed"
peak=$(then_warm train "${gpt[@]}" --steps 6 --eval-every 6 --eval-windows 8 | json_field peak_train) ||
  fail "gpt: demi train failed"
echo "gpt: forecast $forecast bytes, training peak $peak bytes"
[[ -n $forecast && -n $peak ]] || fail "gpt: no forecast or no peak"
((peak <= forecast + forecast / 50)) || fail "gpt: the training peak $peak is above the forecast $forecast"
((forecast <= peak + peak / 5)) || fail "gpt: the forecast $forecast is far above the training peak $peak"
# --max-memory: the batch it picks trains within the budget.
budget=$((4 << 20))
peak=$(cold train --model A --data synthetic --train-samples 512 --epochs 1 --threads 2 --json --max-memory 4MiB |
  json_field peak_train) || fail "--max-memory 4MiB: demi train failed"
echo "--max-memory 4MiB: training peak $peak bytes"
((peak <= budget)) || fail "--max-memory 4MiB trained with a peak of $peak bytes"
echo "forecast_cli_test: ok"
