#!/usr/bin/env bash
# One H200, one short device call: the 3.0B shape at 2 x 8192 tokens in bf16 and with
# --fp8 tensorwise on the tree where tensorwise keeps X^T's codes for the weight grad (the
# target: fp8 at >= 1.30x bf16's tokens/s in the same call), first; then llama1b at 4 x 2048
# tokens in both, as the call's time allows. Only the fsdp binary is built, to keep it short.
#   bash bench/runs/2026-12-07-fp8-3b-h200/run.sh
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-3b-h200 fsdp_tool
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
ROW_TIMEOUT=70
run_3b b3_none --fp8 none
run_3b b3_tensorwise --fp8 tensorwise
for f in b3_none b3_tensorwise; do
  python3 -c "import json; j=json.load(open('$R/$f.json')); print('$f', {k: j.get(k) for k in ('step_ms_median', 'peak_mem_bytes', 'predicted_peak_bytes', 'mfu', 'loss_last')})" 2>&1 | tail -1
done
run_llama l1b_none --tokens 8192 --fp8 none
run_llama l1b_tensorwise --tokens 8192 --fp8 tensorwise
# --memory-budget auto's budget, from the memory a fresh process finds free on the card.
run_llama l1b_auto --tokens 8192 --memory-budget auto
grep -h "memory plan" "$R/l1b_auto.log"
# Last, as the call's time allows: the GPU test of that budget.
cmake --build build-gpu -j16 --target fsdp_gpu_tests > "$R/gpu_tests_build.log" 2>&1
echo "gpu tests build rc=$? at $((SECONDS - T0)) s"
build-gpu/fsdp_gpu_tests --gtest_filter='CudaMemoryBudget.*' > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$?: $(tail -1 "$R/gpu_tests.log")"
