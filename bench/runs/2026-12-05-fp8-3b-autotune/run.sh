#!/usr/bin/env bash
# One H200, one device call (the 3.0B shape's bf16 row does not fit an H100's 80 GB): the
# 3.0B shape in bf16 and with --fp8 tensorwise, with the heuristic's GEMM algorithms and with
# FSDP_GEMM_AUTOTUNE=1 (fp8 plans now autotune too); the MoE benchmark's ours_k1_sep0 row in
# bf16 and with --fp8 tensorwise (its experts in fp8); the fp8 and MoE GPU tests; and the 3.0B
# rows again with --reshard-after-forward 0; llama1b at 4 x 2048 tokens in bf16 and with
# --fp8 tensorwise. Tensorwise fp8's forward now keeps X^T's codes for the weight grad.
#   bash bench/runs/2026-12-05-fp8-3b-autotune/run.sh
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-3b-autotune fsdp_tool fsdp_gpu_tests
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 100 build-gpu/fsdp_gpu_tests --gtest_filter='*Fp8*:*CudaMoe*' > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at $((SECONDS - T0)) s: $(grep -E '^\[  (PASSED|FAILED)' "$R/gpu_tests.log" | tr '\n' ' ')"
ROW_TIMEOUT=80
run_3b b3_none --fp8 none
run_3b b3_tensorwise --fp8 tensorwise
FSDP_RUN_ENV=FSDP_GEMM_AUTOTUNE=1 run_3b b3_none_autotune --fp8 none
FSDP_RUN_ENV=FSDP_GEMM_AUTOTUNE=1 run_3b b3_tensorwise_autotune --fp8 tensorwise
# On one rank a block's backward all-gather only casts its shard again: kept gathered instead.
run_3b b3_none_raf0 --fp8 none --reshard-after-forward 0
run_3b b3_tensorwise_raf0 --fp8 tensorwise --reshard-after-forward 0
for recipe in none tensorwise; do
  mkdir -p "$R/moe_$recipe"
  STEPS=30 ROWS=ours_k1_sep0 OURS_FLAGS="--fp8 $recipe" timeout 100 bash bench/run_moe_bench.sh \
    "$R/moe_$recipe" > "$R/moe_$recipe.log" 2>&1
  echo "moe $recipe rc=$? at $((SECONDS - T0)) s"
done
run_llama l1b_none --tokens 8192 --fp8 none
run_llama l1b_tensorwise --tokens 8192 --fp8 tensorwise
for f in l1b_none l1b_tensorwise b3_none b3_tensorwise b3_none_autotune b3_tensorwise_autotune b3_none_raf0 b3_tensorwise_raf0 moe_none/ours_k1_sep0 moe_tensorwise/ours_k1_sep0; do
  python3 -c "import json; j=json.load(open('$R/$f.json')); print('$f', {k: j.get(k) for k in ('step_ms_median', 'peak_mem_bytes', 'mfu', 'loss_last')})" 2>&1 | tail -1
done
