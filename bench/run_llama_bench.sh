#!/usr/bin/env bash
# The llama1b benchmark of docs/transformer.md on one GPU: ours beside PyTorch FSDP2 (eager and
# torch.compile, bench/torch_llama.py), the same recipe, at 4 and at 1 sequence(s) of 2048 per
# rank.
#
#   bench/run_llama_bench.sh OUTDIR [DATA_DIR]
#
# DATA_DIR (or $LLAMA_DATA) is a corpus made by `fsdp prepare-data` (train.bin, meta.json) with a
# vocabulary of at most 32000, e.g. data/pydocs-4k. $FSDP_BIN is our binary (default build-gpu/fsdp, already built), $PYTHON the
# interpreter with PyTorch (default python3). $ROWS picks rows (default: all, in this order):
#   ours4 ours1 ours4_autotune torch4 torch1 compile4 compile1
# Recipe, both engines: llama1b (22 layers, dim 2048, 32 heads, 4 kv heads, ffn 5632, vocab
# 32000, seq 2048), bf16 params, fp32 reduce, AdamW (lr 3e-4 -> 3e-5 cosine after 5 warm-up
# steps, weight decay 0.1), global-norm clipping 1.0, 20 steps of which the first 5 are untimed.
# Each row has a timeout; the whole run takes about 6 minutes of GPU time.
#
# Writes into OUTDIR: one NAME.json and NAME.log per row, h200x1.json (the rows: config, engine,
# world_size, sequences_per_rank, step_ms, tokens_per_s_per_gpu, mfu, peak_mem_gib, command,
# status) and h200x1.md (the same as a table, with the targets). OUTDIR is best a run folder,
# bench/runs/DATE-purpose/ (bench/README.md).
#
# Our recipe flags are checked against `fsdp train --help` first: a missing one stops the script
# with its name, unless LLAMA_BENCH_ALLOW_MISSING=1, which runs without it and says so in the row.
set -u -o pipefail

OUTDIR=${1:?usage: bench/run_llama_bench.sh OUTDIR [DATA_DIR]}
DATA=${2:-${LLAMA_DATA:-}}
FSDP_BIN=${FSDP_BIN:-build-gpu/fsdp}
PYTHON=${PYTHON:-python3}
ROWS=${ROWS:-"ours4 ours1 ours4_autotune torch4 torch1 compile4 compile1"}
STEPS=20
TIMED_FROM=5

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

die() { echo "run_llama_bench: $*" >&2; exit 2; }
[[ -n "$DATA" ]] || die "no data: pass DATA_DIR (or set LLAMA_DATA) to a directory with train.bin (vocab 32000)"
[[ -f "$DATA/train.bin" ]] || die "$DATA/train.bin does not exist (make it with: fsdp prepare-data --vocab 32000 --input ... --out $DATA)"
[[ -x "$FSDP_BIN" ]] || die "$FSDP_BIN is not an executable (build it first, or set FSDP_BIN)"
mkdir -p "$OUTDIR" || die "cannot create $OUTDIR"

MODEL="--layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048 --vocab 32000"
SEQ=2048

# ---- our flags: the recipe needs every one of these
HELP=$("$FSDP_BIN" train --help 2>&1) || die "'$FSDP_BIN train --help' failed: $HELP"
has_flag() { grep -qE -- "(^|[ ,])$1([ ,=]|$)" <<<"$HELP"; }
declare -A OUR_VALUE=(
  [--lr]=3e-4 [--min-lr]=3e-5 [--lr-schedule]=cosine [--warmup-steps]=5 [--weight-decay]=0.1
  [--clip-grad-norm]=1.0 [--data]="$DATA" [--eval-every]=0)
MISSING=()
RECIPE=""
for flag in --lr --min-lr --lr-schedule --warmup-steps --weight-decay --clip-grad-norm --data \
            --eval-every; do
  if has_flag "$flag"; then
    RECIPE+=" $flag ${OUR_VALUE[$flag]}"
  else
    MISSING+=("$flag")
  fi
