#!/usr/bin/env bash
# The weight's transpose before each fp8 dX GEMM in 16-byte words, on one H200 (about 3 min):
#   bash bench/runs/2026-12-03-fp8-transpose/run.sh
# the fp8 GPU tests, the tensorwise GEMM floor, and llama1b at 4 x 2048 tokens with --fp8
# none, tensorwise and rowwise.
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-transpose fsdp_tool fsdp_gpu_tests gemm_floor
timeout 120 build-gpu/fsdp_gpu_tests --gtest_filter='CudaFp8*' > "$R/gpu_fp8_tests.log" 2>&1
echo "fp8 gpu tests rc=$? at $((SECONDS - T0)) s"; grep -E "Failure|PASSED|FAILED" "$R/gpu_fp8_tests.log" | head
timeout 120 build-gpu/bench/gemm_floor llama-fp8 8192 20 tensorwise > "$R/gemm_floor_fp8_tensorwise.jsonl" 2>&1
echo "gemm_floor fp8 tensorwise rc=$?: $(grep step "$R/gemm_floor_fp8_tensorwise.jsonl" | head -1)"
run_llama llama1b_4seq_bf16 --tokens 8192 --fp8 none
run_llama llama1b_4seq_fp8_tensorwise --tokens 8192 --fp8 tensorwise
run_llama llama1b_4seq_fp8_rowwise --tokens 8192 --fp8 rowwise
