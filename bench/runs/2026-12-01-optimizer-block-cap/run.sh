#!/usr/bin/env bash
# 1 x H200, an experiment: the deferred AdamW steps (optimizer in forward) with their grid
# capped (FSDP_OPTIMIZER_MAX_BLOCKS, a temporary patch not committed), to see whether a small
# grid overlaps the forward GEMMs better than one block per tile.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call5; mkdir -p $R
trap 'tar czf $OUT/call5.tgz -C /tmp call5' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a && cmake --build build-gpu -j16 --target fsdp) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
LLAMA="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0 --cuda-graph --optimizer-in-forward 1"
for t in 2048 8192; do for b in 32 132 264; do
  [[ $t == 8192 && $b == 264 ]] && continue
  FSDP_OPTIMIZER_MAX_BLOCKS=$b timeout 120 build-gpu/fsdp train --backend cuda --nproc 1 --steps 20 --warmup 5 --quiet $LLAMA --tokens $t --json $R/t${t}_b$b.json > $R/t${t}_b$b.log 2>&1
  echo "tokens $t blocks $b rc=$? at $((SECONDS-T0)) s: $(tail -1 $R/t${t}_b$b.log)"
done; done
