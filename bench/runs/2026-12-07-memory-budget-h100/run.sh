#!/usr/bin/env bash
# One H100 (80 GB), one device call: does `--memory-budget auto` make the 3.0B shape at
# 2 x 8192 tokens train on a card where bf16 without checkpointing does not fit
# (bench/runs/2026-12-05-fp8-experts), and how does its step compare with the settings chosen
# by hand? The 3.0B shape in bf16 with --memory-budget auto, with selective and with full
# checkpointing; and with --fp8 tensorwise under --memory-budget auto.
#   bash bench/runs/2026-12-07-memory-budget-h100/run.sh
set -u
source bench/gpu_call.sh
gpu_call_begin memory-budget-h100 fsdp_tool
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
ROW_TIMEOUT=100
run_3b b3_auto --fp8 none --memory-budget auto
grep -h "memory plan" "$R/b3_auto.log" | head -2
run_3b b3_selective --fp8 none --activation-checkpointing selective
run_3b b3_full --fp8 none --activation-checkpointing full
run_3b b3_tensorwise_auto --fp8 tensorwise --memory-budget auto
grep -h "memory plan" "$R/b3_tensorwise_auto.log" | head -2
for f in b3_auto b3_selective b3_full b3_tensorwise_auto; do
  python3 -c "import json; j=json.load(open('$R/$f.json')); print('$f', {k: j.get(k) for k in ('step_ms_median', 'peak_mem_bytes', 'predicted_peak_bytes', 'memory_plan', 'mfu', 'loss_last')})" 2>&1 | tail -1
done
