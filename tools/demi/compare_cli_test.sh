#!/usr/bin/env bash
# compare_cli_test.sh DEMI DIR: `demi compare` hands each setting's options to its child runs as they were
# given (--f16-products reaches the float16 runs: their losses change), through an argument vector: a
# --data value or a folder with quotes and a `;` in it is a name, never a command.
set -uo pipefail
demi=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
cd "$dir" || exit 1
fail() {
  echo "compare_cli_test: $*"
  exit 1
}
# The O2-fp16 row's final loss (the table's "loss" column, second to last).
loss_of() { awk '$1 == "O2-fp16" { print $(NF - 1); exit }' <<< "$1"; }
common=(compare --model C --data fashion-mnist --train-samples 4096 --epochs 2 --lr 0.1 --levels O2 --dtypes fp16 --threads 1)
exact=$("$demi" "${common[@]}") || fail "compare failed: $exact"
bf16=$("$demi" "${common[@]}" --f16-products bf16) || fail "compare --f16-products bf16 failed: $bf16"
printf '%s\n%s\n' "$exact" "$bf16"
a=$(loss_of "$exact") b=$(loss_of "$bf16")
[[ -n $a && -n $b ]] || fail "no O2-fp16 loss in the tables"
[[ $a != "$b" ]] || fail "--f16-products bf16 did not reach the runs: the same loss $a"

# Injection: the value is passed as one argument, so the child refuses it as a data set and nothing runs.
out=$("$demi" compare --model C --levels O0 --data "synthetic'; touch PWNED; echo '" 2>&1)
status=$?
echo "$out"
[[ $status -ne 0 ]] || fail "a --data value that is no data set was accepted"
[[ ! -e PWNED ]] || fail "a --data value ran a command"
grep -q "touch PWNED" <<< "$out" || fail "the failure does not show the value as given: $out"
# A folder whose name has a quote in it runs like any other.
mkdir -p "q'dir" && cd "q'dir" || exit 1
"$demi" compare --model C --data synthetic --train-samples 256 --epochs 1 --levels O0 --threads 1 > out.txt ||
  fail "compare in a folder named q'dir failed: $(cat out.txt)"
grep -q "O0-fp32" out.txt || fail "no O0 row: $(cat out.txt)"
echo "compare_cli_test: ok"
