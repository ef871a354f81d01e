#!/usr/bin/env bash
# Where the 3.0B shape's fp8 step goes, one H200 (about 3 minutes):
#   bash bench/runs/2026-12-04-fp8-3b-trace/run.sh
# The rows of 2026-12-03-fp8-3b (2 x 8192 tokens, no checkpointing, 20 steps after 5), bf16
# and --fp8 tensorwise, each traced; then each trace's device time by op kind
# (bench/trace_op_totals.py), to see what the fp8 step spends beside its GEMMs.
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-3b-trace fsdp_tool
LLAMA1B="--model transformer --layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 \
--seq-len 8192 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 --lr 3e-4 \
--min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0"
for fp8 in none tensorwise; do
  run_llama b3_$fp8 --tokens 16384 --fp8 $fp8 --trace "$R/b3_$fp8.trace.json"
  python3 bench/trace_op_totals.py "$R/b3_$fp8.trace.json" --top 30 > "$R/b3_$fp8.ops.txt" 2>&1
  gzip -9 "$R/b3_$fp8.trace.json"
done
head -40 "$R/b3_tensorwise.ops.txt"
