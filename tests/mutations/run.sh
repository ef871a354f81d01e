#!/usr/bin/env bash
# Deliberate single-line bugs in src/ (the scheduler, the optimizer and its schedule, the
# trainer, the checkpoint readers), one patch each (the patch's first line says what it
# breaks). Applies each in turn, builds, runs the CPU test suite (ctest, timing tests left
# out) and prints which tests caught it. Every bug should be caught by at least two tests.
# By hand, not in CI (each mutation is a rebuild and a suite run):
#
#   tests/mutations/run.sh                  every patch
#   tests/mutations/run.sh 03 05            the patches whose names start with these
#   MUTATION_TESTS='Golden|Checkpoint' tests/mutations/run.sh 15
#       only the tests whose names match (ctest -R): quicker, but it counts only those
#   MUTATION_SANITIZE=1 tests/mutations/run.sh 01
#       also runs the back-to-back and misprefetch tests of an ASan+UBSan build (build-asan,
#       as scripts/sanitize.sh makes it), one process per test; a write into freed memory
#       (an all-gather outliving its reshard) shows there.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
BUILD=${MUTATION_BUILD:-build-mutations}
JOBS=${JOBS:-2}
SAN_FILTER='*BackToBack*:BackwardMisprefetch.*:ExplicitUnshard.*'

if ! git diff --quiet -- src; then
  echo "run.sh: src has uncommitted changes; commit or stash them first" >&2
  exit 2
fi
restore() { git checkout -q -- src; }
trap restore EXIT INT TERM

if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=OFF >/dev/null
fi

patches=()
if [ $# -eq 0 ]; then
  patches=(tests/mutations/*.patch)
else
  for prefix in "$@"; do patches+=(tests/mutations/"$prefix"*.patch); done
fi

for patch in "${patches[@]}"; do
  name=$(basename "$patch" .patch)
  echo "== $name: $(head -n 1 "$patch")"
  restore
  git apply "$patch" || { echo "   does not apply"; continue; }
  if ! cmake --build "$BUILD" -j "$JOBS" --target fsdp_tests fsdp_tool >/tmp/mutation-build.log 2>&1; then
    echo "   build failed (see /tmp/mutation-build.log)"
    continue
  fi
  only=()
  [ -n "${MUTATION_TESTS:-}" ] && only=(-R "$MUTATION_TESTS")
  caught=$( (cd "$BUILD" && ctest -j "$JOBS" --timeout 120 -E '^(timing_tests|gpu_tests)$' "${only[@]}" 2>&1) |
           sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\).* (\([A-Za-z ]*\))$/\1 [\2]/p')
  if [ "${MUTATION_SANITIZE:-0}" = 1 ]; then
    if scripts/sanitize.sh 'NoTestMatchesThis' >/tmp/mutation-sanitize.log 2>&1; then
      for t in $(build-asan/fsdp_tests --gtest_list_tests --gtest_filter="$SAN_FILTER" |
                 awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}'); do
        build-asan/fsdp_tests --gtest_filter="$t" >/tmp/mutation-asan-test.log 2>&1 ||
          caught+=$'\n'"$t [ASan+UBSan]"
      done
    else
      echo "   sanitizer build failed (see /tmp/mutation-sanitize.log)"
    fi
  fi
  count=$(printf '%s\n' "$caught" | grep -c . || true)
  echo "   caught by $count test(s)"
  [ -n "$caught" ] && printf '%s\n' "$caught" | sed 's/^/     /'
done
