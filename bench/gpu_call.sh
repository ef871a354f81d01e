# Shared by run scripts (bench/runs/*/run.sh) that build on a GPU machine and time llama1b
# (sourced, not run):
#   source bench/gpu_call.sh; gpu_call_begin NAME fsdp [more targets]; run_llama ROW ARGS...
# gpu_call_begin exports the NVLS switches, makes R=/tmp/NAME (tarred into $OUT/NAME.tgz on
# exit), and builds the targets into build-gpu for sm_90a. run_llama trains the ~1B
# transformer (the LLAMA1B args) for 20 steps after 5 warm-up steps, writing R/ROW.{cmd,json,log}.
# Its ARGS come last, so they can override the defaults (--tokens).
LLAMA1B="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 \
--seq-len 2048 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 --lr 3e-4 \
--min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0"

gpu_call_begin() {  # NAME TARGET...
  local name=$1
  shift
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  T0=$SECONDS
  R=/tmp/$name
  mkdir -p "$R"
  trap "tar czf \$OUT/$name.tgz -C /tmp $name" EXIT
  (cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90a && cmake --build build-gpu -j16 --target "$@") \
    > "$R/build.log" 2>&1
  echo "build rc=$? at $((SECONDS - T0)) s"
  grep -E "error" "$R/build.log" | head
}

run_llama() {  # NAME ARGS...
  local name=$1
  shift
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 20 --warmup 5 --quiet $LLAMA1B
             "$@" --json "$R/$name.json")
  echo "${FSDP_RUN_ENV:-}${FSDP_RUN_ENV:+ }${cmd[*]}" > "$R/$name.cmd"
  env ${FSDP_RUN_ENV:-} timeout 150 "${cmd[@]}" > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/$name.log")"
}

# The Llama-3.1-8B shape with its vocab at 32000 (7.24B params), 4096 tokens, bf16, full
# checkpointing, no clipping: the optimizer offload's large row (docs/memory.md).
L8B="--model transformer --layers 32 --dim 4096 --heads 32 --kv-heads 8 --ffn-dim 14336 \
--vocab 32000 --seq-len 4096 --tokens 4096 --param-dtype bf16 --activation-checkpointing full \
--optimizer-in-backward 0 --clip-grad-norm 0"

run_llama8b_offload() {  # TIMEOUT: 6 steps after 2 with --offload optimizer, traced
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 6 --warmup 2 $L8B --offload optimizer
             --json "$R/llama8b_offload.json" --trace "$R/llama8b_offload.trace.json")
  echo "${cmd[*]}" > "$R/llama8b_offload.cmd"
  timeout "$1" "${cmd[@]}" > "$R/llama8b_offload.log" 2>&1
  echo "llama8b offload rc=$? at $((SECONDS - T0)) s"; tail -2 "$R/llama8b_offload.log"
  # Each track's busy time per traced step, and how much of it ran beside compute.
  python3 bench/trace_tracks.py "$R/llama8b_offload.trace.json" "$R/llama8b_offload.json" 2>&1 | tail -8
}

# The 3.0B Llama shape (dim 3072, 28 layers, 24/8 heads, FFN 8192, vocab 32000), bf16, AdamW,
# clipping. run_3b NAME FLAGS... trains it for 12 steps after 4 at SHAPE_3B_TOKENS tokens (2 x
# 8192 by default: the CLI refuses a flag given twice, so FLAGS must not repeat --tokens),
# writing R/NAME.{cmd,json,log}; under the environment FSDP_RUN_ENV names, as run_llama.
SHAPE_3B="--layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 --seq-len 8192 --vocab 32000"
RECIPE_3B="--lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 4"
run_3b() {  # NAME FLAGS...
  local name=$1
  shift
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --model transformer $SHAPE_3B
             --tokens "${SHAPE_3B_TOKENS:-16384}" --steps 12 --warmup 4 --param-dtype bf16
             --data data/pydocs-4k --eval-every 0 $RECIPE_3B --optimizer-in-backward 0 "$@" --quiet
             --json "$R/$name.json")
  echo "${FSDP_RUN_ENV:-}${FSDP_RUN_ENV:+ }${cmd[*]}" > "$R/$name.cmd"
  env ${FSDP_RUN_ENV:-} timeout "${ROW_TIMEOUT:-100}" "${cmd[@]}" > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/$name.log")"
}

# The convergence recipe (bench/runs/*-fp8-convergence*): 1000 steps at 2 x 2048 tokens on the
# corpus, 50 warm-up steps of the learning rate, then cosine to 3e-5; the validation loss every
# 50 steps over 8 batches. run_convergence TIMEOUT NAME MODEL_FLAGS... writes R/NAME.{cmd,json,log}.
CONVERGENCE="--seq-len 2048 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --lr 3e-4 \
--min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --optimizer-in-backward 0 --tokens 4096 \
--warmup-steps 50 --eval-every 50 --eval-batches 8"
run_convergence() {  # TIMEOUT NAME ARGS...
  local limit=$1 name=$2
  shift 2
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 1000 --warmup 5 --quiet "$@"
             $CONVERGENCE --json "$R/$name.json")
  echo "${cmd[*]}" > "$R/$name.cmd"
  timeout "$limit" "${cmd[@]}" > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/$name.log")"
}
