#!/usr/bin/env bash
# The optimizer offload (docs/memory.md, "Optimizer offload") on one H200:
#   bash bench/runs/2026-12-03-offload/run.sh
#  1. the offload's GPU tests (tests/gpu/test_cuda_optimizer_offload.cpp): the device and the
#     offloaded optimizer agree within rounding, the peak is lower, a host limit is one line;
#  2. CUDA vs CPU: the same small run with --offload optimizer on both backends (losses side by
#     side);
#  3. the Llama-3.1-8B shape (32 x 4096, 32/8 heads, FFN 14336, vocab 32000, 4096 tokens, bf16)
#     with --offload optimizer --activation-checkpointing full, 6 steps, 2 of them
#     warm-up, traced (the host steps on their own track, the transfers on theirs);
#  4. the same shape without the offload: refused (out of memory, one line) or, if it fits, its
#     two steps for comparison (`fsdp simulate` predicts it fits: 111.6 GiB, 507 ms a step,
#     against 57.6 GiB and 2876 ms with the offload; docs/memory.md).
# About 8 minutes: the build, then about 6 (the 8B runs spend most of theirs making and
# pinning the model's state).
set -u
source bench/gpu_call.sh
gpu_call_begin offload fsdp_tool fsdp_gpu_tests
timeout 90 build-gpu/fsdp_gpu_tests --gtest_filter='CudaOptimizerOffload.*' > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at $((SECONDS - T0)) s"; grep -E "^\[  (PASSED|FAILED) |^peak" "$R/gpu_tests.log"

SMALL="--model transformer --layers 4 --dim 256 --heads 4 --kv-heads 2 --seq-len 128 --vocab 512 \
--tokens 1024 --param-dtype fp32 --steps 6 --warmup 1 --quiet --offload optimizer"
for backend in cuda cpu; do
  extra=$([ $backend = cuda ] && echo "--nproc 1" || echo "--world-size 1")
  timeout 60 build-gpu/fsdp train --backend $backend $extra $SMALL --json "$R/small_$backend.json" \
    > "$R/small_$backend.log" 2>&1
  echo "small $backend rc=$? at $((SECONDS - T0)) s"
done
python3 - "$R" <<'PY'
import json, sys
r = sys.argv[1]
a, b = (json.load(open(f"{r}/small_{k}.json")) for k in ("cuda", "cpu"))
for i, (x, y) in enumerate(zip(a["losses"], b["losses"])):
    print(f"step {i + 1}: cuda {x:.6f} cpu {y:.6f} rel {abs(x - y) / abs(y):.2e}")
PY

run_llama8b_offload "${OFFLOAD_TIMEOUT:-200}"

cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 2 --warmup 0 $L8B
     --json "$R/llama8b_device.json")
echo "${cmd[*]}" > "$R/llama8b_device.cmd"
timeout "${DEVICE_TIMEOUT:-120}" "${cmd[@]}" > "$R/llama8b_device.log" 2>&1
echo "llama8b without offload rc=$? at $((SECONDS - T0)) s: lines $(grep -c . "$R/llama8b_device.log")"
tail -2 "$R/llama8b_device.log"
python3 -c "import json; j=json.load(open('$R/llama8b_device.json')); print({k: j.get(k) for k in ('error', 'peak_mem_bytes', 'step_ms_median')})" 2>&1 | tail -1
