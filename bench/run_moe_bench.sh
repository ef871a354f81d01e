#!/usr/bin/env bash
# The MoE benchmark (docs/moe.md) on the GPUs of one machine: ours for k = 1 and 2
# RS input buffers with the separate RS group off and on, beside PyTorch FSDP2 in torchtitan's
# layout (bench/torch_moe.py), the same model, data and recipe, in the same run.
#
#   bench/run_moe_bench.sh OUTDIR [DATA_DIR]       run the rows, write OUTDIR/moe_rows.{json,md}
#   bench/run_moe_bench.sh --table OUTDIR          only (re)write OUTDIR/moe_rows.{json,md} from the
#                                                   rows' files there (same NPROC, EP, STEPS, ROWS)
#   bench/run_moe_bench.sh --merge OUTDIR RESULTS  merge them into RESULTS.json and RESULTS.md,
#                                                   keeping every row of another config
#
# OUTDIR is best a run folder, bench/runs/DATE-purpose/ (bench/README.md).
#
# DATA_DIR (or $MOE_DATA; default data/pydocs-4k) is a corpus made by `fsdp prepare-data`.
# $FSDP_BIN is our binary (default build-gpu/fsdp, already built), $PYTHON the interpreter with
# PyTorch (default python3; the torch row runs under `$PYTHON -m torch.distributed.run`).
# $NPROC GPUs (default 1); $EP expert-parallel ranks (default: 2 when NPROC >= 2, else 1: on one
# GPU ep is 1 and every row says so). $STEPS (default 100: the peak at step 100 is a column).
# $ROWS picks rows (default: all, in this order): ours_k1_sep0 ours_k2_sep0 ours_k1_sep1
# ours_k2_sep1 torch. $OURS_FLAGS adds flags to our rows (--fp8 tensorwise: not the torch row's
# recipe, so such a table is no comparison with it).
#
# Model: dim 2048, 16 layers (blocks 1, 3, ..., 15 MoE), 16 heads and 4 kv heads
# (head dim 128), dense FFN 5504 (8 dim / 3 rounded up to 64, our default), 8 experts, top-2,
# FFN 1408 per expert, dropless, aux loss 0.01, seq 2048, 4 sequences per GPU, vocab of the
# corpus. Recipe: bf16 params, fp32 reduce, AdamW (betas 0.9/0.999, weight decay 0.1), lr 3e-4
# -> 3e-5 cosine after 5 warm-up steps, global-norm clipping 1.0. Steps 6.. are timed.
set -u -o pipefail

die() { echo "run_moe_bench: $*" >&2; exit 2; }
PYTHON=${PYTHON:-python3}
NPROC=${NPROC:-1}

merge() {  # OUTDIR RESULTS_BASE
  "$PYTHON" - "$1" "$2" <<'EOF'
import json, os, sys
out, base = sys.argv[1], sys.argv[2]
rows = json.load(open(os.path.join(out, "moe_rows.json")))
table = open(os.path.join(out, "moe_rows.md")).read()
path = base + ".json"
old = json.load(open(path)) if os.path.exists(path) else []
kept = [r for r in old if r.get("config") != "moe-llama"]
with open(path, "w") as f:
    json.dump(kept + rows, f, indent=2)
    f.write("\n")
md = base + ".md"
text = open(md).read() if os.path.exists(md) else ""
begin, end = "<!-- moe-llama rows: bench/run_moe_bench.sh -->", "<!-- end moe-llama rows -->"
section = f"{begin}\n{table.rstrip()}\n{end}\n"
if begin in text and end in text:
    text = text[:text.index(begin)] + section + text[text.index(end) + len(end) + 1:]
else:
    text = text.rstrip() + "\n\n" + section
open(md, "w").write(text)
print(f"merged {len(rows)} moe-llama rows into {path} ({len(kept)} other rows kept) and {md}")
EOF
}

if [[ "${1:-}" == "--merge" ]]; then
  [[ -n "${2:-}" && -n "${3:-}" ]] || die "usage: bench/run_moe_bench.sh --merge OUTDIR RESULTS_BASE"
  merge "$2" "$3"
  exit $?
fi

TABLE_ONLY=0
if [[ "${1:-}" == "--table" ]]; then
  TABLE_ONLY=1
  shift
fi
OUTDIR=${1:?usage: bench/run_moe_bench.sh OUTDIR [DATA_DIR]}
DATA=${2:-${MOE_DATA:-data/pydocs-4k}}
FSDP_BIN=${FSDP_BIN:-build-gpu/fsdp}
EP=${EP:-$(( NPROC >= 2 ? 2 : 1 ))}
STEPS=${STEPS:-100}
ROWS=${ROWS:-"ours_k1_sep0 ours_k2_sep0 ours_k1_sep1 ours_k2_sep1 torch"}
TIMED_FROM=5
SEQ=2048
SEQS=4

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

