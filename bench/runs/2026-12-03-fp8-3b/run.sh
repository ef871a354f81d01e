#!/usr/bin/env bash
# fp8 on the 3.0B shape (dim 3072, 28 layers, 24/8 heads, FFN 8192) at 2 x 8192 tokens, one
# H200, no activation checkpointing: --fp8 none against tensorwise (about 3 minutes):
#   bash bench/runs/2026-12-03-fp8-3b/run.sh
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-3b fsdp_tool
SHAPE="--layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 --seq-len 8192 --tokens 16384 \
--steps 10 --warmup 3"
run_llama b3_bf16 $SHAPE --fp8 none
run_llama b3_fp8_tensorwise $SHAPE --fp8 tensorwise
