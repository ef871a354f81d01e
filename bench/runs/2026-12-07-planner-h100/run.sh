#!/usr/bin/env bash
# One H100 (80 GB), one device call, after the planner began to price micro-batches' fp32
# accumulator traffic: the 3.0B shape at 2 x 8192 tokens with --memory-budget auto (the plan
# now recomputes one block of 28), and in the same call, by hand, selective checkpointing and
# 2 micro-batches (the old plan).
#   bash bench/runs/2026-12-07-planner-h100/run.sh
set -u
source bench/gpu_call.sh
gpu_call_begin planner-h100 fsdp_tool
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
ROW_TIMEOUT=100
run_3b b3_auto --fp8 none --memory-budget auto
grep -h "memory plan" "$R/b3_auto.log" | head -2
run_3b b3_selective --fp8 none --activation-checkpointing selective
run_3b b3_mb2 --fp8 none --micro-batches 2
for f in b3_auto b3_selective b3_mb2; do
  python3 -c "import json; j=json.load(open('$R/$f.json')); print('$f', {k: j.get(k) for k in ('step_ms_median', 'peak_mem_bytes', 'predicted_peak_bytes', 'memory_plan', 'mfu', 'loss_last')})" 2>&1 | tail -1
done
