#!/usr/bin/env bash
# 1 x H200: every GPU test (the CUDA-graph ones now compare the memory each run takes from the
# device, and capture the MoE transformer with a capacity factor), then the eager-vs-graph
# benchmark rows (bench/run_cuda_graph_bench.sh: step floors, mlp16 at 2048 and 8192 tokens,
# llama1b at 1 and 2 sequences), and where mlp16's device time goes now (bench/trace_op_totals.py
# on an eager trace). bench/cuda_graph_table.py makes the tables from $OUT's copy of the rows.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call2; mkdir -p $R
trap 'tar czf $OUT/call2.tgz -C /tmp call2' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp fsdp_gpu_tests gemm_floor) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
timeout 260 build-gpu/fsdp_gpu_tests > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|Failure" $R/gpu_tests.log | head -20
grep -E "reserved eager" $R/gpu_tests.log | sed 's/.*--micro-batches/mb/' | head -30
M="--model mlp --layers 16 --dim 4096 --param-dtype bf16 --optimizer-in-backward 1 --clip-grad-norm 0 --tokens 2048"
timeout 60 build-gpu/fsdp train --backend cuda --nproc 1 $M --steps 12 --warmup 4 --quiet --trace $R/mlp16_t2048_trace.json > $R/mlp16_trace.log 2>&1
python3 bench/trace_op_totals.py $R/mlp16_t2048_trace.json --top 30 > $R/mlp16_t2048_ops.txt 2>&1; cat $R/mlp16_t2048_ops.txt
timeout 300 bench/run_cuda_graph_bench.sh $R/bench > $R/bench.log 2>&1; echo "bench rc=$? at $((SECONDS-T0)) s"; cat $R/bench.log
echo "total $((SECONDS-T0)) s"
