#!/usr/bin/env bash
# `make run`: a short training run on the best backend this machine has.
#   scripts/run.sh --plan        one line: the GPUs found, the backend and ranks chosen, and why
#   scripts/run.sh --setup-flags the flags `make run` passes to scripts/setup.sh and cmake
#   scripts/run.sh BUILD_DIR     trains with BUILD_DIR/fsdp as planned
# One process per GPU where there are GPUs; otherwise 4 CPU ranks (threads).
set -uo pipefail
cd "$(dirname "$0")/.."

# The run: the Llama-style transformer on the Python documentation corpus (data/pydocs-4k,
# made by `fsdp prepare-data`; data/pydocs-4k/README.md), with the validation loss every 50
# steps beside the corpus's unigram entropy. Sized for a few minutes on 2 CPU cores, and for
# about a minute on GPUs (bf16 params, fp32 reduce).
DATA=data/pydocs-4k
CPU_ARGS="--model transformer --layers 4 --dim 128 --heads 4 --kv-heads 2 --seq-len 128
          --tokens 1024 --steps 300 --lr 3e-3 --warmup-steps 30 --data $DATA --eval-every 50
          --eval-batches 4 --log-every 25"
GPU_ARGS="--model transformer --layers 12 --dim 768 --heads 12 --kv-heads 4 --seq-len 1024
          --tokens 16384 --steps 400 --lr 1e-3 --warmup-steps 40 --param-dtype bf16 --data $DATA
          --eval-every 50 --eval-batches 8 --log-every 25"
CPU_RANKS=2

gpu_names=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)
gpus=$(printf '%s' "$gpu_names" | grep -c . || true)

plan() {
  if [ "$gpus" -gt 0 ]; then
    local names
    names=$(printf '%s\n' "$gpu_names" | sort | uniq -c | awk '{c=$1; $1=""; printf "%s%d x%s", (NR>1?", ":""), c, $0}')
    echo "make run: found $gpus GPU(s) ($names): CUDA backend, $gpus ranks, one process per GPU (every GPU nvidia-smi lists)"
  else
    echo "make run: no GPU found (nvidia-smi lists none): CPU backend, $CPU_RANKS ranks as threads of one process"
  fi
}

case ${1:-} in
  --plan) plan; exit 0 ;;
  --setup-flags) [ "$gpus" -gt 0 ] && echo "--cuda"; exit 0 ;;
  "") echo "usage: scripts/run.sh --plan | --setup-flags | BUILD_DIR" >&2; exit 2 ;;
esac

build=$1
cuda_built=$(sed -n 's/^cuda_backend //p' "$build/build_summary.txt" 2>/dev/null)
# The trained model is saved (the last step only), exported as a Hugging Face directory and
# asked to continue a prompt: a short sample beside the validation loss (docs/generate.md).
save="$build/run-checkpoint"
model="$build/run-model"
rm -rf "$save" "$model"
sample() {  # BACKEND
  "$build/fsdp" export --checkpoint "$save" --hf "$model" --dtype fp32 > /dev/null || return 1
  local text
  text=$("$build/fsdp" generate --backend "$1" --init-from "$model" --tokenizer "$DATA/tokenizer.model" \
           --prompt "The tutorial" --max-new-tokens 40 --temperature 0.8 --top-p 0.9 --seed 1) || return 1
  echo "sample (fsdp generate --init-from $model, temperature 0.8, top-p 0.9): $text"
}
# shellcheck disable=SC2086
if [ "$gpus" -gt 0 ] && [ "$cuda_built" = ON ]; then
  "$build/fsdp" train --backend cuda --nproc "$gpus" $GPU_ARGS --json "$build/run.json" \
    --save-dir "$save" || exit $?
  sample cuda
  exit $?
fi
if [ "$gpus" -gt 0 ]; then
  echo "make run: changed plan: $build has no CUDA backend (configured without nvcc or NCCL): CPU backend, $CPU_RANKS ranks"
fi
# shellcheck disable=SC2086
"$build/fsdp" train --backend cpu --world-size "$CPU_RANKS" $CPU_ARGS --json "$build/run.json" \
  --save-dir "$save" || exit $?
sample cpu
