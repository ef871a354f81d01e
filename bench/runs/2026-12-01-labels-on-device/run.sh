#!/usr/bin/env bash
# 1 x H200, after the synthetic labels moved to the device (Device::synthetic_labels): the
# graph-pool-trim run measured mlp16's host time under the graph at 6.2% and 6.0% of the step,
# most of it the host computing 16-way argmax labels for every row. The label and mlp graph
# tests, then the mlp16 rows and floors again (that run's llama1b rows stand: they read token
# files, which this does not touch).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call3; mkdir -p $R
trap 'tar czf $OUT/call3.tgz -C /tmp call3' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp fsdp_gpu_tests gemm_floor) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
grep -E "error" $R/build.log | head
timeout 120 build-gpu/fsdp_gpu_tests --gtest_filter='CudaBackendTest.Synthetic*:CudaGraphTrain.Mlp*:CudaGraphTrainTrace.*' > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure|differs|Expected|Which is" $R/gpu_tests.log | head -20
ROWS="floor mlp" timeout 200 bench/run_cuda_graph_bench.sh $R/bench > $R/bench.log 2>&1; echo "bench rc=$? at $((SECONDS-T0)) s"; cat $R/bench.log
for f in $R/bench/mlp16_*.json; do python3 -c "import json; j=json.load(open('$f')); print('$f'.split('/')[-1], 'step', round(j['step_ms_median'],3), 'host us', round(j['host_us_per_step'],1), 'pct', round(100*j['host_us_per_step']/1000/j['step_ms_median'],2))"; done
echo "total $((SECONDS-T0)) s"
