#!/usr/bin/env bash
# The op sweep again on one H200, now that it runs to the end (the ids of its embedding kernels
# are zeroed as F32: fill has no I32 kernel, and 2026-12-03-h200-calibration's sweep stopped
# there), with the Llama-3.2-1B and 3.0B shapes and the MoE transformer's grouped expert GEMMs
# and row kernels; then the device time per op kind of one traced MoE step and one traced 3.0B
# step (bench/trace_op_totals.py), to compare op by op with the simulation:
#   bash bench/runs/2026-12-03-op-sweep/run.sh      (writes $OUT/op_sweep.jsonl, $OUT/*.ops.txt)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON \
   -DCMAKE_CUDA_ARCHITECTURES=90a && cmake --build build-gpu -j16 --target op_sweep fsdp_tool) \
  > "$OUT/build.log" 2>&1
echo "build rc=$? at $((SECONDS - T0)) s"; grep -E "error" "$OUT/build.log" | head
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 240 build-gpu/bench/op_sweep 5 > "$OUT/op_sweep.jsonl" 2> "$OUT/op_sweep.err"
echo "op_sweep rc=$? at $((SECONDS - T0)) s: $(wc -l < "$OUT/op_sweep.jsonl") lines"; tail -2 "$OUT/op_sweep.err"
MOE="--model moe-transformer --layers 16 --dim 2048 --heads 16 --kv-heads 4 --ffn-dim 5504 --seq-len 2048
  --vocab 4096 --experts 8 --top-k 2 --expert-ffn-dim 1408 --capacity-factor 0 --aux-loss-weight 0.01
  --moe-every 2 --tokens 8192 --param-dtype bf16 --lr 3e-4 --min-lr 3e-5 --warmup-steps 5
  --weight-decay 0.1 --clip-grad-norm 1.0 --optimizer-in-backward 0"
S3B="--model transformer --layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 --seq-len 8192
  --vocab 32000 --tokens 16384 --param-dtype bf16 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1
  --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0"
for row in "moe|$MOE" "shape3b|$S3B"; do
  name=${row%%|*}; args=${row#*|}
  # shellcheck disable=SC2086
  timeout 120 build-gpu/fsdp train --backend cuda --nproc 1 --steps 8 --warmup 3 --quiet $args \
    --trace /tmp/$name.trace.json --json "$OUT/$name.train.json" > "$OUT/$name.train.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s"
  python3 bench/trace_op_totals.py /tmp/$name.trace.json > "$OUT/$name.ops.txt" 2>&1
done
