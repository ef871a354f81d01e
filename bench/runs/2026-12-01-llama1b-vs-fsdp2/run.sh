#!/usr/bin/env bash
# llama1b on 1 x H200: build, GPU tests, the llama1b rows (ours, PyTorch FSDP2 eager), the GEMM
# shapes.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; FINAL_OUT=$OUT; OUT=/tmp/o2; mkdir -p $OUT; trap "tar czf $FINAL_OUT/gpu2.tgz -C /tmp o2" EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log --oneline -1 2>/dev/null
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a > $OUT/cmake.log 2>&1 || { tail -30 $OUT/cmake.log; exit 1; }
cmake --build build-gpu -j16 > $OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head -30; exit 1; }
echo "build done at $((SECONDS-T0)) s"
timeout 200 ./build-gpu/fsdp_gpu_tests > $OUT/gpu_tests.log 2>&1; echo "gpu_tests rc=$?"
grep -E "^\[  (FAILED|PASSED) |FAILED" $OUT/gpu_tests.log | head -20
echo "gpu tests done at $((SECONDS-T0)) s"
ROWS="ours4 ours1 torch4 torch1" timeout 330 bench/run_llama_bench.sh $OUT/bench data/pydocs-4k > $OUT/bench.log 2>&1; echo "bench rc=$?"
cat $OUT/bench/h200x1.md 2>/dev/null | head -14
echo "bench done at $((SECONDS-T0)) s"
timeout 40 ./build-gpu/bench/gemm_floor llama > $OUT/gemm_llama.log 2>&1; tail -25 $OUT/gemm_llama.log
echo "total $((SECONDS-T0)) s"
