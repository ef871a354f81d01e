#!/usr/bin/env bash
# Eager against --cuda-graph on one GPU (docs/cuda_graphs.md): mlp16 at 2048 and 8192 tokens per
# rank, the ~1B transformer at 1 and 2 sequences per rank, and bench/gemm_floor's step floors.
#
#   bench/run_cuda_graph_bench.sh OUTDIR
#
# Each row writes OUTDIR/NAME.json (the summary) and OUTDIR/NAME.log; bench/cuda_graph_table.py
# turns them into a table, e.g. RUN_DIR/cuda_graph_h200x1.{json,md} (bench/README.md). Environment: FSDP_BIN (default
# build-gpu/fsdp), GEMM_FLOOR (default build-gpu/bench/gemm_floor), ROWS (default: all).
set -u
OUTDIR=${1:?usage: bench/run_cuda_graph_bench.sh OUTDIR}
FSDP_BIN=${FSDP_BIN:-build-gpu/fsdp}
GEMM_FLOOR=${GEMM_FLOOR:-build-gpu/bench/gemm_floor}
ROWS=${ROWS:-"floor mlp llama"}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUTDIR"

MLP="--model mlp --layers 16 --dim 4096 --param-dtype bf16 --optimizer-in-backward 1 --clip-grad-norm 0"
LLAMA="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 \
--seq-len 2048 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 \
--lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 \
--optimizer-in-backward 0"

row() {  # NAME TIMEOUT_S ARGS...
  local name=$1 limit=$2
  shift 2
  local cmd=("$FSDP_BIN" train --backend cuda --nproc 1 --quiet --json "$OUTDIR/$name.json" "$@")
  echo "${cmd[*]}" > "$OUTDIR/$name.cmd"
  local t0=$SECONDS
  timeout "$limit" "${cmd[@]}" > "$OUTDIR/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0))s: $(tail -n 1 "$OUTDIR/$name.log")"
}

for r in $ROWS; do
  case $r in
    floor)
      for t in 2048 8192; do
        echo "$GEMM_FLOOR $t 4096 16 20" > "$OUTDIR/floor_mlp16_t$t.cmd"
        timeout 60 "$GEMM_FLOOR" "$t" 4096 16 20 > "$OUTDIR/floor_mlp16_t$t.log" 2>&1
        echo "floor t$t: $(tail -n 1 "$OUTDIR/floor_mlp16_t$t.log")"
      done ;;
    mlp)
      for t in 2048 8192; do
        for mode in eager graph; do
          extra=""; [[ $mode == graph ]] && extra="--cuda-graph"
          row "mlp16_t${t}_$mode" 90 $MLP --tokens "$t" --steps 30 --warmup 5 $extra
        done
      done ;;
    llama)
      for seqs in 1 2; do
        for mode in eager graph; do
          extra=""; [[ $mode == graph ]] && extra="--cuda-graph"
          row "llama1b_s${seqs}_$mode" 120 $LLAMA --tokens $((seqs * 2048)) --steps 20 --warmup 5 $extra
        done
      done ;;
  esac
done
