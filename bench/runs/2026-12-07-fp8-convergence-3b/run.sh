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
ARGS="--model transformer --layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 \
--seq-len 2048 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --lr 3e-4 --min-lr 3e-5 \
--weight-decay 0.1 --clip-grad-norm 1.0 --optimizer-in-backward 0 --tokens 4096 \
--warmup-steps 50 --eval-every 50 --eval-batches 8"
row() {  # NAME ARGS...
  local name=$1
  shift
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 1000 --warmup 5 --quiet $ARGS "$@"
             --json "$R/$name.json")
  echo "${cmd[*]}" > "$R/$name.cmd"
  timeout 260 "${cmd[@]}" > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/$name.log")"
}
row bf16
row fp8_tensorwise --fp8 tensorwise
python3 - "$R" <<'PY'
import json, sys
r = sys.argv[1]
runs = {k: json.load(open(f"{r}/{k}.json")) for k in ("bf16", "fp8_tensorwise")}
base = {v["step"]: v["loss"] for v in runs["bf16"]["val_losses"]}
for k, j in runs.items():
    worst = max((abs(v["loss"] - base[v["step"]]) / base[v["step"]] for v in j["val_losses"]
                 if v["step"] in base), default=float("nan"))
    print(f"{k}: step_ms_median {j['step_ms_median']:.2f} final val {j['val_losses'][-1]['loss']:.4f} "
          f"worst val rel diff vs bf16 {worst:.4%} over {len(j['val_losses'])} evaluations "
          f"peak {j.get('peak_mem_bytes')}")
PY
