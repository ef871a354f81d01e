#!/usr/bin/env bash
# The largest model that trains on one H200 (141 GB GPU, 128 GiB host), one call (about 8
# minutes):
#   bash bench/runs/2026-12-04-largest-offload/run.sh
#  1. cuDNN's causal attention at the 3.0B shape's heads (2 x 8192 tokens, 24 q heads of 128),
#     with 8 kv heads (GQA, as trained) and with 24 (MHA): what GQA costs the backward;
#  2. a 9.8B Llama shape (34 layers, dim 5120, 40/8 heads, FFN 13824, vocab 32000) at 4096
#     tokens, bf16, full checkpointing, --offload optimizer: 5 steps after 2, traced
#     (bench/trace_tracks.py). Its host state is 9.8B x 12 bytes = 117 GB. If it is refused
#     (host memory), the same width with 30 layers (8.7B) runs instead;
#  3. the 9.8B without offload: `fsdp simulate` predicts 148.9 GiB, more than the GPU has; the
#     run's own line says what happens;
#  4. the 3.0B shape at 1 x 4096 tokens as in 2026-12-04-host-adamw, with the optimizer on the
#     device, to set its losses beside that run's --offload optimizer row.
set -u
source bench/gpu_call.sh
gpu_call_begin largest-offload fsdp_tool attention_bench
for kv in 8 24; do
  timeout 60 build-gpu/bench/attention_bench 2 8192 20 24 $kv 128 > "$R/attention_kv$kv.log" 2>&1
  echo "attention kv $kv rc=$?"; cat "$R/attention_kv$kv.log"
done

big() {  # NAME LAYERS TIMEOUT EXTRA...
  local name=$1 layers=$2 limit=$3
  shift 3
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --model transformer --layers $layers
             --dim 5120 --heads 40 --kv-heads 8 --ffn-dim 13824 --vocab 32000 --seq-len 4096
             --tokens 4096 --param-dtype bf16 --activation-checkpointing full
             --optimizer-in-backward 0 --clip-grad-norm 0 "$@" --json "$R/$name.json")
  echo "${cmd[*]}" > "$R/$name.cmd"
  timeout "$limit" "${cmd[@]}" > "$R/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc at $((SECONDS - T0)) s"; tail -3 "$R/$name.log"
  return $rc
}
if big l34_offload 34 "${OFFLOAD_TIMEOUT:-230}" --steps 7 --warmup 2 --offload optimizer \
     --trace "$R/l34_offload.trace.json"; then
  python3 bench/trace_tracks.py "$R/l34_offload.trace.json" "$R/l34_offload.json" 2>&1 | tail -8
  gzip -9 "$R/l34_offload.trace.json"
else
  big l30_offload 30 "${OFFLOAD_TIMEOUT:-230}" --steps 7 --warmup 2 --offload optimizer
fi
big l34_device 34 "${DEVICE_TIMEOUT:-90}" --steps 3 --warmup 1
python3 -c "import json; j=json.load(open('$R/l34_device.json')); print({k: j.get(k) for k in ('error', 'peak_mem_bytes', 'step_ms_median')})" 2>&1 | tail -1

S3B="--layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 --seq-len 4096 --vocab 32000"
TRAIN="--lr 3e-4 --min-lr 3e-5 --warmup-steps 3 --weight-decay 0.1 --clip-grad-norm 1.0 --param-dtype bf16 \
--activation-checkpointing full"
cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --model transformer $S3B $TRAIN --tokens 4096
     --steps 10 --warmup 3 --data data/pydocs-4k --eval-every 0 --optimizer-in-backward 0
     --quiet --json "$R/s3b_device_ours.json")
echo "${cmd[*]}" > "$R/s3b_device_ours.cmd"
timeout 120 "${cmd[@]}" > "$R/s3b_device_ours.log" 2>&1
echo "s3b device rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/s3b_device_ours.log")"
python3 -c "import json; j=json.load(open('$R/s3b_device_ours.json')); print(j.get('losses'))" 2>&1 | tail -1
