#!/usr/bin/env bash
# GPU run 1 of the MoE work (1 x H200, fresh machine): build; loss parity with PyTorch FSDP2
# (bench/torch_moe.py) on a small MoE transformer from the same initial weights (fsdp export
# --init), fp32 and bf16; the benchmark rows (bench/run_moe_bench.sh). Logs under $OUT/moe1.tgz.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; LIMIT=${LIMIT:-385}; R=/tmp/moe1; mkdir -p $R
left() { echo $((LIMIT - (SECONDS - T0))); }
trap 'gzip -c build-gpu/fsdp > $OUT/fsdp.gz 2>/dev/null; tar czf $OUT/moe1.tgz --exclude="*.safetensors" -C /tmp moe1' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp) > $R/build.log 2>&1
echo "build rc=$? at $((SECONDS-T0)) s"; tail -2 $R/build.log
F=./build-gpu/fsdp; D=data/pydocs-4k
SHAPE="--layers 4 --dim 256 --heads 8 --kv-heads 4 --ffn-dim 704 --seq-len 256 --vocab 4096"
MOE="--experts 8 --top-k 2 --expert-ffn-dim 128"
REC="--lr 1e-3 --min-lr 1e-4 --warmup-steps 10 --weight-decay 0.1 --clip-grad-norm 1.0"
$F export --init --model moe-transformer $SHAPE $MOE --out $R/init.safetensors > $R/export.log 2>&1 || tail -3 $R/export.log
for dt in fp32 bf16; do
  [ $(left) -gt 200 ] || break
  timeout 40 $F train --backend cuda --nproc 1 --world-size 1 --model moe-transformer $SHAPE $MOE $REC --tokens 1024 --steps 50 --param-dtype $dt --data $D --eval-every 0 --init-from $R/init.safetensors --log-every 10 --json $R/ours_$dt.json > $R/ours_$dt.log 2>&1 || tail -3 $R/ours_$dt.log
  timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node 1 bench/torch_moe.py --data $D/train.bin $SHAPE $MOE $REC --beta2 0.999 --batch 4 --steps 50 --param-dtype $dt --init-from $R/init.safetensors --log-every 10 --out $R/torch_$dt.json > $R/torch_$dt.log 2>&1 || tail -8 $R/torch_$dt.log
  tol=1e-4; [ $dt = bf16 ] && tol=2e-2
  python3 bench/plot_losses.py "fsdp=$R/ours_$dt.json" "PyTorch FSDP2=$R/torch_$dt.json" --out $R/moe_parity_$dt.svg --title "4 x 256 MoE transformer (8 experts, top-2) on pydocs-4k, $dt, 50 steps, 1 x H200" --compare "fsdp,PyTorch FSDP2" --tolerance $tol | tee $R/moe_parity_$dt.txt
done
echo "parity done at $((SECONDS-T0)) s"
grep -h "expert_gemm" $R/torch_*.json 2>/dev/null | head -2
if [ $(left) -gt 60 ]; then
  FSDP_BIN=$F ROWS="ours_k1_sep0 torch ours_k2_sep0 ours_k1_sep1 ours_k2_sep1" timeout $(left) bench/run_moe_bench.sh $R/bench $D > $R/bench.log 2>&1; echo "bench rc=$?"
  grep -E "^\| |rc=" $R/bench.log | head -12
fi
echo "total $((SECONDS-T0)) s"
