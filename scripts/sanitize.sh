#!/usr/bin/env bash
# The CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included),
# CUDA off, built into build-asan. The timing tests (their own binary) are left out: the
# sanitizers slow every op, and those tests compare times. `make sanitize` runs this, and
# `make test` runs it after ctest. The checkpoint fuzz test (CheckpointFuzz.*, mutated
# checkpoints and safetensors files that must load or end in one line) is one of these tests:
# memory errors it provokes show here. More cases by hand:
#   FSDP_FUZZ_ITERATIONS=20000 scripts/sanitize.sh 'CheckpointFuzz.*'
#
#   scripts/sanitize.sh                 build and run everything
#   scripts/sanitize.sh 'Parity*'       only the tests matching a gtest filter
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${SANITIZE_BUILD:-build-asan}
JOBS=${JOBS:-$(nproc)}
FILTER=${1:-*}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"

if [ ! -f "$BUILD/build.ninja" ]; then
  # -O1: the sanitizers' own advice; fast enough to run, much cheaper to compile than -O3.
  # Warnings are the main build's business (-Werror in CI): at -O1 with instrumentation
  # GCC's flow-sensitive warnings are noisy and say nothing new.
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=OFF -DFSDP_WERROR=OFF \
    -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS="$SAN" -DFSDP_TESTS_OPT_FLAG=-O0 \
    -DCMAKE_EXE_LINKER_FLAGS="$SAN" >/dev/null
fi
# The CLI tests run the fsdp binary, so it is built (sanitized) too.
cmake --build "$BUILD" -j "$JOBS" --target fsdp_tests fsdp_tool

export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
start=$(date +%s)
# One gtest shard per job, side by side (ctest already runs these tests as parallel processes,
# so they share nothing): the suite under the sanitizers is a few minutes on one core.
shards=$(( JOBS > 0 ? JOBS : 1 ))
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for ((i = 0; i < shards; ++i)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i \
    "$BUILD/fsdp_tests" --gtest_filter="$FILTER" --gtest_brief=1 >"$logs/$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for ((i = 0; i < shards; ++i)); do
  if ! wait "${pids[$i]}"; then
    failed=1
    echo "sanitize: shard $((i + 1)) of $shards failed:"
  fi
  cat "$logs/$i.log"
done
[ $failed = 0 ] || { echo "sanitize: $BUILD/fsdp_tests FAILED under ASan+UBSan"; exit 1; }
echo "sanitize: $BUILD/fsdp_tests passed under ASan+UBSan in $(( $(date +%s) - start )) s ($shards shards)"
