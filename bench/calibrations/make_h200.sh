#!/usr/bin/env bash
# Makes h200.json, the committed H200 calibration, from a calibration measured on one H200 by
# bench/calibrate_gpu.sh (op timings only: every GEMM and memory-bound kernel of the predicted
# models alone, attention per call and kernel_sharing from the op times of traced real steps;
# never a step time), plus NVLink from the fastest collectives of a committed 2-GPU trace
# (that machine lent only 1 GPU). Values nothing measured stay h200_seed.json's. Run from the
# repository root after building build/fsdp:
#   bash bench/calibrations/make_h200.sh [build] [MEASURED_CALIBRATION.json]
set -euo pipefail
B=${1:-build}/fsdp
MEASURED=${2:-bench/runs/2026-12-03-h200-calibration/calibration.json}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
RUNS=bench/runs
MLP16="--model mlp --layers 16 --dim 4096 --param-dtype bf16"

# 1. The 2-GPU traced step's command, simulated, for its collectives' bytes.
$B simulate --calibration "$MEASURED" --cost-log "$T/mlp16_n2.jsonl" $MLP16 --tokens 8192 \
  --gpus 2 --steps 12 --warmup 4 > "$T/mlp16_n2.log"

# 2. NVLink's base and bus bandwidth from the fastest collectives of that 2-GPU step.
python3 bench/fit_calibration.py --seed "$MEASURED" \
  --collectives-trace $RUNS/2026-11-30-mlp16-traces/trace_mlp16_t8192_k1_sep0.json.gz "$T/mlp16_n2.jsonl" \
  --out "$T/h200.json" --log "$T/fit.log"

# 3. The notes say where each value comes from: the measured run's, the trace's, the seed's.
python3 - "$T/h200.json" "$MEASURED" bench/calibrations/h200_seed.json <<'PY'
import json, sys
out, measured, seed = sys.argv[1], sys.argv[2], sys.argv[3]
cal, s = json.load(open(out)), json.load(open(seed))
run = measured.rsplit("/", 1)[0]
by_op = cal["memory"]["by_op"]
from_seed = sorted(k for k, v in by_op.items() if s["memory"]["by_op"].get(k) == v)
cal["notes"] = [
    f"Measured on one H200 by bench/calibrate_gpu.sh ({run}: calibration.json, calibrate.log "
    "lists every op's time): the GEMM table (every GEMM shape of the predicted models, timed "
    "alone by bench/op_sweep), the memory-bound kernels timed alone "
    f"({', '.join(sorted(k for k in by_op if k not in from_seed))}), attention per call from "
    "traced real steps (op_sweep's attention did not run there), kernel_sharing from the op "
    "times of those traced steps.",
    "NVLink (links.nvlink base_us and busbw_gbps) from the fastest collectives of the 2-GPU mlp16 "
    "trace bench/runs/2026-11-30-mlp16-traces (no collective was timed on the 1-GPU machine).",
    "From h200_seed.json, which nothing measured replaces (its notes say where each comes "
    f"from): host launch costs, kernel_min_us, memory.gbps, memory.host_copy_gbps, memory.by_op "
    f"{', '.join(from_seed)}, attention's default TFLOP/s, links.nvlink.latency_us and "
    "links.network.",
]
with open(out, "w") as f:
    json.dump(cal, f, indent=1)
    f.write("\n")
PY
cp "$T/h200.json" bench/calibrations/h200.json
{ echo "measured calibration: $MEASURED (its fit: $(dirname "$MEASURED")/calibrate.log)"; cat "$T/fit.log"; } \
  > bench/calibrations/h200.log
echo "wrote bench/calibrations/h200.json (fit: bench/calibrations/h200.log)"
