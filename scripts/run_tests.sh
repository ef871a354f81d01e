#!/usr/bin/env bash
# `make test`: the test suite of a built tree, then, where there are GPUs and the build has the
# CUDA backend, the GPU tests and the CUDA-vs-CPU parity checks (scripts/gpu_check.sh).
# Ends with a summary of both, and of every test left out or skipped, with the reason.
#   scripts/run_tests.sh BUILD_DIR [JOBS]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/run_tests.sh BUILD_DIR [JOBS]}
jobs=${2:-$(nproc)}

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
cuda_built=$(sed -n 's/^cuda_backend //p' "$build/build_summary.txt" 2>/dev/null)
run_gpu=0
[ "$gpus" -gt 0 ] && [ "$cuda_built" = ON ] && run_gpu=1

# With GPUs, gpu_check.sh runs the GPU unit tests (and logs them); ctest leaves them out.
exclude=()
[ $run_gpu = 1 ] && exclude=(-E '^gpu_tests$')
(cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 900 "${exclude[@]}") 2>&1 |
  tee "$build/ctest.log"
ctest_rc=${PIPESTATUS[0]}

# The CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan).
echo
echo "---- CPU tests under ASan+UBSan (scripts/sanitize.sh, build in build-asan)"
JOBS=$jobs scripts/sanitize.sh 2>&1 | tee "$build/sanitize.log"
sanitize_rc=${PIPESTATUS[0]}

gpu_rc=0
if [ $run_gpu = 1 ]; then
  echo
  echo "---- GPU tests and CUDA-vs-CPU parity (scripts/gpu_check.sh, logs in $build/gpu_check)"
  FSDP_BUILD_DIR=$build scripts/gpu_check.sh "$build/gpu_check" 2>&1 | tee "$build/gpu_check.log"
  gpu_rc=${PIPESTATUS[0]}
fi

echo
echo "==== make test summary"
cpu_line=$(grep -E '^[0-9]+% tests passed' "$build/ctest.log" | tail -n1)
echo "test suite (ctest): $([ "$ctest_rc" = 0 ] && echo PASSED || echo FAILED): ${cpu_line:-no result}"
echo "CPU tests under ASan+UBSan: $([ "$sanitize_rc" = 0 ] && echo PASSED || echo FAILED): $(grep -E '^sanitize:' "$build/sanitize.log" | tail -n1)"
if [ $run_gpu = 1 ]; then
  unit=$(grep -E '^\[  (PASSED|FAILED)' "$build/gpu_check/gpu_tests.log" 2>/dev/null | head -n1)
  echo "GPU tests ($gpus GPUs): ${unit:-no result (see $build/gpu_check/gpu_tests.log)}"
  grep -E '^(PASS|FAIL) ' "$build/gpu_check.log" | sed 's/^/parity: /'
  echo "GPU checks: $([ "$gpu_rc" = 0 ] && echo PASSED || echo FAILED)"
elif [ "$gpus" -gt 0 ]; then
  echo "GPU tests and parity checks: NOT RUN: $gpus GPUs found, but $build has no CUDA backend (configured without nvcc or NCCL)"
else
  echo "GPU tests and parity checks: NOT RUN: no GPU on this machine (nvidia-smi lists none)"
fi
while read -r what; do
  echo "left out: $what"
done < <(sed -n 's/^left_out //p' "$build/build_summary.txt" 2>/dev/null)
# Tests that ran but skipped themselves (exit code 77: a GPU test without a GPU, ...).
grep -E '^[[:space:]]*[0-9]+ - .*\(Skipped\)' "$build/ctest.log" |
  sed -E 's/^[[:space:]]*[0-9]+ - ([^ ]+) .*/skipped: \1 (it exited 77: what it needs is not on this machine)/' | sort -u
[ "$ctest_rc" = 0 ] && [ "$sanitize_rc" = 0 ] && [ "$gpu_rc" = 0 ]
