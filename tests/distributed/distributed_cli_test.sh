#!/usr/bin/env bash
# `mpirun demi train` end to end: distributed_cli_test.sh DEMI WORKDIR MPIRUN
#   1. a run checkpointed on 2 processes resumes on 2 bit-identically (the final checkpoints are the same
#      bytes), and on 3 from the data position it stopped at
#   2. a process killed with SIGKILL ends the job within 30 s, the rank named; the run then resumes
#   3. a stopped (stalled) process ends the job through the others' watchdog (DEMI_DIST_TIMEOUT)
set -euo pipefail
demi=$1
work=$2
mpirun=("${3:-mpirun}" --allow-run-as-root --oversubscribe --mca plm isolated --bind-to none -x OMP_NUM_THREADS=1)
rm -rf "$work"
mkdir -p "$work"

fail() {
  echo "distributed_cli_test: $1"
  shift
  for log in "$@"; do echo "--- $log"; tail -n 30 "$log"; done
  exit 1
}

# 1. 32 batches of 64 per epoch: 2 processes take 2 per step; the checkpoint after step 3 is at batch 6,
#    where 3 processes take over: ceil(26 / 3) = 9 more steps, 12 in all.
train=("$demi" train --model C --data synthetic --train-samples 2048 --batch-size 64 --epochs 1 --threads 1
       --ckpt-dir "$work/resize" --ckpt-every 3 --keep-ckpt 0)
timeout 120 "${mpirun[@]}" -np 2 "${train[@]}" > "$work/resize-2.log" 2>&1 || fail "the 2-process run failed" "$work/resize-2.log"
[[ -f "$work/resize/modelC-1_6.safetensors" ]] || fail "no checkpoint at batch 6: $(ls "$work/resize")" "$work/resize-2.log"
mkdir "$work/same"
cp "$work/resize/modelC-1_6.safetensors" "$work/same/"
timeout 120 "${mpirun[@]}" -np 2 "${train[@]}" --ckpt-dir "$work/same" --resume > "$work/same-2.log" 2>&1 ||
  fail "the 2-process resume failed" "$work/same-2.log"
cmp "$work/resize/modelC-1_32.safetensors" "$work/same/modelC-1_32.safetensors" ||
  fail "resumed on 2 processes, the final checkpoint differs from the uninterrupted run's" "$work/same-2.log"
echo "resume on the same world size, bit-identical: OK"
find "$work/resize" -name 'modelC-*' ! -name 'modelC-1_6.safetensors' -delete
timeout 120 "${mpirun[@]}" -np 3 "${train[@]}" --resume > "$work/resize-3.log" 2>&1 || fail "the 3-process resume failed" "$work/resize-3.log"
grep -q "resumed from .*modelC-1_6.safetensors: epoch 1, step 3" "$work/resize-3.log" || fail "not resumed at step 3" "$work/resize-3.log"
grep -q "data-parallel training on 3 processes" "$work/resize-3.log" || fail "not 3 processes" "$work/resize-3.log"
grep -q ": 12 steps," "$work/resize-3.log" || fail "expected 12 steps in all" "$work/resize-3.log"
echo "resume on another world size: OK"

# A run long enough to interrupt: model B, ~150 steps; waits for its first checkpoint.
long=("$demi" train --model B --data synthetic --train-samples 20000 --batch-size 64 --epochs 1 --threads 1
      --ckpt-every 10 --keep-ckpt 0)
start_long() {  # start_long DIR LOG [mpirun options]: the job in the background, pid in $job
  local dir=$1 log=$2
  shift 2
  "${mpirun[@]}" "$@" -np 2 "${long[@]}" --ckpt-dir "$dir" > "$log" 2>&1 &
  job=$!
  for _ in $(seq 600); do
    compgen -G "$dir/modelB-*.safetensors" > /dev/null && return 0
    kill -0 "$job" 2> /dev/null || fail "the job ended before its first checkpoint" "$log"
    sleep 0.1
  done
  fail "no checkpoint after 60 s" "$log"
}
# The job's processes (children of mpirun), by rank order of their pids.
ranks() { pgrep -P "$job" | sort -n; }
wait_job() {  # wait_job LOG: the job's exit status within 30 s, or a failure
  local log=$1 t0=$SECONDS
  while kill -0 "$job" 2> /dev/null; do
    ((SECONDS - t0 <= 30)) || { kill -9 "$job" $(ranks) 2> /dev/null || true; fail "the job still runs 30 s later" "$log"; }
    sleep 0.2
  done
  status=0
  wait "$job" || status=$?
  echo "job ended after $((SECONDS - t0)) s with status $status"
}

# 2. SIGKILL one process.
start_long "$work/kill" "$work/kill.log"
victim=$(ranks | tail -n 1)
kill -9 "$victim"
wait_job "$work/kill.log"
((status != 0)) || fail "the job exited 0 after a process was killed" "$work/kill.log"
grep -Eq "rank [0-9]+ .*(exited on signal 9|Killed)|process rank [0-9]+" "$work/kill.log" || fail "no rank named" "$work/kill.log"
timeout 120 "${mpirun[@]}" -np 2 "${long[@]}" --ckpt-dir "$work/kill" --resume > "$work/kill-resume.log" 2>&1 ||
  fail "the resume after the kill failed" "$work/kill-resume.log"
grep -q "resumed from" "$work/kill-resume.log" || fail "the rerun did not resume" "$work/kill-resume.log"
grep -q "test accuracy" "$work/kill-resume.log" || fail "the resumed run did not finish" "$work/kill-resume.log"
echo "killed process: OK"

# 3. SIGSTOP one process: the others wait in a collective until their watchdog (3 s here) ends the job.
start_long "$work/stall" "$work/stall.log" -x DEMI_DIST_TIMEOUT=3
victim=$(ranks | tail -n 1)
kill -STOP "$victim"
wait_job "$work/stall.log"
kill -9 "$victim" 2> /dev/null || true
((status != 0)) || fail "the job exited 0 with a stalled process" "$work/stall.log"
grep -q "has waited [0-9]* s for the other processes" "$work/stall.log" || fail "no watchdog message" "$work/stall.log"
echo "stalled process: OK"

# 4. Processes that disagree on a setting that changes the result stop at start-up, naming it and the rank;
#    a training set with fewer batches than processes stops at start-up too (it once hung until the watchdog).
small=(train --model C --data synthetic --train-samples 512 --batch-size 64 --epochs 1 --threads 1)
for differ in "--lr 0.02" "--seed 7" "--batch-size 32" "--amp O2"; do
  # shellcheck disable=SC2086
  timeout 120 "${mpirun[@]}" -np 1 "$demi" "${small[@]}" : -np 1 "$demi" "${small[@]}" $differ > "$work/disagree.log" 2>&1 &&
    fail "processes with $differ on one of them trained" "$work/disagree.log"
  grep -q "the processes disagree on ${differ%% *} (here '" "$work/disagree.log" ||
    fail "$differ: the setting is not named" "$work/disagree.log"
  grep -q "this is rank 1" "$work/disagree.log" || fail "$differ: the rank is not named" "$work/disagree.log"
done
echo "disagreeing settings: OK"
timeout 60 "${mpirun[@]}" -np 3 "$demi" train --model C --data synthetic --train-samples 64 --batch-size 32 --epochs 1 \
  --threads 1 > "$work/few.log" 2>&1 && fail "3 processes trained on 2 batches" "$work/few.log"
grep -q "fewer than the 3 data-parallel processes" "$work/few.log" || fail "no reason given for too few batches" "$work/few.log"
echo "fewer batches than processes: OK"
