#!/usr/bin/env bash
# Activation checkpointing on one H200: the 3.0B Llama shape (dim 3072, 28 layers, 24/8 heads,
# FFN 8192, vocab 32000) at 2 x 8192 tokens, bf16, AdamW, clipping; ours with
# --activation-checkpointing none, full and selective, beside PyTorch FSDP2 without and with
# per-block checkpointing (bench/torch_llama.py --activation-checkpointing full), one call:
#   bash bench/runs/2026-12-02-activation-checkpointing/run.sh
# (first the GPU tests of checkpointing: tests/gpu/test_cuda_activation_checkpointing.cpp)
set -u
source bench/gpu_call.sh
gpu_call_begin activation-checkpointing fsdp_tool fsdp_gpu_tests
timeout 120 build-gpu/fsdp_gpu_tests --gtest_filter='*ctivation*' > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$R/gpu_tests.log" | tr '\n' ' ')"
SHAPE="--layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 --seq-len 8192 --vocab 32000"
RECIPE="--lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5"
ours() {  # NAME POLICY
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --model transformer $SHAPE --tokens 16384
             --steps 15 --warmup 5 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 $RECIPE
             --optimizer-in-backward 0 --activation-checkpointing "$2" --quiet --json "$R/$1.json")
  echo "${cmd[*]}" > "$R/$1.cmd"
  timeout 150 "${cmd[@]}" > "$R/$1.log" 2>&1
  echo "$1 rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/$1.log")"
}
torch_row() {  # NAME POLICY
  local cmd=(python3 bench/torch_llama.py --data data/pydocs-4k/train.bin $SHAPE --batch 2 --steps 15
             --bench-warmup 5 $RECIPE --param-dtype bf16 --activation-checkpointing "$2" --log-every 5
             --out "$R/$1.json")
  echo "${cmd[*]}" > "$R/$1.cmd"
  timeout 200 "${cmd[@]}" > "$R/$1.log" 2>&1
  echo "$1 rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/$1.log")"
}
ours ours_none none
ours ours_full full
ours ours_selective selective
torch_row torch_none none
torch_row torch_full full
for f in ours_none ours_full ours_selective torch_none torch_full; do
  python3 -c "import json; j=json.load(open('$R/$f.json')); print('$f', {k: j.get(k) for k in ('step_ms_median', 'peak_mem_bytes', 'mfu', 'tokens_per_s')})" 2>&1 | tail -1
done
