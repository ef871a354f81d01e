#!/usr/bin/env bash
# Measures a simulation calibration on this GPU machine (docs/simulate.md), in one command:
#   bash bench/calibrate_gpu.sh [OUT_DIR]      (default: $OUT/calibration, else /tmp/calibration)
# writes OUT_DIR/calibration.json, OUT_DIR/calibrate.log (everything printed) and the inputs of
# the fit: op_sweep.jsonl (GEMMs and attention alone), collectives.jsonl (with 2 or more GPUs),
# a traced real step of each calibration config (*.trace.json.gz, *.train.json) and the
# simulation of the same commands (*.costs.jsonl). Op timings only go into the fit, never a
# step time; the last table sets each config's measured step beside its prediction.
# Builds build-gpu (incremental when it is there). About 5 minutes after the build on an H200.
set -uo pipefail
OUT_DIR=${1:-${OUT:+$OUT/calibration}}
OUT_DIR=${OUT_DIR:-/tmp/calibration}
mkdir -p "$OUT_DIR"
exec > >(tee "$OUT_DIR/calibrate.log") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS
stamp() { echo "[$((SECONDS - T0)) s] $*"; }

stamp "build"
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON \
   -DCMAKE_CUDA_ARCHITECTURES=90a && cmake --build build-gpu -j"$(nproc)" --target fsdp_tool op_sweep collective_sweep) \
  > "$OUT_DIR/build.log" 2>&1 || { tail -30 "$OUT_DIR/build.log"; exit 1; }
B=build-gpu/fsdp
GPUS=$(nvidia-smi -L | wc -l)
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
stamp "$GPUS x $DEVICE, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

stamp "GEMMs and attention alone (bench/op_sweep)"
timeout 300 build-gpu/bench/op_sweep 5 > "$OUT_DIR/op_sweep.jsonl" || stamp "op_sweep failed (rc $?)"
COLL=()
if [ "$GPUS" -ge 2 ]; then
  stamp "collectives over $GPUS GPUs (bench/collective_sweep)"
  timeout 120 build-gpu/bench/collective_sweep 10 > "$OUT_DIR/collectives.jsonl" \
    && COLL=(--collectives "$OUT_DIR/collectives.jsonl") || stamp "collective_sweep failed (rc $?)"
fi
# The sweep's embedding kernels gather and scatter one id: not what a step does (make_h200.sh).
grep -v '"class": "embedding_' "$OUT_DIR/op_sweep.jsonl" > "$OUT_DIR/memory.jsonl"
python3 bench/fit_calibration.py --seed bench/calibrations/h200_seed.json --device "$DEVICE" \
  --gemms "$OUT_DIR/op_sweep.jsonl" --attention "$OUT_DIR/op_sweep.jsonl" \
  --grouped "$OUT_DIR/op_sweep.jsonl" --memory "$OUT_DIR/memory.jsonl" "${COLL[@]}" \
  --out "$OUT_DIR/table.json" --log "$OUT_DIR/table.log" || exit 1

# The calibration configs: one real traced step each (synthetic data), and its simulation.
LLAMA1B="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048
  --vocab 32000 --param-dtype bf16 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0
  --warmup-steps 5 --optimizer-in-backward 0"
MLP16="--model mlp --layers 16 --dim 4096 --param-dtype bf16 --optimizer-in-backward 1 --clip-grad-norm 0"
MOE="--model moe-transformer --layers 16 --dim 2048 --heads 16 --kv-heads 4 --ffn-dim 5504 --seq-len 2048
  --vocab 4096 --experts 8 --top-k 2 --expert-ffn-dim 1408 --capacity-factor 0 --aux-loss-weight 0.01
  --param-dtype bf16 --clip-grad-norm 1.0 --optimizer-in-backward 0 --tokens 8192"
