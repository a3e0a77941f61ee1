#!/usr/bin/env bash
# Builds and runs the consumer project (this folder) against an installed demi, as a user would:
#   run.sh cmake PREFIX WORK         find_package(demi CONFIG REQUIRED) with CMAKE_PREFIX_PATH=PREFIX
#   run.sh pkg-config PREFIX WORK    c++ seed_consumer.cc $(pkg-config --cflags --libs demi)
#   run.sh subproject DEMI_SRC WORK  add_subdirectory(DEMI_SRC), GTest and Google Benchmark hidden:
#                                    configures only and checks that none of demi's tests, benchmarks,
#                                    examples or tools became targets of the user's build
set -euo pipefail
mode=$1
where=$(realpath "$2")
work=$3
src=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"

# The last lines of a failed step's log, then exit 1.
fail() {
  echo "run.sh $mode: $1"
  [[ -f ${2:-} ]] && tail -n 30 "$2"
  exit 1
}

case "$mode" in
  cmake)
    cmake -S "$src" -B "$work" -DCMAKE_PREFIX_PATH="$where" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_EXPORT_COMPILE_COMMANDS=ON > "$work/configure.log" 2>&1 || fail "configure failed" "$work/configure.log"
    cmake --build "$work" > "$work/build.log" 2>&1 || fail "build failed" "$work/build.log"
    # demi's own flags (warnings, -Werror, sanitizers) must stay off its users' code.
    if grep -E -e '-W(all|extra|shadow|pedantic|error)|-fsanitize' "$work/compile_commands.json"; then
      fail "demi's own compile flags reached the consumer's compile line"
    fi
    ;;
  pkg-config)
    pc=$(find "$where" -name demi.pc -path '*/pkgconfig/*' | head -n 1)
    [[ -n $pc ]] || fail "no demi.pc under $where"
    export PKG_CONFIG_PATH=$(dirname "$pc")
    flags=$(pkg-config --cflags --libs demi) || fail "pkg-config --cflags --libs demi failed"
    echo "pkg-config --cflags --libs demi: $flags"
    # shellcheck disable=SC2086  # the flags are words
    ${CXX:-c++} -O2 -o "$work/seed_consumer" "$src/seed_consumer.cc" $flags > "$work/build.log" 2>&1 ||
      fail "compile failed" "$work/build.log"
    ;;
  subproject)
    cmake -S "$src" -B "$work" -DDEMI_SOURCE_DIR="$where" -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON \
      -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON > "$work/configure.log" 2>&1 ||
      fail "configure failed" "$work/configure.log"
    cmake --build "$work" --target help > "$work/targets.txt"
    if grep -E '_test$|_bench$|^\.\.\. (demi_tool|seed_simple_cnn|custom_loop|fashion_mnist)$' "$work/targets.txt"; then
      fail "demi's own tests, benchmarks, examples or tools are targets of the embedding project"
    fi
    grep -q 'demi_core$' "$work/targets.txt" || fail "demi's libraries are not targets of the embedding project" "$work/targets.txt"
    echo "run.sh subproject: configured with no GTest and no Google Benchmark; targets: $(grep -c '^\.\.\. ' "$work/targets.txt")"
    exit 0
    ;;
  *)
    fail "unknown mode (cmake, pkg-config, subproject)"
    ;;
esac
"$work/seed_consumer"
