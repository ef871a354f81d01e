#!/usr/bin/env bash
# fp8 against bf16 over 1000 steps of llama1b on the corpus, one H200 (about 4 minutes):
#   bash bench/runs/2026-12-03-fp8-convergence/run.sh
# llama1b (the shape of bench/gpu_call.sh's LLAMA1B) at 2 x 2048 tokens a step (4.1M tokens, 1.4 passes over
# data/pydocs-4k's training tokens), 50 warm-up steps of the learning rate, then cosine to
# 3e-5; the validation loss every 50 steps over 8 batches. Rows: bf16, --fp8 tensorwise,
# --fp8 rowwise; same seed, same batches. The check: every validation loss of an fp8 row is
# within 1.5% of bf16's at the same step.
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-convergence fsdp_tool
SHAPE="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632"
run_convergence 200 bf16 $SHAPE
run_convergence 200 fp8_tensorwise $SHAPE --fp8 tensorwise
run_convergence 200 fp8_rowwise $SHAPE --fp8 rowwise
python3 bench/val_loss_gaps.py "$R" bf16 fp8_tensorwise fp8_rowwise
