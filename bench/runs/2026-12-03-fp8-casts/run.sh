#!/usr/bin/env bash
# The fp8 casts of Note [Fp8 cast tiles] and Note [Fp8 operands reused by the weight grad] on
# one H200, in one call of about 4 minutes:
#   bash bench/runs/2026-12-03-fp8-casts/run.sh
#  1. the fp8 GPU tests (the casts bit for bit against the CPU's, now with the transposed codes
#     and the tiled kernel's shapes; the GEMMs);
#  2. the fp8 GEMM floor at 8192 tokens, tensorwise and rowwise, alone and with the casts;
#  3. llama1b at 4 x 2048 tokens: --fp8 none, tensorwise, rowwise.
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-casts fsdp_tool fsdp_gpu_tests gemm_floor
timeout 120 build-gpu/fsdp_gpu_tests --gtest_filter='CudaFp8*' > "$R/gpu_fp8_tests.log" 2>&1
echo "fp8 gpu tests rc=$? at $((SECONDS - T0)) s"; grep -E "Failure|PASSED|FAILED" "$R/gpu_fp8_tests.log" | head
for recipe in tensorwise rowwise; do
  timeout 120 build-gpu/bench/gemm_floor llama-fp8 8192 20 $recipe > "$R/gemm_floor_fp8_$recipe.jsonl" 2>&1
  echo "gemm_floor fp8 $recipe rc=$?: $(grep step "$R/gemm_floor_fp8_$recipe.jsonl" | head -1)"
done
run_llama llama1b_4seq_bf16 --tokens 8192 --fp8 none
run_llama llama1b_4seq_fp8_tensorwise --tokens 8192 --fp8 tensorwise
run_llama llama1b_4seq_fp8_rowwise --tokens 8192 --fp8 rowwise
