#!/usr/bin/env bash
# 1 x H200: per-op times inside CUDA graphs (Note [Timeline inside CUDA graphs]). The graph
# tests (device level, the traced trainer, the bitwise mlp runs), then traced eager and captured
# runs of mlp16 at 2048 tokens and llama1b at 1 sequence, each with bench/trace_op_totals.py
# (device ms per step by op kind) and `fsdp report` (stalls).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call1; mkdir -p $R
trap 'tar czf $OUT/call1.tgz -C /tmp call1' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp fsdp_gpu_tests) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
grep -E "error" $R/build.log | head -20
timeout 150 build-gpu/fsdp_gpu_tests --gtest_filter='CudaGraphTimeline.*:CudaGraphTrainTrace.*:CudaGraphDevice.*:CudaGraphTrain.Mlp*' > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|Failure|differs|Expected|Which is|actual" $R/gpu_tests.log | head -40
MLP="--model mlp --layers 16 --dim 4096 --param-dtype bf16 --optimizer-in-backward 1 --clip-grad-norm 0 --tokens 2048"
LLAMA="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0 --tokens 2048"
trace_pair() {  # NAME LIMIT ARGS...
  local name=$1 limit=$2; shift 2
  for mode in eager graph; do
    local extra=""; [[ $mode == graph ]] && extra="--cuda-graph"
    local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 12 --warmup 4 --quiet "$@" $extra --trace $R/${name}_$mode.trace.json --json $R/${name}_$mode.json)
    echo "${cmd[*]}" > $R/${name}_$mode.cmd
    timeout $limit "${cmd[@]}" > $R/${name}_$mode.log 2>&1; echo "$name $mode rc=$? at $((SECONDS-T0)) s"
    python3 bench/trace_op_totals.py $R/${name}_$mode.trace.json --top 12 > $R/${name}_$mode.ops.txt 2>&1
    build-gpu/fsdp report $R/${name}_$mode.trace.json --top 5 > $R/${name}_$mode.report.txt 2>&1
    echo "== $name $mode"; head -30 $R/${name}_$mode.ops.txt; head -12 $R/${name}_$mode.report.txt
    python3 -c "import json,sys; j=json.load(open('$R/${name}_$mode.json')); print('step_ms_median', j.get('step_ms_median'), 'streams', j.get('graph_streams'))"
  done
}
trace_pair mlp16_t2048 60 $MLP
trace_pair llama1b_s1 120 $LLAMA
echo "total $((SECONDS-T0)) s"
