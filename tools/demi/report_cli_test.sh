#!/usr/bin/env bash
# report_cli_test.sh DEMI DIR: `demi train --report` and `demi compare --report` each write one
# self-contained HTML file (nothing loaded from elsewhere) with its charts; `--report-data` writes the run
# record; an unwritable --report path is an error before anything is trained.
set -uo pipefail
demi=$1 dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() {
  echo "report_cli_test: $*"
  exit 1
}
# check_page FILE CHARTS: written, self-contained, with CHARTS inline SVG charts.
check_page() {
  [[ -s $1 ]] || fail "$1 was not written"
  local outside n
  for outside in 'http://' 'https://' ' src=' ' href=' '<link' '@import' '<iframe' '<object'; do
    if grep -qF -- "$outside" "$1"; then fail "$1 refers to something outside itself ('$outside')"; fi
  done
  n=$(grep -o '<svg id=' "$1" | wc -l)
  [[ $n -eq $2 ]] || fail "$1 has $n charts, expected $2"
  grep -q '</html>' "$1" || fail "$1 is not a whole page"
}

"$demi" train --model A --data synthetic --train-samples 256 --epochs 1 --report "$dir/run.html" \
  --report-data "$dir/run.json" || fail "demi train --report failed"
check_page "$dir/run.html" 4
for id in loss scale throughput memory; do
  grep -q "<svg id=\"$id\"" "$dir/run.html" || fail "run.html has no '$id' chart"
done
grep -q '>test accuracy<' "$dir/run.html" || fail "run.html has no test accuracy card"
grep -q '"format":"demi-run-record"' "$dir/run.json" || fail "run.json is not a run record"
if ls -A "$dir" | grep -q 'tmp'; then fail "a temporary file was left in $dir: $(ls -A "$dir")"; fi

"$demi" compare --model C --data synthetic --train-samples 512 --levels O0,O2 --dtypes bf16 \
  --report "$dir/cmp.html" || fail "demi compare --report failed"
# loss, loss scale, throughput, samples/s, peak memory, test accuracy, and memory over time per setting
check_page "$dir/cmp.html" 8
for name in O0-fp32 O2-bf16; do
  grep -q "data-series=\"$name\"" "$dir/cmp.html" || fail "cmp.html has no curve of $name"
done

out=$("$demi" train --model C --data synthetic --train-samples 256 --report "$dir/missing/run.html" 2>&1)
status=$?
printf '%s\nexit status %d\n' "$out" "$status"
[[ $status -eq 1 ]] || fail "an unwritable --report path: expected exit status 1"
grep -qF -- "--report: cannot write '$dir/missing/run.html'" <<< "$out" || fail "the error does not name the path"
if grep -q 'samples/s' <<< "$out"; then fail "it trained before checking the --report path"; fi
# A run that stops (a NaN loss at O0) is reported up to where it stopped.
out=$("$demi" train --model C --data synthetic --train-samples 2048 --lr 1000 --report "$dir/stopped.html" 2>&1)
status=$?
[[ $status -eq 1 ]] || fail "a diverging run at O0: expected exit status 1, got $status: $out"
check_page "$dir/stopped.html" 4
grep -q 'training stopped: the loss became' "$dir/stopped.html" || fail "stopped.html does not say why it stopped"
echo "report_cli_test: ok"
