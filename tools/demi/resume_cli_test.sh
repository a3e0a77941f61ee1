#!/usr/bin/env bash
# `demi train --resume` against what changed and what broke: resume_cli_test.sh DEMI WORKDIR
#   1. a mid-epoch checkpoint resumed with another --batch-size is refused (exit 2, naming both sizes)
#   2. resumed with another --lr it trains on, with a warning naming both values
#   3. a damaged newest checkpoint is skipped, named with its error and kept as NAME.damaged; the one
#      before it is resumed
set -euo pipefail
demi=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
train=("$demi" train --model C --data synthetic --train-samples 1024 --batch-size 256 --ckpt-every 2 --keep-ckpt 0
       --ckpt-dir "$work/ckpt")
"${train[@]}" > "$work/first.log" 2>&1
ls "$work/ckpt"
rm "$work/ckpt/modelC-1_4.safetensors"  # the newest is now the mid-epoch modelC-1_2

check() {  # check NAME STATUS REGEX COMMAND...: cli_test.sh's exit status and output check, logged
  local name=$1
  shift
  bash "$here/cli_test.sh" "$@" > "$work/$name.log" || { cat "$work/$name.log"; echo "$name: failed"; exit 1; }
  echo "$name: OK"
}

check batch_size 2 "taken mid-epoch \(after batch 2\) with --batch-size 256; resuming with 128" \
  "${train[@]}" --epochs 2 --batch-size 128 --resume
check lr 0 "warning: resuming .*modelC-1_2.safetensors, taken with --lr 0.01, with --lr 0.02" \
  "${train[@]}" --epochs 1 --lr 0.02 --resume

# Damage the newest checkpoint (modelC-1_4, written by the run above): one byte in its tensor data.
newest="$work/ckpt/modelC-1_4.safetensors"
[[ -f $newest ]] || { echo "expected $newest"; exit 1; }
size=$(stat -c %s "$newest")
printf '\xff' | dd of="$newest" bs=1 seek=$((size - 9)) conv=notrunc status=none
cp "$newest" "$work/damaged.copy"
check damaged 0 "skips a checkpoint that does not load, kept as .*modelC-1_4.safetensors.damaged: .*checksum" \
  "${train[@]}" --epochs 2 --resume
grep -q "resumed from .*modelC-1_2.safetensors" "$work/damaged.log" || { echo "damaged: did not resume from 1_2"; exit 1; }
cmp -s "$work/damaged.copy" "$newest.damaged" || { echo "damaged: the damaged checkpoint was not kept as it was"; exit 1; }
[[ -f $newest ]] || { echo "damaged: the resumed run did not write its own modelC-1_4 again"; exit 1; }
summary() { grep '"kind":"summary"' "$1" | grep -o '"\(final_loss\|test_accuracy\)":[^,}]*' | tr '\n' ' '; }
# resumes_exactly NAME TRAIN...: TRAIN run for 2 epochs, and for 1 then resumed for the second (from the
# epoch's end), end at the same loss and accuracy, bit for bit; the runs' folders are $work/NAME.*.
resumes_exactly() {
  local name=$1
  shift
  "$@" --epochs 2 --ckpt-dir "$work/$name.full" > "$work/$name.full.log" 2>&1
  "$@" --epochs 1 --ckpt-dir "$work/$name.half" > "$work/$name.half1.log" 2>&1
  "$@" --epochs 2 --ckpt-dir "$work/$name.half" --resume > "$work/$name.half2.log" 2>&1
  local full half
  full=$(summary "$work/$name.full.log")
  half=$(summary "$work/$name.half2.log")
  [[ -n $full && $full == "$half" ]] || { echo "$name: the resumed run ends at $half, the uninterrupted one at $full"; exit 1; }
  echo "$name: OK"
}
# bf16 optimizer state: saved as it is, so a run resumed at an epoch's end ends bit for bit where an
# uninterrupted one does; resuming it with another --optimizer-state is warned about.
state=("$demi" train --model C --data synthetic --train-samples 1024 --batch-size 256 --amp O2 --dtype bf16
       --optimizer-state bf16 --json)
resumes_exactly bf16_state_resume "${state[@]}"
check state_changed 0 "warning: resuming .*, taken with --optimizer-state bf16, with --optimizer-state fp32" \
  "${state[@]}" --optimizer-state fp32 --epochs 3 --ckpt-dir "$work/bf16_state_resume.half" --resume
# f16 products in bf16 (an option that changes the numbers, where the CPU has AVX512-BF16): the same, and the
# run reports the setting.
features=$("$demi" info | grep '^features:' | sed 's/(not:.*//')
if [[ $features == *avx512_bf16* ]]; then
  prod=("$demi" train --model C --data synthetic --train-samples 1024 --batch-size 256 --amp O2 --dtype fp16
        --f16-products bf16 --json)
  resumes_exactly f16_products_resume "${prod[@]}"
  grep -q '"f16_products":"bf16"' "$work/f16_products_resume.full.log" ||
    { echo "f16 products: the run does not report bf16"; exit 1; }
  check products_changed 0 "warning: resuming .*, taken with --f16-products bf16, with --f16-products exact" \
    "${prod[@]}" --f16-products exact --epochs 3 --ckpt-dir "$work/f16_products_resume.half" --resume
  # DEMI_F16_PRODUCTS overrides the runs' option (for debugging and benchmarks): a run without the option
  # then multiplies as one with it, bit for bit, reports it, and `demi info` says it is in force.
  quick=("$demi" train --model C --data synthetic --train-samples 512 --batch-size 256 --amp O2 --dtype fp16 --json)
  loss_of() { grep -o '"final_loss":[^,}]*' | cut -d: -f2; }
  with_option=$("${quick[@]}" --f16-products bf16 2>/dev/null | loss_of)
  overridden=$(DEMI_F16_PRODUCTS=bf16 "${quick[@]}" 2>/dev/null | tee "$work/override.log" | loss_of)
  exact=$("${quick[@]}" 2>/dev/null | loss_of)
  [[ -n $with_option && $with_option == "$overridden" && $exact != "$with_option" ]] ||
    { echo "DEMI_F16_PRODUCTS=bf16: final loss $overridden, with the option $with_option, exact $exact"; exit 1; }
  grep -q '"f16_products":"bf16"' "$work/override.log" || { echo "the override is not reported"; exit 1; }
  info=$(DEMI_F16_PRODUCTS=bf16 "$demi" info)
  grep -q '^f16 products: bf16 in every run' <<< "$info" || { echo "demi info does not show the override"; exit 1; }
  echo "f16_products_override: OK"
else
  echo "f16_products_resume: skipped (no AVX512-BF16: --f16-products bf16 is refused)"
fi
echo "resume_cli_test: all OK"
