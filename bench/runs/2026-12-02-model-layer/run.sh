#!/usr/bin/env bash
# The model layer (src/models) and the split trainer on one H200, in two parts that fit one
# device command each (the build stays in build-gpu between them):
#   bash bench/runs/2026-12-02-model-layer/run.sh check   # build; GPU unit tests and the
#                                                         # CUDA-vs-CPU checks (scripts/gpu_check.sh)
#   bash bench/runs/2026-12-02-model-layer/run.sh rows    # llama1b at 4 and 1 sequences (eager);
#       PyTorch FSDP2's own all-gather counts for the root-reshard cases
#       (bench/torch_fsdp2_counts.py); the tokenizer check against the tokenizers package
set -u
part=${1:?usage: run.sh check|rows}
source bench/gpu_call.sh
if [ "$part" = check ]; then
  gpu_call_begin model-layer-check fsdp_tool fsdp_tests fsdp_gpu_tests
  nvidia-smi -L > "$R/gpus.txt" 2>&1
  FSDP_BUILD_DIR=build-gpu timeout 400 scripts/gpu_check.sh "$R/gpu_check" > "$R/gpu_check.log" 2>&1
  echo "gpu_check rc=$? at $((SECONDS - T0)) s"
  grep -hE '^\[  (PASSED|FAILED)|^(PASS|FAIL) ' "$R/gpu_check/gpu_tests.log" "$R/gpu_check.log" | head -30
  exit 0
fi
gpu_call_begin model-layer-rows fsdp_tool
run_llama llama1b_4seq --tokens 8192
run_llama llama1b_1seq --tokens 2048
for f in llama1b_4seq llama1b_1seq; do
  python3 -c "import json; j=json.load(open('$R/$f.json')); print('$f', {k: j.get(k) for k in ('step_ms_median', 'peak_mem_bytes', 'mfu', 'tokens_per_s')})" 2>&1 | tail -1
done
timeout 120 torchrun --standalone --nproc_per_node=2 bench/torch_fsdp2_counts.py > "$R/fsdp2_counts.log" 2>&1
echo "fsdp2 counts rc=$?"; tail -12 "$R/fsdp2_counts.log"
if [ -f tests/fixtures/tokenizer/make_expected.py ]; then
  timeout 120 python3 tests/fixtures/tokenizer/make_expected.py "$R/tokenizer" --fsdp build-gpu/fsdp > "$R/tokenizer.log" 2>&1
  echo "tokenizer rc=$?"; tail -3 "$R/tokenizer.log"
fi
