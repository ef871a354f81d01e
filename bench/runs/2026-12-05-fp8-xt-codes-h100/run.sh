#!/usr/bin/env bash
# One H100 (no H200 was lent), one device call, after tensorwise fp8's forward began keeping
# X^T's codes for the weight grad: the fp8 GPU tests; llama1b at 4 x 2048 tokens in bf16 and
# with --fp8 tensorwise; the 3.0B shape at 1 x 8192 tokens (2 x 8192 does not fit an H100 in
# bf16) in bf16 and with --fp8 tensorwise. H100 numbers stand only beside each other.
#   bash bench/runs/2026-12-05-fp8-xt-codes-h100/run.sh
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-xt-codes-h100 fsdp_tool fsdp_gpu_tests
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 120 build-gpu/fsdp_gpu_tests --gtest_filter='*Fp8*:*fp8*:*FusedAmax*:*CudaMoe*' > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at $((SECONDS - T0)) s: $(grep -E '^\[  (PASSED|FAILED)' "$R/gpu_tests.log" | tr '\n' ' ')"
run_llama l1b_none --tokens 8192 --fp8 none
run_llama l1b_tensorwise --tokens 8192 --fp8 tensorwise
ROW_TIMEOUT=80
SHAPE_3B_TOKENS=8192 run_3b b3_8k_none --fp8 none
SHAPE_3B_TOKENS=8192 run_3b b3_8k_tensorwise --fp8 tensorwise
for f in l1b_none l1b_tensorwise b3_8k_none b3_8k_tensorwise; do
  python3 -c "import json; j=json.load(open('$R/$f.json')); print('$f', {k: j.get(k) for k in ('step_ms_median', 'peak_mem_bytes', 'predicted_peak_bytes', 'mfu', 'loss_last')})" 2>&1 | tail -1
done
