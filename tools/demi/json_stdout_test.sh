#!/usr/bin/env bash
# json_stdout_test.sh STDERR_REGEX DEMI [ARGS...]: DEMI ARGS... (run with --json) must exit 0 with standard
# output holding only JSON lines (one object per line, at least one), and what it says as text on standard
# error matching the extended STDERR_REGEX (the diagnostics that must not be mixed into the JSON).
set -uo pipefail
regex=$1
shift
err=$(mktemp) || exit 1
trap 'rm -f -- "$err"' EXIT
out=$("$@" 2> "$err" < /dev/null)
status=$?
fail() {
  printf 'json_stdout_test: %s\nstdout:\n%s\nstderr:\n%s\n' "$1" "$out" "$(cat "$err")"
  exit 1
}
[[ $status -eq 0 ]] || fail "exit status $status"
[[ -n $out ]] || fail "nothing on standard output"
! printf '%s\n' "$out" | grep -qv '^{' || fail "standard output holds a line that is not a JSON object"
grep -Eq -e "$regex" "$err" || fail "standard error does not match: $regex"
echo "json_stdout_test: ok"
