#!/usr/bin/env bash
# The Llama-3.2-1B shape on one H200 (world_size 1), ours beside PyTorch FSDP2 eager and
# torch.compile (bench/torch_llama.py) in the same call, the same model math:
#   bash bench/runs/2026-12-03-llama32-1b/run.sh
# 16 layers, dim 2048, 32/8 heads (head_dim 64), FFN 8192, vocab 128256, tied embedding and
# head, RoPE theta 500000, 4 x 2048 tokens per rank, bf16 params, fp32 reduce, AdamW (lr 3e-4 ->
# 3e-5 cosine, 5 warm-up steps, weight decay 0.1), clipping 1.0, 20 steps timed after 5. Llama
# 3.2's "llama3" RoPE scaling changes only the inverse-frequency table (no time), and
# torch_llama.py has none, so neither row uses it. Then a traced step of ours, its device time by
# op (bench/trace_op_totals.py: what the head and the cross-entropy take), and the Hugging Face
# parity runs (bench/hf_parity.py, 200 trained steps each). ROWS_ONLY=1 runs the three timed rows
# alone.
set -u
source bench/gpu_call.sh
gpu_call_begin llama32-1b fsdp_tool
SHAPE="--layers 16 --dim 2048 --heads 32 --kv-heads 8 --ffn-dim 8192 --seq-len 2048 --vocab 128256 --rope-theta 500000"
LLAMA1B="--model transformer $SHAPE --tie-embeddings --param-dtype bf16 --data data/pydocs-4k \
--eval-every 0 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 \
--optimizer-in-backward 0"
run_llama ours4 --tokens 8192
if [ -z "${ROWS_ONLY:-}" ]; then  # ROWS_ONLY=1: the three timed rows alone
  run_llama ours4_traced --tokens 8192 --trace "$R/ours4.trace.json"
  python3 bench/trace_op_totals.py "$R/ours4.trace.json" --top 30 > "$R/ours4_ops.txt" 2>&1
  head -40 "$R/ours4_ops.txt"
fi
torch_row() {  # NAME [--compile]
  local name=$1
  shift
  local cmd=(python3 bench/torch_llama.py --data data/pydocs-4k/train.bin $SHAPE --tie-embeddings
             --batch 4 --steps 20 --bench-warmup 5 --warmup-steps 5 --lr 3e-4 --min-lr 3e-5
             --weight-decay 0.1 --clip-grad-norm 1.0 --param-dtype bf16 "$@" --log-every 5
             --out "$R/$name.json")
  echo "${cmd[*]}" > "$R/$name.cmd"
  PYTHONUNBUFFERED=1 timeout 200 "${cmd[@]}" > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/$name.log")"
}
torch_row torch4
torch_row compile4 --compile
python3 - "$R" <<'PY'
import json, sys
r = sys.argv[1]
for name in ("ours4", "torch4", "compile4"):
    try:
        j = json.load(open(f"{r}/{name}.json"))
    except (OSError, ValueError) as e:
        print(f"{name}: no summary ({e})"); continue
    ms = j.get("step_ms_median")
    print(f"{name}: step_ms_median {ms}, tokens/s {8192 / (ms * 1e-3) if ms else None:.0f}, "
          f"peak GiB {j.get('peak_mem_bytes', 0) / 2**30:.2f}, mfu {j.get('mfu')}, "
          f"loss {j.get('losses', [None])[0]} -> {j.get('losses', [None])[-1]}")
PY
[ -n "${ROWS_ONLY:-}" ] && exit 0
PYTHONUNBUFFERED=1 timeout 200 python3 bench/hf_parity.py --fsdp build-gpu/fsdp --out /tmp/hf_parity \
  --train-steps 200 > "$R/hf_parity.log" 2>&1
echo "hf_parity rc=$? at $((SECONDS - T0)) s"; grep -E " ok | FAIL|error" "$R/hf_parity.log"
