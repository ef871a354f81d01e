#!/usr/bin/env bash
# Activation checkpointing on one H200 (docs/memory.md): build; the GPU tests of
# tests/gpu/test_cuda_activation_checkpointing.cpp (bitwise eager and captured, peaks falling);
# then issue 26's 3.0B Llama shape (dim 3072, 28 layers, 24/8 heads, FFN 8192, vocab 32000,
# bf16, AdamW, clipping) at 2 x 8192 tokens per rank with each mode, while the call's time
# (BUDGET_S, default 560 s) lasts:
#   bash bench/runs/2026-12-02-activation-checkpointing/run.sh [tests] [MODE...]
# Each row writes R/MODE.json (the summary), MODE.log and MODE.cmd; R (/tmp/ac) is tarred into
# $OUT/ac.tgz after each step, so what ran comes back if a later row does not finish.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS
BUDGET_S=${BUDGET_S:-560}
R=/tmp/ac
mkdir -p "$R"
save() { [ -n "${OUT:-}" ] && tar czf "$OUT/ac.tgz" -C /tmp ac; }
tests=0
[ "${1:-}" = tests ] && { tests=1; shift; }
if [ ! -x build-gpu/fsdp ] || [ $tests = 1 ]; then
  targets=fsdp_tool
  [ $tests = 1 ] && targets="fsdp_tool fsdp_gpu_tests"
  (cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90a && cmake --build build-gpu -j16 --target $targets) \
    > "$R/build.log" 2>&1
  echo "build rc=$? at $((SECONDS - T0)) s"
  grep -E "error" "$R/build.log" | head
  save
fi
if [ $tests = 1 ]; then
  left=$((BUDGET_S - (SECONDS - T0) - 20))
  timeout $((left < 200 ? left : 200)) build-gpu/fsdp_gpu_tests --gtest_filter='CudaActivationCheckpointing*' \
    > "$R/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? at $((SECONDS - T0)) s"
  grep -E "^\[  (PASSED|FAILED)|peak|Failure|Expected|Which is|differs" "$R/gpu_tests.log" | head -30
  save
fi
SHAPE="--model transformer --layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 \
--vocab 32000 --seq-len 8192 --tokens 16384 --param-dtype bf16"
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(none selective full)
for name in "${modes[@]}"; do
  [ -f "$R/$name.json" ] && continue
  left=$((BUDGET_S - (SECONDS - T0)))
  [ $left -lt 90 ] && { echo "$name: skipped, ${left} s left"; continue; }
  cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 6 --warmup 2 --quiet $SHAPE
       --activation-checkpointing "$name" --json "$R/$name.json")
  echo "${cmd[*]}" > "$R/$name.cmd"
  timeout $left "${cmd[@]}" > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/$name.log")"
  save
done
