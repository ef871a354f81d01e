#!/usr/bin/env bash
# The first GPU check of fp8, the optimizer offload and generation, on one H200, in one call
# of about 6 minutes:
#   bash bench/runs/2026-12-03-new-features/run.sh
#  1. their GPU tests: fp8 casts bit for bit against the CPU's and the cuBLASLt fp8 GEMM in every
#     layout (CudaFp8), the offload against the device optimizer (CudaOptimizerOffload), the
#     KV-cache ops against the CPU's (CudaKvCache);
#  2. llama1b at 4 x 2048 tokens, --fp8 none, tensorwise (with the float8 all-gather) and
#     rowwise;
#  3. greedy decoding of 64 tokens against transformers' generate(do_sample=False), fp32, on
#     CUDA (bench/hf_generate_parity.py, 200 trained steps, the prompts as ids);
#  4. a sampled continuation on CUDA, twice with one seed (the same ids expected).
# The outputs committed beside this script are from its run of 2026-12-03 (docs/performance.md).
# bench/runs/2026-12-03-fp8, -offload and -generate hold each feature's longer run (not run yet).
set -u
source bench/gpu_call.sh
gpu_call_begin new-features fsdp_tool fsdp_gpu_tests
timeout 120 build-gpu/fsdp_gpu_tests --gtest_filter='CudaFp8*:CudaOptimizerOffload*:CudaKvCache*' \
  > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at $((SECONDS - T0)) s"; grep -E "^\[  (FAILED|PASSED|  OK)|Failure" "$R/gpu_tests.log" | head -20
run_llama llama1b_4seq_bf16 --tokens 8192 --fp8 none
run_llama llama1b_4seq_fp8_tensorwise --tokens 8192 --fp8 tensorwise
run_llama llama1b_4seq_fp8_rowwise --tokens 8192 --fp8 rowwise
for n in bf16 fp8_tensorwise fp8_rowwise; do
  python3 -c "import json; j=json.load(open('$R/llama1b_4seq_$n.json')); print('$n', 'step_ms', j.get('step_ms_median'), 'mfu', j.get('mfu'), 'loss_last', j.get('loss_last'), 'peak GiB %.2f' % ((j.get('peak_mem_bytes') or 0) / 2**30))" 2>&1 | tail -1
done
PYTHONUNBUFFERED=1 timeout 120 python3 bench/hf_generate_parity.py --fsdp build-gpu/fsdp \
  --out /tmp/hf_generate --backends cuda --new-tokens 64 --input-ids > "$R/hf_generate_parity.log" 2>&1
echo "hf generate parity rc=$? at $((SECONDS - T0)) s"; tail -6 "$R/hf_generate_parity.log"
# Sampling on CUDA (temperature and top-p), as make run's sample draws it: twice, the same text.
for i in 1 2; do
  timeout 60 build-gpu/fsdp generate --backend cuda --init-from /tmp/hf_generate/llama3.2 \
    --input-ids 659,84,104,101 --max-new-tokens 24 --temperature 0.8 --top-p 0.9 --seed 1 \
    > "$R/sample_cuda_$i.log" 2>&1
  echo "sample $i rc=$?: $(tail -1 "$R/sample_cuda_$i.log")"
done
