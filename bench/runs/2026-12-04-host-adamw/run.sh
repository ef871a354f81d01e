#!/usr/bin/env bash
# The optimizer offload after the host AdamW vectorized (the library built with
# -fno-math-errno), one H200 (about 8 minutes):
#   bash bench/runs/2026-12-04-host-adamw/run.sh
#  1. the offload's GPU tests;
#  2. the Llama-3.1-8B shape with --offload optimizer and full checkpointing, as in
#     2026-12-03-offload (3589 ms a step there, 3.2 s of it the host AdamW), traced: each
#     track's busy time and its overlap with compute (bench/trace_tracks.py);
#  3. the 3.0B shape (dim 3072, 28 layers, 24/8 heads, FFN 8192, vocab 32000) at 1 x 4096
#     tokens, full checkpointing, AdamW (0.9/0.999, weight decay 0.1), clipping 1.0, 10 steps
#     timed after 3: ours with --offload optimizer beside PyTorch FSDP2 with CPUOffloadPolicy
#     (bench/torch_llama.py --cpu-offload: its params, grads and fused AdamW on the host). The
#     8B shape is not run on FSDP2 here: its fp32 params, grads and AdamW state on the host
#     are 7.24B x 16 bytes = 116 GB of this machine's 128 GiB.
set -u
source bench/gpu_call.sh
gpu_call_begin host-adamw fsdp_tool fsdp_gpu_tests
timeout 90 build-gpu/fsdp_gpu_tests --gtest_filter='CudaOptimizerOffload.*' > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at $((SECONDS - T0)) s"; grep -E "^\[  (PASSED|FAILED) |^peak" "$R/gpu_tests.log"

run_llama8b_offload "${OFFLOAD_TIMEOUT:-170}"
gzip -9 "$R/llama8b_offload.trace.json"

S3B="--layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 --seq-len 4096 --vocab 32000"
TRAIN="--lr 3e-4 --min-lr 3e-5 --warmup-steps 3 --weight-decay 0.1 --clip-grad-norm 1.0 --param-dtype bf16 \
--activation-checkpointing full"
cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --model transformer $S3B $TRAIN --tokens 4096
     --steps 10 --warmup 3 --data data/pydocs-4k --eval-every 0 --optimizer-in-backward 0
     --offload optimizer --quiet --json "$R/s3b_offload_ours.json")
echo "${cmd[*]}" > "$R/s3b_offload_ours.cmd"
timeout 120 "${cmd[@]}" > "$R/s3b_offload_ours.log" 2>&1
echo "s3b ours rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/s3b_offload_ours.log")"
cmd=(python3 bench/torch_llama.py --data data/pydocs-4k/train.bin $S3B $TRAIN --beta2 0.999
     --batch 1 --steps 10 --bench-warmup 3 --cpu-offload --log-every 1 --out "$R/s3b_offload_fsdp2.json")
echo "${cmd[*]}" > "$R/s3b_offload_fsdp2.cmd"
PYTHONUNBUFFERED=1 timeout "${FSDP2_TIMEOUT:-200}" "${cmd[@]}" > "$R/s3b_offload_fsdp2.log" 2>&1
echo "s3b fsdp2 rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/s3b_offload_fsdp2.log")"
python3 - "$R" <<'PY'
import json, sys
for name in ("s3b_offload_ours", "s3b_offload_fsdp2"):
    try:
        j = json.load(open(f"{sys.argv[1]}/{name}.json"))
    except (OSError, ValueError) as e:
        print(name, "no summary:", e); continue
    print(name, {k: j.get(k) for k in ("step_ms_median", "step_ms_mean", "tokens_per_s", "mfu", "peak_mem_bytes", "losses")})
PY
