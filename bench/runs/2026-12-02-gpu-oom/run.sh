#!/usr/bin/env bash
# Running out of GPU memory on one H200: llama1b at 56 sequences of 2048 tokens, whose
# activations (about 14x the 4-sequence step's) cannot fit; the run must end in one line and
# still write its JSON summary:  bash bench/runs/2026-12-02-gpu-oom/run.sh
set -u
source bench/gpu_call.sh
gpu_call_begin gpu-oom fsdp_tool
run_llama llama1b_56seq --tokens 114688
echo "stderr lines: $(grep -c . "$R/llama1b_56seq.log")"; tail -3 "$R/llama1b_56seq.log"
python3 -c "import json; j=json.load(open('$R/llama1b_56seq.json')); print({k: j.get(k) for k in ('error', 'failed_step', 'peak_mem_bytes')})" 2>&1 | tail -1
