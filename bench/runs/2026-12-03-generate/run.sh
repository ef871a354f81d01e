#!/usr/bin/env bash
# Text generation on one H200 (not run yet): the KV-cache ops against the CPU backend's
# (tests/gpu/test_cuda_kv_cache.cpp), the CPU suite's generation tests, and greedy decoding of
# 64 tokens against transformers' generate(do_sample=False) in fp32, on CUDA and on the CPU
# backend (bench/hf_generate_parity.py), then a sampled continuation from the cuda backend.
#   bash bench/runs/2026-12-03-generate/run.sh
set -u
source bench/gpu_call.sh
gpu_call_begin generate fsdp_tool fsdp_tests fsdp_gpu_tests
build-gpu/fsdp_gpu_tests --gtest_filter='CudaKvCache.*' > "$R/gpu_kv_cache.log" 2>&1
echo "gpu kv cache tests rc=$? at $((SECONDS - T0)) s"; grep -E '^\[  (PASSED|FAILED)' "$R/gpu_kv_cache.log"
build-gpu/fsdp_tests --gtest_filter='KvCacheOps.*:Generate.*:Sampling.*:GenerateCommand.*' \
  > "$R/cpu_generate_tests.log" 2>&1
echo "cpu generate tests rc=$? at $((SECONDS - T0)) s"; grep -E '^\[  (PASSED|FAILED)' "$R/cpu_generate_tests.log"
timeout 400 python3 bench/hf_generate_parity.py --fsdp build-gpu/fsdp --out "$R/parity" \
  --backends cuda,cpu --new-tokens 64 > "$R/parity.log" 2>&1
echo "hf generate parity rc=$? at $((SECONDS - T0)) s"; tail -8 "$R/parity.log"
timeout 60 build-gpu/fsdp generate --backend cuda --init-from "$R/parity/llama3.2" \
  --prompt "The quick brown fox" --max-new-tokens 32 --temperature 0.8 --top-p 0.9 --seed 1 \
  --json "$R/sample.json" > "$R/sample.log" 2>&1
echo "sample rc=$?: $(tail -1 "$R/sample.log")"