[[ -f "$DATA/train.bin" && -f "$DATA/meta.json" ]] || die "$DATA has no train.bin and meta.json (fsdp prepare-data)"
(( TABLE_ONLY )) || [[ -x "$FSDP_BIN" ]] || die "$FSDP_BIN is not an executable (build it first, or set FSDP_BIN)"
(( NPROC % EP == 0 )) || die "EP=$EP does not divide NPROC=$NPROC"
(( STEPS > TIMED_FROM )) || die "STEPS must be above $TIMED_FROM"
VOCAB=$("$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab'])" "$DATA/meta.json") ||
  die "cannot read the vocab of $DATA/meta.json"
mkdir -p "$OUTDIR" || die "cannot create $OUTDIR"

MODEL="--layers 16 --dim 2048 --heads 16 --kv-heads 4 --ffn-dim 5504 --seq-len $SEQ --vocab $VOCAB"
MOE="--experts 8 --top-k 2 --expert-ffn-dim 1408 --capacity-factor 0 --aux-loss-weight 0.01 --moe-every 2 --ep $EP"
RECIPE="--lr 3e-4 --min-lr 3e-5 --warmup-steps 5 --weight-decay 0.1 --clip-grad-norm 1.0"

run_row() {  # NAME TIMEOUT COMMAND...: its exit status lands in NAME.status
  local name=$1 limit=$2
  shift 2
  echo "$*" > "$OUTDIR/$name.cmd"
  echo "== $name (timeout ${limit}s): $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$OUTDIR/$name.log" 2>&1
  local rc=$?
  echo "$rc" > "$OUTDIR/$name.status"
  echo "   rc=$rc in $((SECONDS - t0)) s; $(tail -1 "$OUTDIR/$name.log")"
}
ours() {  # NAME K SEPARATE_RS
  run_row "$1" "${ROW_TIMEOUT:-240}" "$FSDP_BIN" train --backend cuda --nproc "$NPROC" --world-size "$NPROC" \
    --model moe-transformer $MODEL $MOE --tokens $((SEQS * SEQ)) --steps "$STEPS" --warmup $TIMED_FROM \
    --param-dtype bf16 --optimizer adamw $RECIPE --lr-schedule cosine --data "$DATA" --eval-every 0 \
    --optimizer-in-backward 0 --rs-max-input-buffers "$2" --separate-rs-group "$3" ${OURS_FLAGS:-} --quiet \
    --json "$OUTDIR/$1.json"
}

T0=$SECONDS
(( TABLE_ONLY )) ||
for row in $ROWS; do
  case $row in
    ours_k1_sep0) ours "$row" 1 0 ;;
    ours_k2_sep0) ours "$row" 2 0 ;;
    ours_k1_sep1) ours "$row" 1 1 ;;
    ours_k2_sep1) ours "$row" 2 1 ;;
    torch) run_row torch "${TORCH_TIMEOUT:-300}" "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$NPROC" \
             bench/torch_moe.py --data "$DATA/train.bin" $MODEL $MOE --batch $SEQS --steps "$STEPS" \
             --bench-warmup $TIMED_FROM $RECIPE --beta2 0.999 --param-dtype bf16 --log-every 10 \
             --out "$OUTDIR/torch.json" ;;
    *) die "unknown row '$row' (rows: ours_k1_sep0 ours_k2_sep0 ours_k1_sep1 ours_k2_sep1 torch)" ;;
  esac
done
(( TABLE_ONLY )) || echo "rows done in $((SECONDS - T0)) s"

# ---- the rows: tokens/s per GPU (median step), MFU on active params, peaks (all, step 3, step 100)
export GPU_NAME=${GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)}
export OURS_FLAGS=${OURS_FLAGS:-}
"$PYTHON" - "$OUTDIR" "$ROWS" "$NPROC" "$EP" "$VOCAB" "$STEPS" <<'EOF'
import json, os, sys

out, rows, world, ep, V, steps = sys.argv[1], sys.argv[2].split(), *map(int, sys.argv[3:])
L, D, H, KV, F, T, E, K, FE = 16, 2048, 16, 4, 5504, 2048, 8, 2, 1408
hd = D // H
attention = D * (H + 2 * KV) * hd + H * hd * D + 2 * D
moe_layers = L // 2
active = V * D + D + (L - moe_layers) * (attention + 3 * D * F) + moe_layers * (attention + E * D + K * 3 * D * FE)
total = 2 * V * D + D + (L - moe_layers) * (attention + 3 * D * F) + moe_layers * (attention + E * D + E * 3 * D * FE)
flops_per_token = 6 * active + 12 * L * H * hd * T  # active non-embedding params (nn::flops_per_token)
PEAK, GIB, SEQS = 989e12, float(1 << 30), 4

