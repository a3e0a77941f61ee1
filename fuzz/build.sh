#!/usr/bin/env bash
# Builds demi's libFuzzer targets with clang (Debian's clang-14; `scripts/setup --fuzz` installs it) and
# AddressSanitizer + UndefinedBehaviorSanitizer, compiling only the sources the decoders need (core, the
# data module's byte-level decoders and text vocabulary, io, the demi command's option parser and GPT
# checkpoint reader), not the whole library.
#
#   fuzz/build.sh                   builds build/fuzz/{safetensors,idx,cifar,args,gpt_meta}_fuzz
#   fuzz/build.sh --run SECONDS     then fuzzes each target for SECONDS, one after another, starting from
#                                   (and adding to) a scratch copy of fuzz/corpus/<target>/
#   fuzz/build.sh --run 600 idx_fuzz  only the targets named
#   fuzz/build.sh --merge           minimizes fuzz/corpus/<target>/ plus the scratch corpus back into
#                                   fuzz/corpus/<target>/ (-merge=1, by edge coverage)
#
# The corpora committed in fuzz/corpus/ are replayed by CTest without libFuzzer (fuzz/CMakeLists.txt).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${DEMI_FUZZ_BUILD:-$root/build/fuzz}
cxx=${CXX_FUZZ:-clang++-14}
targets=(safetensors_fuzz idx_fuzz cifar_fuzz args_fuzz gpt_meta_fuzz)
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
       -fopenmp -I"$root" -Wall -Wno-unused-parameter -Wno-unknown-pragmas -Wno-unknown-warning-option)

isa_flags() {
  case "$1" in
    *_avx2.cc) echo "-mavx2 -mfma -mf16c" ;;
    *_avx512.cc) echo "-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mavx2" ;;
    *_avx512bf16.cc) echo "-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c -mavx2" ;;
  esac
}

# Compiles $1 into $2 unless the object is newer than the source and every header it included.
compile() {
  local src=$1 obj=$2 fuzzer=$3
  if [[ -f $obj && -f $obj.d ]]; then
    local stale=0 dep
    for dep in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$obj.d"); do
      [[ $dep -nt $obj ]] && { stale=1; break; }
    done
    ((stale)) || return 0
  fi
  mkdir -p "$(dirname "$obj")"
  echo "  CXX $src"
  # shellcheck disable=SC2046
  "$cxx" "${flags[@]}" $(isa_flags "$src") "$fuzzer" -MMD -MF "$obj.d" -c "$src" -o "$obj"
}

build() {
  command -v "$cxx" >/dev/null || { echo "fuzz/build.sh: $cxx not found (run scripts/setup --fuzz)" >&2; exit 1; }
  local lib_srcs=() objs=() s
  for s in "$root"/demi/core/*.cc "$root"/demi/io/*.cc "$root"/demi/io/internal/*.cc \
           "$root"/demi/data/internal/formats.cc "$root"/demi/data/text.cc "$root"/demi/data/dataset.cc; do
    [[ -f $s && $s != *_test.cc ]] && lib_srcs+=("$s")
  done
  for s in "${lib_srcs[@]}"; do
    local o=$out/obj/${s#"$root"/}.o
    compile "$s" "$o" -fsanitize=fuzzer-no-link
    objs+=("$o")
  done
  compile "$root/tools/demi/args.cc" "$out/obj/tools/demi/args.cc.o" -fsanitize=fuzzer-no-link
  compile "$root/tools/demi/gpt_meta.cc" "$out/obj/tools/demi/gpt_meta.cc.o" -fsanitize=fuzzer-no-link
  for t in "${targets[@]}"; do
    [[ -f $root/fuzz/$t.cc ]] || continue
    compile "$root/fuzz/$t.cc" "$out/obj/fuzz/$t.o" -fsanitize=fuzzer-no-link
    local extra=()
    [[ $t == args_fuzz ]] && extra=("$out/obj/tools/demi/args.cc.o")  # the demi command's option parser
    [[ $t == gpt_meta_fuzz ]] && extra=("$out/obj/tools/demi/args.cc.o" "$out/obj/tools/demi/gpt_meta.cc.o")
    echo "  LINK $out/$t"
    "$cxx" "${flags[@]}" -fsanitize=fuzzer "$out/obj/fuzz/$t.o" "${extra[@]}" "${objs[@]}" -lz -o "$out/$t"
  done
}

run() {
  local seconds=$1 t
  for t in "${targets[@]}"; do
    local work=$out/corpus/$t
    mkdir -p "$work"
    cp -n "$root/fuzz/corpus/$t/"* "$work/" 2>/dev/null || true
    echo "fuzzing $t for ${seconds}s (log: $out/$t.log)"
    # -malloc_limit_mb: a decoder that trusts a header's size and allocates it is a finding.
    (cd "$out" && "./$t" -max_total_time="$seconds" -malloc_limit_mb=512 -rss_limit_mb=2048 \
       -timeout=10 -print_final_stats=1 -artifact_prefix="$out/$t-" "$work" >"$out/$t.log" 2>&1) ||
      echo "fuzz/build.sh: $t stopped with a finding, see $out/$t.log" >&2
    grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$out/$t.log" || true
  done
}

merge() {
  local t
  for t in "${targets[@]}"; do
    local fresh=$out/merged/$t
    rm -rf "$fresh" && mkdir -p "$fresh"
    # -use_counters=0: keep the inputs that reach new edges (not new hit counts), so the committed
    # corpus stays a few dozen small files.
    "$out/$t" -merge=1 -use_counters=0 "$fresh" "$root/fuzz/corpus/$t" "$out/corpus/$t" >"$out/$t.merge.log" 2>&1
    rm -f "$root/fuzz/corpus/$t/"*
    cp "$fresh"/* "$root/fuzz/corpus/$t/"
    echo "$t: $(ls "$root/fuzz/corpus/$t" | wc -l) inputs after merge"
  done
}

usage="usage: fuzz/build.sh [--run SECONDS [TARGET...] | --merge [TARGET...]]"
mode=${1:-}
case "$mode" in
  --run) seconds=${2:?$usage}; shift 2 ;;
  --merge) shift ;;
  "") ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
(($# > 0)) && targets=("$@")
build
case "$mode" in
  --run) run "$seconds" ;;
  --merge) merge ;;
esac
