#!/usr/bin/env bash
# 1 x H200: the CUDA-graph check (build, capture tests, eager vs graph bitwise, bench rows), the
# launch forms that one GPU allows (--nproc 1, torchrun standalone, torchrun with a master port,
# a rendezvous that never completes), and the MoE parity with PyTorch plus one benchmark row for
# the per-step peaks. Everything lands in $OUT/call1.tgz.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T0=$SECONDS; R=/tmp/call1; mkdir -p $R
trap 'tar czf $OUT/call1.tgz --exclude="*.safetensors" -C /tmp call1' EXIT
BUDGET_S=330 bench/cuda_graph_check.sh $R/graph > $R/graph_check.log 2>&1
echo "graph check rc=$? at $((SECONDS-T0)) s"; cat $R/graph/summary.txt | head -60
F=$(realpath build-gpu/fsdp); D=data/pydocs-4k
common="--backend cuda --model transformer --layers 2 --dim 128 --heads 4 --kv-heads 2 --ffn-dim 256 --seq-len 128 --vocab 4096 --tokens 512 --steps 8 --data $D --eval-every 0 --quiet"
$F train $common --nproc 1 --json $R/nproc1.json > $R/nproc1.log 2>&1; echo "nproc1 rc=$?"
timeout 60 torchrun --standalone --nproc-per-node 1 --no-python $F train $common --json $R/torchrun_standalone.json > $R/torchrun_standalone.log 2>&1; echo "torchrun standalone rc=$?"; tail -3 $R/torchrun_standalone.log
timeout 60 torchrun --nnodes 1 --nproc-per-node 1 --master-addr 127.0.0.1 --master-port 29731 --no-python $F train $common --json $R/torchrun_port.json > $R/torchrun_port.log 2>&1; echo "torchrun port rc=$?"; tail -3 $R/torchrun_port.log
t=$SECONDS; timeout 60 $F train $common --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 29733 --nproc 1 --timeout 5 > $R/lonely.log 2>&1; echo "lonely node rc=$? after $((SECONDS-t)) s: $(tail -1 $R/lonely.log)"
python3 - $R <<'PY'
import json, sys
r = sys.argv[1]
ref = json.load(open(f"{r}/nproc1.json"))["losses"]
for name in ("torchrun_standalone", "torchrun_port"):
    try:
        l = json.load(open(f"{r}/{name}.json"))["losses"]
        print(name, "identical" if l == ref else f"DIFFERENT {l[:3]} vs {ref[:3]}", len(l), "steps")
    except Exception as e:
        print(name, "FAILED", e)
PY
echo "launch done at $((SECONDS-T0)) s"
cp bench/runs/2026-12-01-moe-transformer/run.sh $R/moe_run.sh
LIMIT=$((560 - (SECONDS - T0))) bash -c '
R=/tmp/call1/moe; mkdir -p $R; F=./build-gpu/fsdp; D=data/pydocs-4k
SHAPE="--layers 4 --dim 256 --heads 8 --kv-heads 4 --ffn-dim 704 --seq-len 256 --vocab 4096"
SMOE="--experts 8 --top-k 2 --expert-ffn-dim 128"
REC="--lr 1e-3 --min-lr 1e-4 --warmup-steps 10 --weight-decay 0.1 --clip-grad-norm 1.0"
$F export --init --model moe-transformer $SHAPE $SMOE --tokens 1024 --out $R/init.safetensors > $R/export.log 2>&1 || tail -3 $R/export.log
timeout 40 $F train --backend cuda --nproc 1 --model moe-transformer $SHAPE $SMOE $REC --tokens 1024 --steps 50 --param-dtype fp32 --data $D --eval-every 0 --init-from $R/init.safetensors --log-every 10 --json $R/ours_fp32.json > $R/ours_fp32.log 2>&1 || tail -3 $R/ours_fp32.log
timeout 70 python3 -m torch.distributed.run --standalone --nproc-per-node 1 bench/torch_moe.py --data $D/train.bin $SHAPE $SMOE $REC --beta2 0.999 --batch 4 --steps 50 --param-dtype fp32 --init-from $R/init.safetensors --log-every 10 --out $R/torch_fp32.json > $R/torch_fp32.log 2>&1 || tail -8 $R/torch_fp32.log
python3 bench/plot_losses.py "fsdp=$R/ours_fp32.json" "PyTorch FSDP2=$R/torch_fp32.json" --out $R/moe_parity_fp32.svg --title "4 x 256 MoE transformer (8 experts, top-2) on pydocs-4k, fp32, 50 steps, 1 x H200" --compare "fsdp,PyTorch FSDP2" --tolerance 1e-4 | tee $R/moe_parity_fp32.txt
FSDP_BIN=$F ROWS="ours_k1_sep0" ROW_TIMEOUT=60 timeout 90 bench/run_moe_bench.sh $R/bench $D > $R/bench.log 2>&1; echo "moe row rc=$?"; tail -3 $R/bench.log
'
echo "total $((SECONDS-T0)) s"