def read(name):
    try:
        with open(os.path.join(out, name + ".json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

result = []
for name in rows:
    ours = name.startswith("ours")
    rc_path = os.path.join(out, name + ".status")
    rc = open(rc_path).read().strip() if os.path.exists(rc_path) else "not run"
    cmd_path = os.path.join(out, name + ".cmd")
    row = {"config": "moe-llama", "engine": "fsdp" if ours else "torch-fsdp2 (torchtitan layout)",
           "world_size": world, "ep": ep, "efsdp": world // ep,
           "rs_max_input_buffers": int(name[6]) if ours else None,
           "separate_rs_group": int(name[-1]) if ours else None,
           "sequences_per_rank": SEQS, "seq_len": T, "steps": steps, "step_ms": None,
           "tokens_per_s_per_gpu": None, "mfu": None, "peak_mem_gib": None,
           "peak_mem_gib_step3": None, "peak_mem_gib_step100": None,
           "command": open(cmd_path).read().strip() if os.path.exists(cmd_path) else None,
           "status": "ok" if rc == "0" else ("timeout" if rc in ("124", "137") else f"failed (rc {rc})"),
           "source": name}
    if world == 1:
        row["note"] = "one GPU: ep 1 (no all-to-all; expert parallelism needs 2 GPUs)"
    j = read(name)
    if j is not None:
        step_ms = j.get("step_ms_median")
        if step_ms:
            tps = SEQS * T / (step_ms * 1e-3)
            row.update(step_ms=round(step_ms, 2), tokens_per_s_per_gpu=round(tps),
                       mfu=round(flops_per_token * tps / PEAK, 4),
                       peak_mem_gib=round(j.get("peak_mem_bytes", 0) / GIB, 2))
        by_step = j.get("peak_mem_bytes_by_step") or []
        if len(by_step) >= 3:
            row["peak_mem_gib_step3"] = round(by_step[2] / GIB, 3)
        if len(by_step) >= 100:
            row["peak_mem_gib_step100"] = round(by_step[99] / GIB, 3)
        losses = j.get("losses")
        if isinstance(losses, list) and losses:
            row["loss_first_last"] = [losses[0], losses[-1]]
        if not ours:
            row["step_ms_mean"] = j.get("step_ms_mean")
            row["expert_gemm"] = j.get("expert_gemm")
    elif row["status"] == "ok":
        row["status"] = "no json"
    result.append(row)

with open(os.path.join(out, "moe_rows.json"), "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")

def fmt(v, spec):
    return "-" if v is None else format(v, spec)

base = next((r for r in result if not r["source"].startswith("ours")), None)
gpu = os.environ.get("GPU_NAME") or "GPU (name unknown)"
lines = [f"## moe-llama on {world} x {gpu} (world_size {world}, ep {ep})", "",
         f"dim {D}, {L} layers (blocks 1, 3, ..., 15 MoE), {H} heads / {KV} kv heads, dense FFN {F}, "
         f"{E} experts top-{K} of FFN {FE} (dropless, aux 0.01), seq {T}, vocab {V}, {SEQS} sequences per GPU; "
         f"{total / 1e9:.2f}B params, {(active + V * D) / 1e9:.2f}B active. bf16 params, fp32 reduce, AdamW, "
         f"clipping 1.0. MFU = flops/token x tokens/s / 989 TFLOP/s, flops/token = 6 x active non-embedding "
         f"params + 12 L D T = {flops_per_token:.4g}. Step ms: median of steps {6}..{steps}. Peak at step N: "
         "the allocator's peak since the first step, read after step N.", "",
         "| engine | k | separate RS | step ms | tokens/s/GPU | MFU | peak GiB | peak step 3 | peak step 100 | vs FSDP2 | status |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
for r in result:
    speed = (base["step_ms"] / r["step_ms"]) if base and base["step_ms"] and r["step_ms"] else None
    lines.append(f"| {r['engine']} | {fmt(r['rs_max_input_buffers'], 'd')} | {fmt(r['separate_rs_group'], 'd')} | "
                 f"{fmt(r['step_ms'], '.1f')} | {fmt(r['tokens_per_s_per_gpu'], '.0f')} | {fmt(r['mfu'], '.1%')} | "
                 f"{fmt(r['peak_mem_gib'], '.2f')} | {fmt(r['peak_mem_gib_step3'], '.3f')} | "
                 f"{fmt(r['peak_mem_gib_step100'], '.3f')} | {fmt(speed, '.2f') + ('x' if speed else '')} | {r['status']} |")
if os.environ.get("OURS_FLAGS"):
    lines += ["", f"Our rows add `{os.environ['OURS_FLAGS']}` (bench/run_moe_bench.sh's OURS_FLAGS), which the "
              "FSDP2 row's recipe does not have."]
if world == 1:
    lines += ["", "One GPU: ep 1 (dp 1, efsdp 1), so no all-to-all runs; the 2-GPU rows (ep 2) need a 2-GPU machine."]
lines += ["", "Commands (bench/run_moe_bench.sh):"]
for r in result:
    if r["command"]:
        lines.append(f"- `{r['source']}`: `{r['command']}`")
with open(os.path.join(out, "moe_rows.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
