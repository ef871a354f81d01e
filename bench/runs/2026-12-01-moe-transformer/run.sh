#!/usr/bin/env bash
# The MoE GPU run (1 x H200, fresh machine; build-gpu/fsdp built beforehand with
# -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a, rebuilt here only if its libraries are missing):
#   1. loss parity with PyTorch FSDP2 (bench/torch_moe.py) on a small MoE transformer from the
#      same initial weights (fsdp export --init), fp32 (bf16 at the end, time permitting);
#   2. the benchmark rows (bench/run_moe_bench.sh, 100 steps each);
#   3. convergence at the benchmark size, bf16, default settings: MoE and dense transformer.
# Everything lands in $OUT/moe.tgz (no safetensors).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T0=$SECONDS; LIMIT=${LIMIT:-385}; R=/tmp/moe; mkdir -p $R
left() { echo $((LIMIT - (SECONDS - T0))); }
trap 'tar czf $OUT/moe.tgz --exclude="*.safetensors" -C /tmp moe' EXIT
F=./build-gpu/fsdp; D=data/pydocs-4k
if ! [ -x $F ] || ldd $F | grep -q "not found"; then
  (cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
   cmake --build build-gpu -j16 --target fsdp) > $R/build.log 2>&1; echo "built here: rc=$? at $((SECONDS-T0)) s"
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
SHAPE="--layers 4 --dim 256 --heads 8 --kv-heads 4 --ffn-dim 704 --seq-len 256 --vocab 4096"
SMOE="--experts 8 --top-k 2 --expert-ffn-dim 128"
REC="--lr 1e-3 --min-lr 1e-4 --warmup-steps 10 --weight-decay 0.1 --clip-grad-norm 1.0"
$F export --init --model moe-transformer $SHAPE $SMOE --tokens 1024 --out $R/init.safetensors > $R/export.log 2>&1 || tail -3 $R/export.log
parity() {  # DTYPE
  local dt=$1 tol=1e-4; [ $dt = bf16 ] && tol=2e-2
  timeout 40 $F train --backend cuda --nproc 1 --world-size 1 --model moe-transformer $SHAPE $SMOE $REC --tokens 1024 --steps 50 --param-dtype $dt --data $D --eval-every 0 --init-from $R/init.safetensors --log-every 10 --json $R/ours_$dt.json > $R/ours_$dt.log 2>&1 || tail -3 $R/ours_$dt.log
  timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node 1 bench/torch_moe.py --data $D/train.bin $SHAPE $SMOE $REC --beta2 0.999 --batch 4 --steps 50 --param-dtype $dt --init-from $R/init.safetensors --log-every 10 --out $R/torch_$dt.json > $R/torch_$dt.log 2>&1 || tail -8 $R/torch_$dt.log
  python3 bench/plot_losses.py "fsdp=$R/ours_$dt.json" "PyTorch FSDP2=$R/torch_$dt.json" --out $R/moe_parity_$dt.svg --title "4 x 256 MoE transformer (8 experts, top-2) on pydocs-4k, $dt, 50 steps, 1 x H200" --compare "fsdp,PyTorch FSDP2" --tolerance $tol | tee $R/moe_parity_$dt.txt
  echo "parity $dt done at $((SECONDS-T0)) s"
}
parity fp32
grep -h '"expert_gemm"' $R/torch_fp32.json
FSDP_BIN=$F ROWS="ours_k1_sep0 torch ours_k2_sep0 ours_k1_sep1 ours_k2_sep1" ROW_TIMEOUT=60 TORCH_TIMEOUT=120 \
  timeout $(( $(left) - 110 )) bench/run_moe_bench.sh $R/bench $D > $R/bench.log 2>&1; echo "bench rc=$? at $((SECONDS-T0)) s"
grep -E "rc=" $R/bench.log
BIG="--layers 16 --dim 2048 --heads 16 --kv-heads 4 --ffn-dim 5504 --seq-len 2048 --vocab 4096"
BMOE="--experts 8 --top-k 2 --expert-ffn-dim 1408"
CONV=${CONV_STEPS:-250}
for m in moe dense; do
  [ $(left) -gt 25 ] || break
  args="--model transformer $BIG"; [ $m = moe ] && args="--model moe-transformer $BIG $BMOE"
  timeout $(( $(left) - 10 )) $F train --backend cuda --nproc 1 --world-size 1 $args --tokens 8192 --steps $CONV --param-dtype bf16 --data $D --log-every 25 --json $R/conv_$m.json > $R/conv_$m.log 2>&1; echo "conv $m rc=$? at $((SECONDS-T0)) s"
  tail -2 $R/conv_$m.log
done
python3 bench/plot_losses.py "MoE transformer (8 experts, top-2)=$R/conv_moe.json" "dense transformer=$R/conv_dense.json" --val "MoE val=$R/conv_moe.json" --val "dense val=$R/conv_dense.json" --out $R/moe_convergence.svg --title "dim 2048, 16 layers, seq 2048, pydocs-4k, bf16, default settings, 1 x H200" 2>&1 | tail -3
[ $(left) -gt 45 ] && parity bf16
echo "total $((SECONDS-T0)) s"
