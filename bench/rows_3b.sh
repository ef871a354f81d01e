#!/usr/bin/env bash
# The 3.0B Llama shape's rows of docs/memory.md and docs/fp8.md, one H200, one device call each
# part (about 9 minutes each), run from the repository root on the GPU machine:
#   bash bench/rows_3b.sh memory   the GPU tests of checkpointing and the fused amaxes; ours with
#                                  --activation-checkpointing none, full and selective; PyTorch
#                                  FSDP2 with checkpoint_wrapper per block
#   bash bench/rows_3b.sh fp8      the fp8 GPU tests; ours bf16 and --fp8 tensorwise on the 3.0B
#                                  shape and on llama1b; PyTorch FSDP2 bf16 and with
#                                  torch._scaled_mm (bench/torch_float8.py) on the 3.0B shape
# The shape: dim 3072, 28 layers, 24/8 heads, FFN 8192, vocab 32000, 2 x 8192 tokens, bf16,
# AdamW, clipping; 12 steps timed after 4. Outputs go to $OUT/rows-3b-PART.tgz; copy them into
# bench/runs/DATE-PURPOSE/ with a README (bench/runs/README.md).
set -u
part=${1:?usage: bench/rows_3b.sh memory|fp8}
source bench/gpu_call.sh
gpu_call_begin "rows-3b-$part" fsdp_tool fsdp_gpu_tests
gpu_tests() {  # FILTER
  timeout 170 build-gpu/fsdp_gpu_tests --gtest_filter="$1" > "$R/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? at $((SECONDS - T0)) s: $(grep -E '^\[  (PASSED|FAILED)' "$R/gpu_tests.log" | tr '\n' ' ')"
}
torch_row() {  # NAME FLAGS...
  local name=$1
  shift
  local cmd=(python3 bench/torch_llama.py --data data/pydocs-4k/train.bin $SHAPE_3B --batch 2
             --steps 12 --bench-warmup 4 $RECIPE_3B --param-dtype bf16 --log-every 4 "$@"
             --out "$R/$name.json")
  echo "${cmd[*]}" > "$R/$name.cmd"
  timeout 150 "${cmd[@]}" > "$R/$name.log" 2>&1
  echo "$name rc=$? at $((SECONDS - T0)) s: $(tail -1 "$R/$name.log")"
}
case $part in
  memory)
    gpu_tests '*Checkpoint*:*checkpoint*:*FusedAmax*:*RmsNorm*'
    run_3b ours_none --activation-checkpointing none
    run_3b ours_full --activation-checkpointing full
    run_3b ours_selective --activation-checkpointing selective
    torch_row torch_full --activation-checkpointing full
    rows="ours_none ours_full ours_selective torch_full" ;;
  fp8)
    gpu_tests '*Fp8*:*fp8*:*FusedAmax*:*RmsNorm*:*Swiglu*'
    run_3b b3_none --fp8 none
    run_3b b3_tensorwise --fp8 tensorwise
    run_llama l1b_none --tokens 8192 --fp8 none
    run_llama l1b_tensorwise --tokens 8192 --fp8 tensorwise
    torch_row torch_bf16
    torch_row torch_fp8 --fp8 tensorwise
    rows="b3_none b3_tensorwise l1b_none l1b_tensorwise torch_bf16 torch_fp8" ;;
  *) echo "bench/rows_3b.sh: unknown part '$part' (memory or fp8)"; exit 2 ;;
esac
for f in $rows; do
  python3 -c "import json; j=json.load(open('$R/$f.json')); print('$f', {k: j.get(k) for k in ('step_ms_median', 'peak_mem_bytes', 'predicted_peak_bytes', 'mfu', 'loss_last')})" 2>&1 | tail -1
done
