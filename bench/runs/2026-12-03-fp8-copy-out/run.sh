#!/usr/bin/env bash
# The float8 all-gather's codes in the fused copy-out, on one H200 (about 2 minutes):
#   bash bench/runs/2026-12-03-fp8-copy-out/run.sh
# the fp8 GPU tests and llama1b at 4 x 2048 tokens with --fp8 tensorwise. Not run yet.
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-copy-out fsdp_tool fsdp_gpu_tests
timeout 60 build-gpu/fsdp_gpu_tests --gtest_filter='CudaFp8*' > "$R/gpu_fp8_tests.log" 2>&1
echo "fp8 gpu tests rc=$? at $((SECONDS - T0)) s"; grep -E "Failure|PASSED|FAILED" "$R/gpu_fp8_tests.log" | head
run_llama llama1b_4seq_fp8_tensorwise --tokens 8192 --fp8 tensorwise
