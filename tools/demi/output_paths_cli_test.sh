#!/usr/bin/env bash
# output_paths_cli_test.sh DEMI DIR: output paths that are not regular files are refused before training
# and left as they are (a device, a FIFO); a symbolic link is followed (the file it names is written, the
# link stays); inputs that are FIFOs or directories are refused at once, never waited on.
set -uo pipefail
demi=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() {
  echo "output_paths_cli_test: $*"
  exit 1
}
train=("$demi" train --model C --data synthetic --train-samples 256 --epochs 1 --threads 1)

out=$(timeout 60 "${train[@]}" --report /dev/full 2>&1)
[[ $? -ne 0 ]] || fail "--report /dev/full was accepted"
grep -q "is a character device, not a regular file" <<< "$out" || fail "no reason given: $out"
[[ -c /dev/full ]] || fail "/dev/full is no longer a device"

mkfifo "$dir/fifo"
out=$(timeout 60 "${train[@]}" --report-data "$dir/fifo" 2>&1)
status=$?
[[ $status -ne 124 ]] || fail "--report-data FIFO hung"
[[ $status -ne 0 ]] || fail "--report-data FIFO was accepted"
grep -q "is a FIFO, not a regular file" <<< "$out" || fail "no reason given: $out"
[[ -p $dir/fifo ]] || fail "the FIFO was replaced"

echo old > "$dir/real.json"
ln -s real.json "$dir/link.json"
timeout 120 "${train[@]}" --report-data "$dir/link.json" > /dev/null 2>&1 || fail "--report-data through a link failed"
[[ -L $dir/link.json ]] || fail "the symbolic link was replaced"
grep -q '"steps"' "$dir/real.json" || fail "the file the link names was not written: $(head -c 200 "$dir/real.json")"

for args in "--model gpt --data text:$dir/fifo --steps 1" "--model gpt --data text:$dir --steps 1"; do
  # shellcheck disable=SC2086
  out=$(timeout 60 "$demi" train $args 2>&1)
  status=$?
  [[ $status -ne 124 ]] || fail "train $args hung"
  [[ $status -ne 0 ]] || fail "train $args was accepted"
  grep -Eq "is (a directory|not a regular file)" <<< "$out" || fail "train $args: no reason given: $out"
done
for cmd in "eval --model C --data synthetic --checkpoint $dir/fifo" "generate --checkpoint $dir/fifo"; do
  # shellcheck disable=SC2086
  out=$(timeout 60 "$demi" $cmd 2>&1)
  status=$?
  [[ $status -ne 124 ]] || fail "$cmd hung"
  [[ $status -ne 0 ]] || fail "$cmd was accepted"
  grep -q "not a regular file" <<< "$out" || fail "$cmd: no reason given: $out"
done
# Kernel-choice cache files that are not what they should be: said, and the run goes on (a device in
# their place once read until out of memory).
cache="$dir/cache"
DEMI_CACHE_DIR=$cache timeout 120 "${train[@]}" > /dev/null 2>&1 || fail "the run that makes the cache failed"
choice=$(ls "$cache"/matmul-*.txt | head -n 1)
[[ -f $choice ]] || fail "no matmul choice file in $cache"
rm "$choice" && ln -s /dev/zero "$choice"
out=$(DEMI_CACHE_DIR=$cache timeout 120 "${train[@]}" 2>&1)
status=$?
[[ $status -ne 124 ]] || fail "a choice cache that is /dev/zero hung the run"
[[ $status -eq 0 ]] || fail "a choice cache that is /dev/zero stopped the run: $out"
grep -q "is not a regular file: this process keeps its choices in memory only" <<< "$out" || fail "not said: $out"
rm "$choice" && head -c 20000000 /dev/zero | tr '\0' 'x' > "$choice"
out=$(DEMI_CACHE_DIR=$cache timeout 120 "${train[@]}" 2>&1) || fail "a huge choice file stopped the run: $out"
grep -q "more than a choice file ever does: it is started anew" <<< "$out" || fail "not said: $out"
(($(stat -c %s "$choice") < 1000000)) || fail "the huge choice file was not started anew"
echo "output_paths_cli_test: ok"