done
for flag in --model --tokens --steps --warmup --param-dtype --optimizer --json --quiet \
            --optimizer-in-backward --nproc; do
  has_flag "$flag" || die "fsdp train has no $flag (needed by every row)"
done
if (( ${#MISSING[@]} )); then
  if [[ "${LLAMA_BENCH_ALLOW_MISSING:-0}" != 1 ]]; then
    die "fsdp train lacks ${MISSING[*]}, needed for the same recipe as bench/torch_llama.py;" \
        "build a binary that has them, or set LLAMA_BENCH_ALLOW_MISSING=1 to run without them" \
        "(the rows then say which were left out)"
  fi
  echo "run_llama_bench: running ours WITHOUT ${MISSING[*]} (LLAMA_BENCH_ALLOW_MISSING=1)" >&2
fi
printf '%s\n' "${MISSING[@]}" > "$OUTDIR/ours_missing_flags.txt"
# Clipping needs the whole gradient, so the optimizer runs after backward (as FSDP2's does).
OIB="--optimizer-in-backward 0"

"$PYTHON" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null ||
  echo "run_llama_bench: $PYTHON has no CUDA PyTorch: the torch rows will fail" >&2

# ---- one row: NAME TIMEOUT_S ENV COMMAND...; its exit status lands in NAME.status
run_row() {
  local name=$1 limit=$2 env_assign=$3
  shift 3
  local cmd="$*"
  [[ -n "$env_assign" ]] && cmd="$env_assign $cmd"
  echo "$cmd" > "$OUTDIR/$name.cmd"
  echo "== $name (timeout ${limit}s): $cmd"
  local t0=$SECONDS
  env $env_assign timeout --kill-after=10 "$limit" "$@" > "$OUTDIR/$name.log" 2>&1
  local rc=$?
  echo "$rc" > "$OUTDIR/$name.status"
  echo "   rc=$rc in $((SECONDS - t0)) s; $(tail -1 "$OUTDIR/$name.log")"
}

ours() {  # NAME SEQUENCES TIMEOUT [ENV]
  run_row "$1" "$3" "${4:-}" "$FSDP_BIN" train --backend cuda --nproc 1 --model transformer $MODEL \
    --tokens $(($2 * SEQ)) --steps $STEPS --warmup $TIMED_FROM --param-dtype bf16 \
    --optimizer adamw $RECIPE $OIB --quiet --json "$OUTDIR/$1.json"
}
torch_row() {  # NAME SEQUENCES TIMEOUT [--compile]
  run_row "$1" "$3" "" "$PYTHON" bench/torch_llama.py --data "$DATA/train.bin" $MODEL \
    --batch "$2" --steps $STEPS --bench-warmup $TIMED_FROM --warmup-steps 5 --lr 3e-4 \
    --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --param-dtype bf16 ${4:-} \
    --log-every 5 --out "$OUTDIR/$1.json"
}

T0=$SECONDS
for row in $ROWS; do
  case $row in
    ours4) ours ours4 4 120 ;;
    ours1) ours ours1 1 90 ;;
    ours4_autotune) ours ours4_autotune 4 120 FSDP_GEMM_AUTOTUNE=1 ;;
    torch4) torch_row torch4 4 150 ;;
    torch1) torch_row torch1 1 120 ;;
    compile4) torch_row compile4 4 240 --compile ;;
    compile1) torch_row compile1 1 180 --compile ;;
    *) die "unknown row '$row' (rows: ours4 ours1 ours4_autotune torch4 torch1 compile4 compile1)" ;;
  esac
done
echo "rows done in $((SECONDS - T0)) s"

# ---- the table
"$PYTHON" - "$OUTDIR" "$ROWS" <<'EOF'
import json, os, sys

out, rows = sys.argv[1], sys.argv[2].split()
L, D, H, KV, F, T, V = 22, 2048, 32, 4, 5632, 2048, 32000
hd = D // H
params = 2 * V * D + D + L * (D * (H + 2 * KV) * hd + H * hd * D + 3 * D * F + 2 * D)
flops_per_token = 6 * (params - V * D) + 12 * L * H * hd * T  # docs/transformer.md
PEAK = 989e12  # H200 dense bf16
GIB = float(1 << 30)
missing = [l.strip() for l in open(os.path.join(out, "ours_missing_flags.txt")) if l.strip()]

