#!/usr/bin/env bash
# One command-line test: cli_test.sh [--fresh DIR] STATUS REGEX DEMI [ARGS...] runs DEMI ARGS..., prints its
# output, and passes only when it exits with STATUS and its output (stdout and stderr) matches the extended
# REGEX. --fresh DIR removes DIR first (a checkpoint directory the run makes again on each ctest run).
set -uo pipefail
if [[ ${1:-} == --fresh ]]; then
  rm -rf -- "$2" || exit 1
  shift 2
fi
expected=$1 regex=$2
shift 2
out=$("$@" 2>&1 < /dev/null)
status=$?
printf '%s\nexit status %d\n' "$out" "$status"
if [[ $status -ne $expected ]]; then
  echo "cli_test: expected exit status $expected"
  exit 1
fi
if ! grep -Eq -e "$regex" <<< "$out"; then
  echo "cli_test: the output does not match: $regex"
  exit 1
fi
