#!/usr/bin/env bash
# ckpt_dir_cli_test.sh DEMI DIR: a checkpoint directory belongs to one run at a time. A new run refuses a
# directory holding another run's checkpoints unless told to resume it (--resume) or to start over
# (--start-over: the other run's files moved aside, never deleted); a later --resume continues the run
# that wrote last; a second run writing the same directory at once is refused (a lock that dies with its
# process); a retried --resume after every checkpoint was found damaged refuses again instead of starting
# from step 0; a directory that cannot be written is refused before anything is trained.
set -uo pipefail
demi=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() {
  echo "ckpt_dir_cli_test: $*"
  exit 1
}
ck="$dir/ckpt"
run() { "$demi" train --model C --data synthetic --train-samples 256 --threads 1 --ckpt-dir "$ck" "$@" 2>&1; }

out=$(run --epochs 3 --keep-ckpt 2 --seed 1) || fail "run A failed: $out"
a_sum=$(cat "$ck"/modelC-*.safetensors | md5sum)
ls "$ck"

# Run B, new, in A's directory: refused, A's files untouched.
out=$(run --epochs 2 --seed 2)
[[ $? -ne 0 ]] || fail "a new run in another run's directory was accepted: $out"
grep -q "holds checkpoints of another run" <<< "$out" || fail "no reason given: $out"
grep -q -- "--start-over" <<< "$out" || fail "the refusal does not say how to start over: $out"
[[ $(cat "$ck"/modelC-*.safetensors | md5sum) == "$a_sum" ]] || fail "run A's checkpoints changed"

# --start-over: A's checkpoints moved aside (the same bytes), B trains; --resume then continues B.
out=$(run --epochs 2 --seed 2 --start-over) || fail "--start-over failed: $out"
grep -q "set aside 2 checkpoint(s) of another run" <<< "$out" || fail "the move aside was not said: $out"
[[ $(cat "$ck"/modelC-set-aside-1/modelC-*.safetensors | md5sum) == "$a_sum" ]] || fail "run A's files were not kept"
out=$(run --epochs 3 --seed 2 --resume) || fail "--resume failed: $out"
grep -q "resumed from $ck/modelC-2_1.safetensors: epoch 3" <<< "$out" || fail "--resume did not continue run B: $out"

# A second run while one holds the directory: refused, naming the other process.
flock "$ck/modelC.lock" sleep 3 &
holder=$!
sleep 0.5
out=$(run --epochs 4 --seed 2 --resume)
status=$?
wait "$holder"
[[ $status -ne 0 ]] || fail "two runs wrote one directory at once: $out"
grep -q "another run is writing checkpoints 'modelC-\*'" <<< "$out" || fail "no reason given: $out"

# Every checkpoint damaged: the first --resume sets them aside and stops; a retry stops too.
for f in "$ck"/modelC-*_*.safetensors; do printf 'garbage' | dd of="$f" bs=1 seek=200 conv=notrunc status=none; done
out=$(run --epochs 4 --seed 2 --resume)
[[ $? -ne 0 ]] || fail "a resume from damaged checkpoints went on: $out"
out=$(run --epochs 4 --seed 2 --resume)
[[ $? -ne 0 ]] || fail "a retried resume trained from the beginning: $out"
grep -q "nothing loads, so nothing is resumed" <<< "$out" || fail "the retry does not say why: $out"

# A directory that cannot be written: refused at the start (no epoch trained).
out=$("$demi" train --model C --data synthetic --train-samples 256 --epochs 50 --threads 1 --ckpt-dir /proc/demi-ckpt 2>&1)
[[ $? -ne 0 ]] || fail "an unwritable --ckpt-dir was accepted"
grep -q "cannot create the checkpoint directory '/proc/demi-ckpt'" <<< "$out" || fail "no reason given: $out"
! grep -q "epoch 1" <<< "$out" || fail "an epoch was trained before the refusal: $out"
echo "ckpt_dir_cli_test: ok"
