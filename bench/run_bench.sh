#!/usr/bin/env bash
# One benchmark run on the GPU machine: ours (build/fsdp) and PyTorch FSDP2 on the mlp16 workload.
#
#   bench/run_bench.sh RUN_DIR [NGPUS]        e.g. RUN_DIR=bench/runs/$(date +%F)-mlp16-h200x2
#
# NGPUS defaults to all visible GPUs. Needs build/fsdp (built by the caller) and python3 with torch.
# RUN_DIR is the run's folder (bench/README.md). Each row writes RUN_DIR/rows/NAME.json; a failing,
# timed-out or skipped row writes RUN_DIR/rows/NAME.fail.json instead (or beside it) and the run
# goes on. All output goes to RUN_DIR/rows/log.txt (and RUN_DIR/rows/NAME.log).
# At the end: bench/make_table.py -> RUN_DIR/h200x${NGPUS}.{json,md}.
#
# Environment (optional): FSDP_BIN (default build/fsdp), PYTHON (default python3),
# BENCH_BUDGET_S (default 400: a row whose expected time would end past it is skipped),
# BENCH_STEPS / BENCH_WARMUP (default 30 / 5, for both engines), BENCH_OURS_TIMEOUT /
# BENCH_TORCH_TIMEOUT (default 100 / 150 s: a row running longer is killed, its process group too).
set -uo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 RUN_DIR [NGPUS]" >&2
  exit 2
fi

# NVLink SHARP / multicast off, for NCCL, torch symmetric memory and NVSHMEM alike.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

mkdir -p "$1/rows" || exit 2
RUN_DIR=$(cd "$1" && pwd)
OUTDIR=$RUN_DIR/rows  # the rows' files; the table goes into RUN_DIR
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO" || exit 2