def read(name):
    path = os.path.join(out, name + ".json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

result = []
for name in rows:
    seqs = 4 if name.endswith("4") or name.endswith("4_autotune") else 1
    ours = name.startswith("ours")
    engine = ("fsdp+autotune" if "autotune" in name else "fsdp") if ours else (
        "torch-fsdp2-compile" if name.startswith("compile") else "torch-fsdp2")
    status_file = os.path.join(out, name + ".status")
    rc = open(status_file).read().strip() if os.path.exists(status_file) else "not run"
    cmd_file = os.path.join(out, name + ".cmd")
    row = {"config": "llama1b", "engine": engine, "world_size": 1, "sequences_per_rank": seqs,
           "seq_len": T, "step_ms": None, "tokens_per_s_per_gpu": None, "mfu": None,
           "peak_mem_gib": None, "command": open(cmd_file).read().strip() if os.path.exists(cmd_file) else None,
           "status": "ok" if rc == "0" else ("timeout" if rc in ("124", "137") else f"failed (rc {rc})"),
           "source": name}
    j = read(name)
    if j is not None:
        step_ms = j.get("step_ms_median")
        if step_ms:
            tps = seqs * T / (step_ms * 1e-3)
            row.update(step_ms=step_ms, tokens_per_s_per_gpu=tps, mfu=flops_per_token * tps / PEAK,
                       peak_mem_gib=j.get("peak_mem_bytes", 0) / GIB)
        if not ours:
            row["step_ms_mean"] = j.get("step_ms_mean")
        losses = j.get("losses")
        if isinstance(losses, list) and losses:
            first, last = losses[0], losses[-1]
            row["loss_first_last"] = [first, last]
    elif row["status"] == "ok":
        row["status"] = "no json"
    if ours and missing:
        row["missing_flags"] = missing
    result.append(row)

with open(os.path.join(out, "h200x1.json"), "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")

def fmt(v, spec):
    return "-" if v is None else format(v, spec)

by = {(r["engine"], r["sequences_per_rank"]): r for r in result}
lines = ["# llama1b on one H200: ours vs PyTorch FSDP2", "",
         f"flops/token {flops_per_token:.4g} (docs/transformer.md), MFU over {PEAK / 1e12:.0f} TFLOP/s; "
         "step ms: median of the timed steps (6..20 of 20).", "",
         "| engine | seqs/rank | step ms | tokens/s/GPU | MFU | peak GiB | vs FSDP2 eager | status |",
         "|---|---|---|---|---|---|---|---|"]
for r in result:
    base = by.get(("torch-fsdp2", r["sequences_per_rank"]))
    speed = (base["step_ms"] / r["step_ms"]) if base and base["step_ms"] and r["step_ms"] else None
    status = r["status"] + (f"; without {' '.join(r['missing_flags'])}" if r.get("missing_flags") else "")
    lines.append(f"| {r['engine']} | {r['sequences_per_rank']} | {fmt(r['step_ms'], '.1f')} | "
                 f"{fmt(r['tokens_per_s_per_gpu'], '.0f')} | {fmt(r['mfu'], '.1%')} | "
                 f"{fmt(r['peak_mem_gib'], '.1f')} | {fmt(speed, '.2f') + ('x' if speed else '')} | {status} |")
lines += ["", "Targets: at 4 sequences tokens/s >= 1.2x FSDP2 eager and not below FSDP2 "
          "compiled, MFU >= 50%; at 1 sequence >= 3x FSDP2 eager; peak memory <= FSDP2's.", ""]
for r in result:
    if r["command"]:
        lines.append(f"- `{r['source']}`: `{r['command']}`")
with open(os.path.join(out, "h200x1.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines[:len(result) + 6]))
EOF
