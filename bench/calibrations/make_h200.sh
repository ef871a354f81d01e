#!/usr/bin/env bash
# Makes h200.json, the committed H200 calibration, from GPU numbers already committed under
# bench/runs/ (op timings only: GEMMs alone, the op kinds of traced real steps, the fastest
# collectives of a 2-GPU trace; never a step time). Run from the repository root after building
# build/fsdp:   bash bench/calibrations/make_h200.sh [build]
# bench/calibrate_gpu.sh measures a new calibration on a GPU machine instead.
set -euo pipefail
B=${1:-build}/fsdp
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
RUNS=bench/runs
LLAMA1B="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048
  --vocab 32000 --param-dtype bf16 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0
  --warmup-steps 5 --optimizer-in-backward 0"
MLP16="--model mlp --layers 16 --dim 4096 --param-dtype bf16"

# 1. The GEMM table, from GEMMs timed alone.
python3 bench/fit_calibration.py --seed bench/calibrations/h200_seed.json \
  --gemms $RUNS/2026-12-01-llama1b-gemms/gemm_floor_llama.jsonl \
  --gemms $RUNS/2026-11-30-mlp16-gemm-floor/gemm_floor_2048.json \
  --gemms $RUNS/2026-11-30-mlp16-gemm-floor/gemm_floor_8192.json \
  --out "$T/table.json" --log "$T/table.log"

# 2. The 2-GPU traced step's command, simulated, for its collectives' bytes.
sim() {  # NAME ARGS...
  local name=$1; shift
  $B simulate --calibration "$T/table.json" --cost-log "$T/$name.jsonl" "$@" > "$T/$name.log"
}
sim mlp16_n2 $MLP16 --tokens 8192 --gpus 2 --steps 12 --warmup 4

# 3. NVLink from the fastest collectives of a 2-GPU step; kernel_sharing from the in-step op
#    times of traced real steps.
python3 bench/fit_calibration.py --seed "$T/table.json" \
  --collectives-trace $RUNS/2026-11-30-mlp16-traces/trace_mlp16_t8192_k1_sep0.json.gz "$T/mlp16_n2.jsonl" \
  --fsdp "$B" \
  --sharing $RUNS/2026-12-01-llama1b-graph-vs-eager/eager.ops.txt 1 "$LLAMA1B --tokens 8192" \
  --sharing $RUNS/2026-12-01-graph-timeline/llama1b_s1_eager.ops.txt 1 "$LLAMA1B --tokens 2048" \
  --sharing $RUNS/2026-12-01-graph-timeline/mlp16_t2048_eager.ops.txt 1 "$MLP16 --tokens 2048 --optimizer-in-backward 1 --clip-grad-norm 0" \
  --sharing $RUNS/2026-11-30-mlp16-traces/trace_mlp16_t8192_k1_sep0.json.gz 2 "$MLP16 --tokens 8192" \
  --out bench/calibrations/h200.json --log "$T/fit.log"
cat "$T/table.log" "$T/fit.log" > bench/calibrations/h200.log
echo "wrote bench/calibrations/h200.json (fit: bench/calibrations/h200.log)"
