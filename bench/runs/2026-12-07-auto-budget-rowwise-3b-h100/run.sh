#!/usr/bin/env bash
# One H100, one device call:
#  1. the GPU test of --memory-budget auto's free-memory start, and the plan line it prints for
#     llama1b and for the 3.0B shape at 2 x 8192 tokens (which does not fit an H100 without a plan);
#  2. --fp8 rowwise over the 1000 steps of the 3.0B convergence recipe. Its baseline is the bf16
#     row committed in bench/runs/2026-12-07-fp8-convergence-3b (same recipe, seed and batches,
#     one H100), copied in as bf16.json: this call has no time to run it again.
#   bash bench/runs/2026-12-07-auto-budget-rowwise-3b-h100/run.sh
set -u
source bench/gpu_call.sh
gpu_call_begin auto-budget-rowwise-3b-h100 fsdp_tool fsdp_gpu_tests
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
timeout 60 build-gpu/fsdp_gpu_tests --gtest_filter='CudaMemoryBudget.*' > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at $((SECONDS - T0)) s: $(grep -E '^\[  (PASSED|FAILED)' "$R/gpu_tests.log" | tr '\n' ' ')"
run_llama l1b_auto --tokens 8192 --memory-budget auto
ROW_TIMEOUT=80 run_3b b3_auto --memory-budget auto
grep -h "memory plan" "$R/l1b_auto.log" "$R/b3_auto.log"
python3 -c "import json; j=json.load(open('$R/b3_auto.json')); print('b3_auto', {k: j.get(k) for k in ('step_ms_median', 'peak_mem_bytes', 'predicted_peak_bytes', 'mfu', 'loss_last')})" 2>&1 | tail -1
SHAPE="--model transformer --layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192"
run_convergence 300 fp8_rowwise $SHAPE --fp8 rowwise
cp bench/runs/2026-12-07-fp8-convergence-3b/bf16.json "$R/bf16.json"
python3 bench/val_loss_gaps.py "$R" bf16 fp8_rowwise
