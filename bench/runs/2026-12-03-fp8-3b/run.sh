#!/usr/bin/env bash
# fp8 on the 3.0B shape (dim 3072, 28 layers, 24/8 heads, FFN 8192) at 2 x 8192 tokens, one
# H200, no activation checkpointing: --fp8 none against tensorwise (about 3 minutes):
#   bash bench/runs/2026-12-03-fp8-3b/run.sh
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-3b fsdp_tool
# run_llama's llama1b flags with the 3.0B's shape in their place (each flag once).
LLAMA1B="--model transformer --layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 \
--seq-len 8192 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 --lr 3e-4 \
--min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0"
run_llama b3_bf16 --tokens 16384 --fp8 none
run_llama b3_fp8_tensorwise --tokens 16384 --fp8 tensorwise
