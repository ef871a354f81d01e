#!/usr/bin/env bash
# fp8 against bf16 over 1000 steps of the 3.0B shape on the corpus, one GPU (about 7 minutes on
# an H100):
#   bash bench/runs/2026-12-07-fp8-convergence-3b/run.sh
# The recipe of bench/runs/2026-12-03-fp8-convergence (llama1b) with the 3.0B shape (dim 3072,
# 28 layers, 24/8 heads, FFN 8192, vocab 32000): 2 x 2048 tokens a step, 50 warm-up steps of
# the learning rate, then cosine to 3e-5; the validation loss every 50 steps over 8 batches.
# Rows: bf16 and --fp8 tensorwise; same seed, same batches. The check: every validation loss
# of the fp8 row is within 1.5% of bf16's at the same step.
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-convergence-3b fsdp_tool
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
SHAPE="--model transformer --layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192"
run_convergence 260 bf16 $SHAPE
run_convergence 260 fp8_tensorwise $SHAPE --fp8 tensorwise
python3 bench/val_loss_gaps.py "$R" bf16 fp8_tensorwise
