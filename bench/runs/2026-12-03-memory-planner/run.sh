#!/usr/bin/env bash
# The memory planner on one H200: the 3.0B Llama shape (dim 3072, 28 layers, 24/8 heads, FFN
# 8192, vocab 32000), bf16, AdamW, clipping, at 6 x 8192 tokens per step (out of GPU memory
# without a plan), with --memory-budget auto and the hand-chosen settings beside it, one call:
#   bash bench/runs/2026-12-03-memory-planner/run.sh [ROW...]   (default: every row)
# Each row trains 10 steps, timed after 3; it records the plan line, peak_mem_bytes (the pool's
# peak), predicted_peak_bytes (the memory model's) and step_ms_median. The rows:
#   auto            --memory-budget auto (the planner chooses every setting)
#   none_6mb        6 micro-batches of 8192, no checkpointing
#   none_3mb        3 micro-batches of 2 x 8192, no checkpointing
#   selective_2mb   2 micro-batches of 3 x 8192, selective checkpointing
#   full_1mb        one batch of 6 x 8192, full checkpointing
#   every2_2mb      2 micro-batches, every other block checkpointed
set -u
source bench/gpu_call.sh
gpu_call_begin memory-planner fsdp_tool
SHAPE="--layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 --seq-len 8192 --vocab 32000"
RECIPE="--lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 3"
row() {  # NAME FLAGS...
  local name=$1
  shift
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --model transformer $SHAPE --tokens 49152
             --steps 10 --warmup 3 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 $RECIPE
             --optimizer-in-backward 0 "$@" --quiet --json "$R/$name.json")
  echo "${cmd[*]}" > "$R/$name.cmd"
  timeout "${ROW_TIMEOUT:-110}" "${cmd[@]}" > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(grep -m1 '^memory plan' "$R/$name.log") $(tail -1 "$R/$name.log")"
}
declare -A FLAGS=(
  [auto]="--memory-budget auto"
  [none_6mb]="--micro-batches 6 --activation-checkpointing none"
  [none_3mb]="--micro-batches 3 --activation-checkpointing none"
  [selective_2mb]="--micro-batches 2 --activation-checkpointing selective"
  [full_1mb]="--micro-batches 1 --activation-checkpointing full"
  [every2_2mb]="--micro-batches 2 --activation-checkpointing every:2")
[ $# -gt 0 ] && ROWS=("$@") || ROWS=(auto none_6mb none_3mb selective_2mb full_1mb every2_2mb)
for f in "${ROWS[@]}"; do row "$f" ${FLAGS[$f]}; done
for f in "${ROWS[@]}"; do
  python3 -c "import json; j=json.load(open('$R/$f.json')); print('$f', {k: j.get(k) for k in ('memory_plan', 'step_ms_median', 'peak_mem_bytes', 'predicted_peak_bytes', 'micro_batches', 'activation_checkpointing', 'mfu', 'error')})" 2>&1 | tail -1
done
