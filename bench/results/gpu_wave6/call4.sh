#!/usr/bin/env bash
# GPU call 4 of wave 6 (1 x H200), the session's final code: the early grad norm (Note [Early
# grad norm]), one store_pack for global and shared memory, the shared two-stream test fixture.
# The whole GPU suite, then the llama1b rows again (the grad norm's sums now run under
# backward; the mlp16 rows of call 3 stand: they run the optimizer in backward, without a norm).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call4; mkdir -p $R
trap 'tar czf $OUT/call4.tgz -C /tmp call4' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp fsdp_gpu_tests) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
grep -E "error" $R/build.log | head
timeout 200 build-gpu/fsdp_gpu_tests > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure|differs|Expected|Which is" $R/gpu_tests.log | head -30
ROWS="llama" timeout 240 bench/run_cuda_graph_bench.sh $R/bench > $R/bench.log 2>&1; echo "bench rc=$? at $((SECONDS-T0)) s"; cat $R/bench.log
for f in $R/bench/llama1b_*.json; do python3 -c "import json; j=json.load(open('$f')); print('$f'.split('/')[-1], 'step', round(j['step_ms_median'],3), 'host us', round(j['host_us_per_step'],1), 'reserved GiB', round(j['backend_reserved_peak_bytes']/2**30,2))"; done
echo "total $((SECONDS-T0)) s"
