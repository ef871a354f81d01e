#!/usr/bin/env bash
# 1 x H200, after one-rank in-place collectives stopped launching: the CUDA-graph tests again
# (bytes in use within 5% plus one graph-memory chunk), the mlp16 rows and step floors
# (bench/run_cuda_graph_bench.sh ROWS="floor mlp") and an eager mlp16 trace
# (bench/trace_op_totals.py).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call3; mkdir -p $R
trap 'tar czf $OUT/call3.tgz -C /tmp call3' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp fsdp_gpu_tests gemm_floor) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
timeout 150 build-gpu/fsdp_gpu_tests --gtest_filter='CudaGraph*:CudaMoe*:CudaBackendTest.NcclComm*' > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|Failure|differs" $R/gpu_tests.log | head -20
M="--model mlp --layers 16 --dim 4096 --param-dtype bf16 --optimizer-in-backward 1 --clip-grad-norm 0 --tokens 2048"
timeout 60 build-gpu/fsdp train --backend cuda --nproc 1 $M --steps 12 --warmup 4 --quiet --trace $R/mlp16_t2048_trace.json > $R/mlp16_trace.log 2>&1
python3 bench/trace_op_totals.py $R/mlp16_t2048_trace.json --top 30 > $R/mlp16_t2048_ops.txt 2>&1; cat $R/mlp16_t2048_ops.txt
ROWS="floor mlp" timeout 200 bench/run_cuda_graph_bench.sh $R/bench > $R/bench.log 2>&1; echo "bench rc=$? at $((SECONDS-T0)) s"; cat $R/bench.log
echo "total $((SECONDS-T0)) s"