if [[ $# -ge 2 ]]; then
  NGPUS=$2
elif [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  NGPUS=$(awk -F, '{print NF}' <<<"$CUDA_VISIBLE_DEVICES")
else
  NGPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
fi
if ! [[ "$NGPUS" =~ ^[0-9]+$ ]] || (( NGPUS < 1 )); then
  echo "run_bench: no GPUs found (NGPUS='$NGPUS')" >&2
  exit 2
fi

FSDP_BIN=${FSDP_BIN:-build/fsdp}
PYTHON=${PYTHON:-python3}
BUDGET_S=${BENCH_BUDGET_S:-400}
STEPS=${BENCH_STEPS:-30}
WARMUP=${BENCH_WARMUP:-5}
LAYERS=16
DIM=4096
# Expected wall time of one row (init included) and its hard limit, seconds.
OURS_EXPECT=20;  OURS_TIMEOUT=${BENCH_OURS_TIMEOUT:-100}
TORCH_EXPECT=45; TORCH_TIMEOUT=${BENCH_TORCH_TIMEOUT:-150}

LOG="$OUTDIR/log.txt"
: >"$LOG"
# Stale results of an earlier run in the same OUTDIR would be merged into the table: remove ours.
rm -f "$OUTDIR"/fsdp_*.json "$OUTDIR"/torch_*.json "$OUTDIR"/fsdp_*.log "$OUTDIR"/torch_*.log "$OUTDIR"/meta.json

say() { echo "[run_bench +$((SECONDS - START))s] $*" | tee -a "$LOG"; }
START=$SECONDS

if [[ ! -x "$FSDP_BIN" ]]; then
  say "WARNING: $FSDP_BIN missing or not executable; our rows will fail"
fi

# meta.json: the machine, for the table's header.
"$PYTHON" - "$OUTDIR/meta.json" "$NGPUS" "$FSDP_BIN" <<'EOF' >>"$LOG" 2>&1
import json, subprocess, sys, time
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception:
        return ""
meta = {"meta": True, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "ngpus": int(sys.argv[2])}
q = sh("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1").split(", ")
if len(q) == 2:
    meta["gpu"], meta["driver"] = q
meta["torch"] = sh(sys.executable + " -c 'import torch; print(torch.__version__, torch.version.cuda)'")
rev = sh("git rev-parse --short HEAD 2>/dev/null")
if rev and sh("git status --porcelain --untracked-files=no 2>/dev/null"):
    rev += "+dirty"
meta["git_rev"] = rev
meta["topology"] = sh("nvidia-smi topo -m 2>/dev/null | head -3")
json.dump(meta, open(sys.argv[1], "w"), indent=2)
EOF
say "OUTDIR=$OUTDIR NGPUS=$NGPUS budget=${BUDGET_S}s steps=$STEPS warmup=$WARMUP"
say "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"

# write_fail NAME STATUS RC CONFIG ENGINE WORLD TOKENS RESHARD K SEP
write_fail() {
  "$PYTHON" - "$OUTDIR" "$@" <<'EOF'
import json, os, sys
outdir, name, status, rc, config, engine, world, tokens, reshard, k, sep = sys.argv[1:12]
def opt_int(v):
    return int(v) if v not in ("", "-") else None
tail = ""
log = os.path.join(outdir, name + ".log")
if os.path.exists(log):
    with open(log, errors="replace") as fh:
        tail = "".join(fh.readlines()[-20:])
rec = {"status": status, "rc": opt_int(rc), "config": config, "engine": engine,
       "world_size": opt_int(world), "tokens_per_rank": opt_int(tokens),
       "reshard_after_forward": None if reshard in ("", "-") else bool(int(reshard)),
       "rs_max_input_buffers": opt_int(k),
       "separate_rs_group": None if sep in ("", "-") else bool(int(sep)), "log_tail": tail}
with open(os.path.join(outdir, name + ".fail.json"), "w") as fh:
    json.dump(rec, fh, indent=2)
EOF
}

# run_row NAME CONFIG ENGINE WORLD TOKENS RESHARD K SEP EXPECT TIMEOUT -- COMMAND...
# The command must write OUTDIR/NAME.json.
run_row() {
  local name=$1 config=$2 engine=$3 world=$4 tokens=$5 reshard=$6 k=$7 sep=$8 expect=$9 limit=${10}
  shift 11
  local json="$OUTDIR/$name.json" rowlog="$OUTDIR/$name.log"
  rm -f "$json" "$OUTDIR/$name.fail.json" "$rowlog"
  local elapsed=$((SECONDS - START))
  if (( elapsed + expect > BUDGET_S )); then
    say "SKIP  $engine '$config' (time budget: ${elapsed}s used, ~${expect}s more > ${BUDGET_S}s)"
    write_fail "$name" "skipped (time budget)" "" "$config" "$engine" "$world" "$tokens" "$reshard" "$k" "$sep"
    return 0
  fi
  say "START $engine '$config' ($world GPU): $*"
  local t0=$SECONDS rc
  # timeout signals the whole process group: torchrun's workers and our forked ranks too.
  timeout -k 10 "$limit" "$@" >"$rowlog" 2>&1
  rc=$?
  {
    echo "----- $name ($engine '$config') rc=$rc $((SECONDS - t0))s"
    cat "$rowlog"
    echo "-----"
  } >>"$LOG"
  if [[ $rc -ne 0 || ! -s "$json" ]]; then
    local status=failed
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then status="timeout (${limit}s)"; fi
    if [[ $rc -eq 0 ]]; then status="no result file"; fi
    write_fail "$name" "$status" "$rc" "$config" "$engine" "$world" "$tokens" "$reshard" "$k" "$sep"
    say "FAIL  $engine '$config': $status rc=$rc after $((SECONDS - t0))s (tail in $name.log)"
    tail -n 5 "$rowlog" | sed 's/^/    /'
  else
    say "DONE  $engine '$config' in $((SECONDS - t0))s: $(grep -E '^done:' "$rowlog" | tail -n 1)"
  fi
  return 0
}

# ours N TOKENS RESHARD K SEP [OPTIMIZER_IN_BACKWARD=1]
ours() {
  local n=$1 t=$2 r=$3 k=$4 s=$5 oib=${6:-1} name config suffix=""
  if (( oib == 0 )); then suffix=" oib0"; fi
  if (( n == 1 )); then
    name="fsdp_n1_t${t}_oib${oib}"; config="mlp${LAYERS} t${t} 1gpu${suffix}"
  else
    name="fsdp_n${n}_t${t}_r${r}_k${k}_s${s}_oib${oib}"; config="mlp${LAYERS} t${t} reshard${r} k${k} sep${s}${suffix}"
  fi
  run_row "$name" "$config" fsdp "$n" "$t" "$r" "$k" "$s" "$OURS_EXPECT" "$OURS_TIMEOUT" -- \
    "$FSDP_BIN" train --backend cuda --nproc "$n" --model mlp --layers "$LAYERS" --dim "$DIM" \
    --tokens "$t" --param-dtype bf16 --steps "$STEPS" --warmup "$WARMUP" \
    --reshard-after-forward "$r" --rs-max-input-buffers "$k" --separate-rs-group "$s" \
    --optimizer-in-backward "$oib" --clip-grad-norm 0 --quiet --json "$OUTDIR/$name.json"
}

# torch_fsdp N TOKENS RESHARD
torch_fsdp() {
  local n=$1 t=$2 r=$3
  local name="torch_n${n}_t${t}_r${r}" config="mlp${LAYERS} t${t} reshard${r}"
  run_row "$name" "$config" torch-fsdp2 "$n" "$t" "$r" - - "$TORCH_EXPECT" "$TORCH_TIMEOUT" -- \
    "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$n" bench/torch_fsdp2.py \
    --layers "$LAYERS" --dim "$DIM" --tokens "$t" --steps "$STEPS" --warmup "$WARMUP" \
    --reshard-after-forward "$r" --config "$config" --json "$OUTDIR/$name.json"
}

# torch_local TOKENS
torch_local() {
  local t=$1
  local name="torch_local_t${t}" config="mlp${LAYERS} t${t} 1gpu"
  run_row "$name" "$config" torch-local 1 "$t" - - - "$TORCH_EXPECT" "$TORCH_TIMEOUT" -- \
    "$PYTHON" bench/torch_fsdp2.py --local \
    --layers "$LAYERS" --dim "$DIM" --tokens "$t" --steps "$STEPS" --warmup "$WARMUP" \
    --config "$config" --json "$OUTDIR/$name.json"
}

N=$NGPUS
if (( N >= 2 )); then
  # Most important first: the base rows of both engines at 8192 and 2048 tokens per rank.
  ours "$N" 8192 1 1 0
  torch_fsdp "$N" 8192 1
  ours "$N" 2048 1 1 0
  torch_fsdp "$N" 2048 1
  # Compute references and reshard_after_forward=False.
  ours 1 8192 1 1 0
  torch_local 8192
  ours "$N" 8192 0 1 0
  torch_fsdp "$N" 8192 0
  # The optimizer after backward (as FSDP2 does) instead of in it.
  ours "$N" 8192 1 1 0 0
  ours 1 8192 1 1 0 0
  # Our reduce-scatter knobs at 8192.
  ours "$N" 8192 1 2 0
  ours "$N" 8192 1 1 1
  ours "$N" 8192 1 2 1
  # The 2048 compute references.
  ours 1 2048 1 1 0
  torch_local 2048
  # Extras, if the budget allows.
  ours "$N" 2048 1 2 1
  ours "$N" 2048 0 1 0
else
  say "only 1 GPU: running the 1-GPU rows only"
  ours 1 8192 1 1 0
  torch_local 8192
  ours 1 2048 1 1 0
  torch_local 2048
fi

say "make_table -> $RUN_DIR/h200x${N}.json, $RUN_DIR/h200x${N}.md"
"$PYTHON" bench/make_table.py "$OUTDIR" --out "$RUN_DIR/h200x${N}.json" \
  --md "$RUN_DIR/h200x${N}.md" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
if [[ -f "$RUN_DIR/h200x${N}.md" ]]; then
  cat "$RUN_DIR/h200x${N}.md"
fi
say "finished in $((SECONDS - START))s (make_table rc=$rc)"
exit "$rc"
