#!/usr/bin/env bash
# First GPU check of the transformer: build, GPU tests, attention bench, transformer
# CUDA-vs-CPU, llama1b speed.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
T0=$SECONDS; FINAL_OUT=$OUT; OUT=/tmp/o; mkdir -p $OUT; trap "tar czf $FINAL_OUT/mid.tgz -C /tmp o" EXIT
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a > $OUT/cmake.log 2>&1 || { tail -30 $OUT/cmake.log; exit 1; }
cmake --build build-gpu -j16 > $OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head -30; exit 1; }
echo "build done at $((SECONDS-T0)) s"
timeout 240 ./build-gpu/fsdp_gpu_tests > $OUT/gpu_tests.log 2>&1; echo "gpu_tests rc=$?"
grep -E "^\[  (FAILED|PASSED) |FAILED|max" $OUT/gpu_tests.log | head -60
timeout 60 ./build-gpu/bench/attention_bench > $OUT/attn.log 2>&1; echo "attn rc=$?"; tail -20 $OUT/attn.log
common="--model transformer --layers 2 --dim 128 --heads 4 --kv-heads 2 --seq-len 64 --vocab 512 --tokens 256 --steps 8 --quiet"
for dt in fp32 bf16; do
./build-gpu/fsdp train --backend cpu --world-size 1 $common --param-dtype $dt --json $OUT/cpu_$dt.json > $OUT/cpu_$dt.log 2>&1
timeout 60 ./build-gpu/fsdp train --backend cuda --nproc 1 $common --param-dtype $dt --json $OUT/cuda_$dt.json > $OUT/cuda_$dt.log 2>&1 || tail -5 $OUT/cuda_$dt.log
python3 bench/plot_losses.py cuda=$OUT/cuda_$dt.json cpu=$OUT/cpu_$dt.json --out $OUT/p_$dt.svg --compare cuda,cpu --tolerance 1e-3
done
L="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --vocab 32000 --seq-len 2048 --param-dtype bf16"
for tok in 8192 2048; do
timeout 120 ./build-gpu/fsdp train --backend cuda --nproc 1 $L --tokens $tok --steps 10 --warmup 4 --json $OUT/llama_t$tok.json > $OUT/llama_t$tok.log 2>&1; echo "llama t$tok rc=$?"; tail -3 $OUT/llama_t$tok.log
done
timeout 120 ./build-gpu/fsdp train --backend cuda --nproc 1 $L --tokens 8192 --steps 7 --warmup 4 --trace $OUT/llama_trace.json --quiet > $OUT/llama_traced.log 2>&1 && ./build-gpu/fsdp report $OUT/llama_trace.json > $OUT/llama_report.txt 2>&1; head -30 $OUT/llama_report.txt
gzip -f $OUT/llama_trace.json
echo "total $((SECONDS-T0)) s"
