#!/usr/bin/env bash
# The grad shards freed after each optimizer step (--zero-grad-set-to-none, on by default), one
# H200, one call (about 9 minutes):
#   bash bench/runs/2026-12-04-grads-set-to-none/run.sh
#  1. the GPU test suite;
#  2. the 3.0B Llama shape (dim 3072, 28 layers, 24/8 heads, FFN 8192, vocab 32000) at 2 x 8192
#     tokens, bf16, AdamW, clipping, 12 steps timed after 4, as in
#     2026-12-02-activation-checkpointing: ours with --activation-checkpointing none, full and
#     selective (the grads freed), full with the grads kept (--zero-grad-set-to-none 0), and
#     PyTorch FSDP2 with checkpoint_wrapper per block (its zero_grad(set_to_none=True)).
set -u
source bench/gpu_call.sh
gpu_call_begin grads-set-to-none fsdp_tool fsdp_gpu_tests
timeout 170 build-gpu/fsdp_gpu_tests > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at $((SECONDS - T0)) s: $(grep -E '^\[  (PASSED|FAILED)' "$R/gpu_tests.log" | tr '\n' ' ')"
SHAPE="--layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 --seq-len 8192 --vocab 32000"
RECIPE="--lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 4"
ours() {  # NAME POLICY [FLAGS]
  local name=$1 policy=$2
  shift 2
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --model transformer $SHAPE --tokens 16384
             --steps 12 --warmup 4 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 $RECIPE
             --optimizer-in-backward 0 --activation-checkpointing "$policy" "$@" --quiet
             --json "$R/$name.json")
  echo "${cmd[*]}" > "$R/$name.cmd"
  timeout 100 "${cmd[@]}" > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/$name.log")"
}
ours ours_none none
ours ours_full full
ours ours_selective selective
ours ours_full_kept full --zero-grad-set-to-none 0
cmd=(python3 bench/torch_llama.py --data data/pydocs-4k/train.bin $SHAPE --batch 2 --steps 12
     --bench-warmup 4 $RECIPE --param-dtype bf16 --activation-checkpointing full --log-every 4
     --out "$R/torch_full.json")
echo "${cmd[*]}" > "$R/torch_full.cmd"
timeout 150 "${cmd[@]}" > "$R/torch_full.log" 2>&1
echo "torch_full rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/torch_full.log")"
for f in ours_none ours_full ours_selective ours_full_kept torch_full; do
  python3 -c "import json; j=json.load(open('$R/$f.json')); print('$f', {k: j.get(k) for k in ('step_ms_median', 'peak_mem_bytes', 'predicted_peak_bytes', 'mfu', 'loss_last', 'zero_grad_set_to_none')})" 2>&1 | tail -1
done