LLAMA1B=$(echo $LLAMA1B) MOE=$(echo $MOE)  # one line each: the configs below are split on '|'
CONFIGS=(
  "llama1b_s1|1|$LLAMA1B --tokens 2048"
  "llama1b_s4|1|$LLAMA1B --tokens 8192"
  "mlp16_t2048|1|$MLP16 --tokens 2048"
  "mlp16_t8192|1|$MLP16 --tokens 8192"
  "moe_ep1|1|$MOE"
)
[ "$GPUS" -ge 2 ] && CONFIGS+=("mlp16_t8192_n2|2|$MLP16 --tokens 8192" "moe_ep2|2|$MOE --ep 2")
STEPS=()
SHARING=()
for c in "${CONFIGS[@]}"; do
  IFS='|' read -r name n args <<< "$c"
  stamp "real step: $name ($n GPU)"
  # shellcheck disable=SC2086
  timeout 180 $B train --backend cuda --nproc "$n" --steps 10 --warmup 4 --quiet $args \
    --trace "$OUT_DIR/$name.trace.json" --json "$OUT_DIR/$name.train.json" > "$OUT_DIR/$name.train.log" 2>&1 \
    || { stamp "$name failed (rc $?): $(tail -1 "$OUT_DIR/$name.train.log")"; continue; }
  # shellcheck disable=SC2086
  $B simulate --gpus "$n" --steps 10 --warmup 4 $args --calibration "$OUT_DIR/table.json" \
    --cost-log "$OUT_DIR/$name.costs.jsonl" > "$OUT_DIR/$name.sim.log" 2>&1 || { cat "$OUT_DIR/$name.sim.log"; continue; }
  gzip -f "$OUT_DIR/$name.trace.json"
  STEPS+=(--step "$OUT_DIR/$name.trace.json.gz" "$OUT_DIR/$name.costs.jsonl")
  SHARING+=(--sharing "$OUT_DIR/$name.trace.json.gz" "$n" "$args")
done

stamp "fit"
python3 bench/fit_calibration.py --seed "$OUT_DIR/table.json" "${STEPS[@]}" --fsdp "$B" "${SHARING[@]}" \
  --out "$OUT_DIR/calibration.json" --log "$OUT_DIR/fit.log" || exit 1
# The grouped expert GEMMs' factors and the host's routing from the traced MoE step, replacing
# the grouped GEMMs timed alone (bench/sim_moe_step.py; docs/simulate.md says why).
if [ -f "$OUT_DIR/moe_ep1.trace.json.gz" ]; then
  python3 bench/fit_calibration.py --seed "$OUT_DIR/calibration.json" --fsdp "$B" \
    --moe-step "$OUT_DIR/moe_ep1.trace.json.gz" 1 "$MOE" --out "$OUT_DIR/calibration.json" \
    --log "$OUT_DIR/moe.log" || exit 1
  cat "$OUT_DIR/moe.log" >> "$OUT_DIR/fit.log"
else
  stamp "no MoE trace: the grouped GEMMs keep their alone factors and the host's routing costs nothing"
fi
cat "$OUT_DIR/table.log" "$OUT_DIR/fit.log"

stamp "each config's measured step (traced) beside its prediction"
for c in "${CONFIGS[@]}"; do
  IFS='|' read -r name n args <<< "$c"
  [ -f "$OUT_DIR/$name.train.json" ] || continue
  # shellcheck disable=SC2086
  $B simulate --gpus "$n" $args --calibration "$OUT_DIR/calibration.json" --json "$OUT_DIR/$name.sim.json" > /dev/null 2>&1
  python3 - "$name" "$OUT_DIR/$name.train.json" "$OUT_DIR/$name.sim.json" <<'PY'
import json, sys
name, real, sim = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))["step"]
m, p = real["step_ms_median"], sim["step_ms"]
print(f"{name:16s} measured {m:8.2f} ms  predicted {p:8.2f} ms  {100 * (p - m) / m:+6.1f}%  "
      f"peak {real['peak_mem_bytes'] / 2**30:.2f} GiB measured, {sim['peak_mem_bytes'] / 2**30:.2f} predicted")
PY
done
stamp "wrote $OUT_DIR/calibration.json"
