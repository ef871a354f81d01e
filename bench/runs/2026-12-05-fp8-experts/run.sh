#!/usr/bin/env bash
# One GPU, one device call: the fp8 and MoE GPU tests (the fp8 experts' CUDA-against-CPU test
# among them); the MoE benchmark's ours_k1_sep0 row in bf16 and with --fp8 tensorwise, whose
# experts now run in fp8; the 3.0B shape in bf16 and with --fp8 tensorwise, each with the
# heuristic's GEMM algorithms and with FSDP_GEMM_AUTOTUNE=1 (fp8 plans now autotune too).
#   bash bench/runs/2026-12-05-fp8-experts/run.sh
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-experts fsdp_tool fsdp_gpu_tests
timeout 150 build-gpu/fsdp_gpu_tests --gtest_filter='*Fp8*:*CudaMoe*' > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at $((SECONDS - T0)) s: $(grep -E '^\[  (PASSED|FAILED)' "$R/gpu_tests.log" | tr '\n' ' ')"
grep "fp8 experts" "$R/gpu_tests.log"
for recipe in none tensorwise; do
  mkdir -p "$R/moe_$recipe"
  STEPS=30 ROWS=ours_k1_sep0 OURS_FLAGS="--fp8 $recipe" timeout 100 bash bench/run_moe_bench.sh \
    "$R/moe_$recipe" > "$R/moe_$recipe.log" 2>&1
  echo "moe $recipe rc=$? at $((SECONDS - T0)) s"; tail -1 "$R/moe_$recipe/moe_rows.md"
done
ROW_TIMEOUT=70
run_3b b3_none --fp8 none
run_3b b3_tensorwise --fp8 tensorwise
FSDP_RUN_ENV=FSDP_GEMM_AUTOTUNE=1 run_3b b3_none_autotune --fp8 none
FSDP_RUN_ENV=FSDP_GEMM_AUTOTUNE=1 run_3b b3_tensorwise_autotune --fp8 tensorwise
for f in b3_none b3_tensorwise b3_none_autotune b3_tensorwise_autotune moe_none/ours_k1_sep0 moe_tensorwise/ours_k1_sep0; do
  python3 -c "import json; j=json.load(open('$R/$f.json')); print('$f', {k: j.get(k) for k in ('step_ms_median', 'peak_mem_bytes', 'mfu', 'loss_last')})" 2>&1 | tail -1
done
