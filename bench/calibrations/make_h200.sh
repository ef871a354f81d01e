#!/usr/bin/env bash
# Makes h200.json, the committed H200 calibration, from op timings measured on an H200 and
# committed under bench/runs/ (never a step time):
#  1. bench/op_sweep on one H200 (2026-12-03-op-sweep/op_sweep.jsonl): every GEMM of the
#     predicted models alone (gemm.table), their attention alone, the MoE transformer's grouped
#     GEMMs (gemm.grouped_factor) and the memory-bound kernels alone (memory.by_op; not the
#     embedding kernels: the sweep gives them one id, so their rows are a cache hit and a
#     single-row scatter-add, not what a step does);
#  2. NVLink from the fastest collectives of the committed 2-GPU mlp16 trace (the sweep's
#     machine had 1 GPU);
#  3. the sharing factors from the op times of traced real steps: the MoE transformer and the
#     3.0B shape of the sweep's call, llama1b at 1 and 4 sequences (and at 4 with the optimizer
#     in forward) and mlp16 at 2048 tokens;
#  4. from the traced MoE step of the sweep's call: gemm.grouped_factor (replacing the sweep's,
#     timed alone) from its grouped expert GEMMs' in-step times, and the host's dropless routing
#     (host.moe_route_us, host.moe_route_backward_us) from the compute stream's idle time where
#     the host routes, each against the simulation of the same command;
#  5. gemm.fp8 scaled by the fp8 GEMM kernels of a traced tensorwise step of the 3.0B shape
#     (bench/runs/2026-12-04-fp8-fused-amax) against their simulated time.
# What nothing measured stays h200_seed.json's. Run from the repository root after building
# build/fsdp:   bash bench/calibrations/make_h200.sh [build] [OP_SWEEP.jsonl]
# bench/calibrate_gpu.sh measures a whole calibration on a GPU machine instead.
set -euo pipefail
B=${1:-build}/fsdp
SWEEP=${2:-bench/runs/2026-12-03-op-sweep/op_sweep.jsonl}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
RUNS=bench/runs
LLAMA1B="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048
  --vocab 32000 --param-dtype bf16 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0
  --warmup-steps 5 --optimizer-in-backward 0"
MLP16="--model mlp --layers 16 --dim 4096 --param-dtype bf16"
MOE="--model moe-transformer --layers 16 --dim 2048 --heads 16 --kv-heads 4 --ffn-dim 5504 --seq-len 2048
  --vocab 4096 --experts 8 --top-k 2 --expert-ffn-dim 1408 --capacity-factor 0 --aux-loss-weight 0.01
  --moe-every 2 --tokens 8192 --param-dtype bf16 --lr 3e-4 --min-lr 3e-5 --warmup-steps 5
  --weight-decay 0.1 --clip-grad-norm 1.0 --optimizer-in-backward 0"
S3B="--model transformer --layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 --seq-len 8192
  --vocab 32000 --tokens 16384 --param-dtype bf16 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1
  --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0"
LLAMA1B=$(echo $LLAMA1B) MOE=$(echo $MOE) S3B=$(echo $S3B)

# 1. Op timings alone.
grep -v '"class": "embedding_' "$SWEEP" > "$T/memory.jsonl"
python3 bench/fit_calibration.py --seed bench/calibrations/h200_seed.json --device "NVIDIA H200" \
  --gemms "$SWEEP" --attention "$SWEEP" --grouped "$SWEEP" --memory "$T/memory.jsonl" \
  --out "$T/table.json" --log "$T/table.log"

# 2. The 2-GPU traced step's command, simulated, for its collectives' bytes; then NVLink from
#    the fastest collectives of that step.
$B simulate --calibration "$T/table.json" --cost-log "$T/mlp16_n2.jsonl" $MLP16 --tokens 8192 \
  --gpus 2 --steps 12 --warmup 4 > "$T/mlp16_n2.log"
python3 bench/fit_calibration.py --seed "$T/table.json" \
  --collectives-trace $RUNS/2026-11-30-mlp16-traces/trace_mlp16_t8192_k1_sep0.json.gz "$T/mlp16_n2.jsonl" \
  --out "$T/links.json" --log "$T/links.log"

