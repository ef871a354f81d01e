#!/usr/bin/env bash
# 1 x H200, on the code with the NCCL watchdog (polled host waits): every GPU test
# (fsdp_gpu_tests, incl. the CUDA-graph ones), the CUDA-vs-CPU parity checks (scripts/gpu_check.sh
# on that build), llama1b at 4 sequences eager and with --cuda-graph (did the polled waits cost
# anything against the eager step measured before?), and the lonely-node message.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call2; mkdir -p $R
trap 'tar czf $OUT/call2.tgz -C /tmp call2' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp fsdp_gpu_tests) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
timeout 200 build-gpu/fsdp_gpu_tests > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" $R/gpu_tests.log | head -12
FSDP_BUILD_DIR=build-gpu timeout 90 scripts/gpu_check.sh $R/check > $R/gpu_check.log 2>&1; echo "gpu_check rc=$? at $((SECONDS-T0)) s"; grep -E "PASS|FAIL|skip" $R/gpu_check.log | head
F=build-gpu/fsdp; D=data/pydocs-4k
L="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048 --vocab 32000 --param-dtype bf16 --data $D --eval-every 0 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0"
for mode in eager graph; do
  extra=""; [ $mode = graph ] && extra="--cuda-graph"
  echo "$F train --backend cuda --nproc 1 $L --tokens 8192 --steps 20 --warmup 5 --quiet $extra" > $R/llama1b_s4_$mode.cmd
  timeout 100 $F train --backend cuda --nproc 1 $L --tokens 8192 --steps 20 --warmup 5 --quiet $extra --json $R/llama1b_s4_$mode.json > $R/llama1b_s4_$mode.log 2>&1
  echo "llama1b s4 $mode rc=$?: $(tail -1 $R/llama1b_s4_$mode.log)"
done
t=$SECONDS; timeout 60 $F train --backend cuda --model mlp --layers 2 --dim 64 --tokens 64 --steps 4 --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 29741 --nproc 1 --timeout 5 > $R/lonely.log 2>&1; echo "lonely node rc=$? after $((SECONDS-t)) s"; cat $R/lonely.log | tail -3
echo "total $((SECONDS-T0)) s"
