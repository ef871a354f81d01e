#!/usr/bin/env bash
# The tree with the model layer, the Hugging Face families, hostile input, activation
# checkpointing and the simulator together, on one H200:
#   bash bench/runs/2026-12-02-merged-tree/run.sh
#  1. the GPU unit tests and the CUDA-vs-CPU parity checks (scripts/gpu_check.sh);
#  2. llama1b at 4 sequences (the headline row), to see that nothing moved;
#  3. llama1b at 56 sequences: out of memory, one line, and the JSON summary's error is the
#     rank's own line;
#  4. Hugging Face parity of trained Llama 3 / Qwen2.5 / Mistral shapes (bench/hf_parity.py).
set -u
source bench/gpu_call.sh
gpu_call_begin merged-tree fsdp_tool fsdp_gpu_tests
FSDP_BUILD_DIR=build-gpu timeout 240 scripts/gpu_check.sh "$R/gpu_check" > "$R/gpu_check.log" 2>&1
echo "gpu_check rc=$? at $((SECONDS - T0)) s"; grep -E "^(PASS|FAIL)|PASSED|FAILED" "$R/gpu_check.log" | head
run_llama llama1b_4seq --tokens 8192
run_llama llama1b_56seq --tokens 114688
echo "lines: $(grep -c . "$R/llama1b_56seq.log")"; tail -2 "$R/llama1b_56seq.log"
python3 -c "import json; j=json.load(open('$R/llama1b_56seq.json')); print({k: j.get(k) for k in ('error', 'failed_step', 'peak_mem_bytes')})" 2>&1 | tail -1
PYTHONUNBUFFERED=1 timeout 200 python3 bench/hf_parity.py --fsdp build-gpu/fsdp --out "$R/hf_parity" \
  --train-steps 200 > "$R/hf_parity.log" 2>&1
echo "hf_parity rc=$? at $((SECONDS - T0)) s"; tail -8 "$R/hf_parity.log"
