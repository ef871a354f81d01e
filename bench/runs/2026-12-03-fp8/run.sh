#!/usr/bin/env bash
# fp8 training (docs/fp8.md) on one H200:
#   bash bench/runs/2026-12-03-fp8/run.sh
#  1. the fp8 GPU tests: the CUDA casts bit for bit against the CPU's, the cuBLASLt fp8 GEMM
#     (tensorwise and rowwise, every layout) against the CPU's emulation; then the rest of the
#     GPU tests, to see that nothing else moved;
#  2. the GEMM floors at 8192 tokens: bf16 (gemm_floor llama) and fp8 (gemm_floor llama-fp8,
#     tensorwise and rowwise: the blocks' fp8 GEMMs alone and with their casts);
#  3. llama1b at 4 x 2048 tokens: --fp8 none (bf16), tensorwise (float8 all-gather), tensorwise
#     with a bf16 all-gather, rowwise; the target is the tensorwise step at <= 0.87x bf16's.
set -u
source bench/gpu_call.sh
gpu_call_begin fp8 fsdp_tool fsdp_gpu_tests gemm_floor
timeout 120 build-gpu/fsdp_gpu_tests --gtest_filter='CudaFp8*' > "$R/gpu_fp8_tests.log" 2>&1
echo "fp8 gpu tests rc=$? at $((SECONDS - T0)) s"; grep -E "FAIL|PASSED|FAILED" "$R/gpu_fp8_tests.log" | head
timeout 240 build-gpu/fsdp_gpu_tests --gtest_filter='-CudaFp8*' > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at $((SECONDS - T0)) s"; grep -E "PASSED|FAILED" "$R/gpu_tests.log" | head
timeout 120 build-gpu/bench/gemm_floor llama 8192 > "$R/gemm_floor_bf16.jsonl" 2>&1
echo "gemm_floor bf16 rc=$?: $(grep step "$R/gemm_floor_bf16.jsonl" | head -1)"
for recipe in tensorwise rowwise; do
  timeout 120 build-gpu/bench/gemm_floor llama-fp8 8192 20 $recipe > "$R/gemm_floor_fp8_$recipe.jsonl" 2>&1
  echo "gemm_floor fp8 $recipe rc=$?: $(grep step "$R/gemm_floor_fp8_$recipe.jsonl" | head -1)"
done
run_llama llama1b_4seq_bf16 --tokens 8192 --fp8 none
run_llama llama1b_4seq_fp8_tensorwise --tokens 8192 --fp8 tensorwise
run_llama llama1b_4seq_fp8_tensorwise_bf16_gather --tokens 8192 --fp8 tensorwise --fp8-all-gather 0
run_llama llama1b_4seq_fp8_rowwise --tokens 8192 --fp8 rowwise
for n in bf16 fp8_tensorwise fp8_tensorwise_bf16_gather fp8_rowwise; do
  python3 -c "import json; j=json.load(open('$R/llama1b_4seq_$n.json')); print('$n', 'step_ms', j.get('step_ms_median'), 'mfu', j.get('mfu'), 'loss_last', j.get('loss_last'), 'peak GiB %.2f' % (j.get('backend_peak_bytes', 0) / 2**30))" 2>&1 | tail -1
done