# 3. kernel_sharing and memory_kernel_sharing from the in-step op times of traced real steps.
S=$(dirname "$SWEEP")
python3 bench/fit_calibration.py --seed "$T/links.json" --fsdp "$B" \
  --sharing "$S/moe.trace.json.gz" 1 "$MOE" \
  --sharing "$S/s3b.trace.json.gz" 1 "$S3B" \
  --sharing $RUNS/2026-12-01-llama1b-graph-vs-eager/eager.ops.txt 1 "$LLAMA1B --tokens 8192" \
  --sharing $RUNS/2026-12-01-graph-timeline/llama1b_s1_eager.ops.txt 1 "$LLAMA1B --tokens 2048" \
  --sharing $RUNS/2026-12-01-graph-timeline/mlp16_t2048_eager.ops.txt 1 "$MLP16 --tokens 2048 --optimizer-in-backward 1 --clip-grad-norm 0" \
  --sharing $RUNS/2026-12-01-optimizer-in-forward/s4_oif1.ops.txt 1 "$LLAMA1B --tokens 8192 --optimizer-in-forward 1" \
  --out "$T/h200.json" --log "$T/sharing.log"

# 4. The MoE step: the grouped GEMMs in-step and the host's routing (bench/sim_moe_step.py).
python3 bench/fit_calibration.py --seed "$T/h200.json" --fsdp "$B" \
  --moe-step "$S/moe.trace.json.gz" 1 "$MOE" --out "$T/h200.json" --log "$T/moe.log"

# 5. gemm.fp8 from the fp8 GEMM kernels of a traced tensorwise step of the 3.0B shape.
F8=bench/runs/2026-12-04-fp8-fused-amax/b3_tensorwise_traced
$B simulate --calibration "$T/h200.json" --cost-log "$T/b3_fp8.jsonl" $S3B --fp8 tensorwise \
  --gpus 1 --steps 4 --warmup 1 > "$T/b3_fp8.log"
python3 bench/fit_calibration.py --seed "$T/h200.json" --fp8-step "$F8.trace.json.gz" "$T/b3_fp8.jsonl" \
  --out "$T/h200.json" --log "$T/fp8.log"

# 6. The notes say where each value comes from.
python3 - "$T/h200.json" "$SWEEP" bench/calibrations/h200_seed.json <<'PY'
import json, sys
out, sweep, seed = sys.argv[1], sys.argv[2], sys.argv[3]
cal, s = json.load(open(out)), json.load(open(seed))
by_op = cal["memory"]["by_op"]
from_seed = sorted(k for k, v in by_op.items() if s["memory"]["by_op"].get(k) == v)
cal["notes"] = [
    f"Timed alone on one H200 by bench/op_sweep ({sweep}): the GEMM table (every GEMM shape of "
    "llama1b, the Llama-3.2-1B, 3.0B, Llama-3.1-8B and -70B shapes and mlp16), attention by shape, "
    "the memory-bound kernels "
    f"({', '.join(sorted(k for k in by_op if k not in from_seed))}).",
    "gemm.grouped_factor (the MoE transformer's grouped expert GEMMs against the table's time for "
    "the same groups one by one) and host.moe_route_us, host.moe_route_backward_us (the host's "
    "dropless routing, per MoE layer): from the in-step op times and the compute stream's idle "
    "time of the traced MoE step of the same call, against its simulation (h200.log; the "
    "grouped GEMMs timed alone gave 1.71-1.81).",
    "NVLink (links.nvlink base_us and busbw_gbps) from the fastest collectives of the 2-GPU mlp16 "
    "trace bench/runs/2026-11-30-mlp16-traces (no collective was timed on the 1-GPU machine).",
    "kernel_sharing, memory_kernel_sharing, memory_kernel_yield and memory_kernel_lead: fitted on the in-step op times of traced steps (the sources list them).",
    "gemm.fp8: h200_seed.json's ratios (GEMM floors alone at llama1b's shapes) scaled by the in-step fp8 GEMM kernels of the traced tensorwise 3.0B step bench/runs/2026-12-04-fp8-fused-amax against their simulated time (h200.log).",
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
cat "$T/table.log" "$T/links.log" "$T/sharing.log" "$T/moe.log" "$T/fp8.log" > bench/calibrations/h200.log
echo "wrote bench/calibrations/h200.json (fit: bench/calibrations/h200.log)"
