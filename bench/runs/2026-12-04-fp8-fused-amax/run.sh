#!/usr/bin/env bash
# fp8 after three changes on one rank's step, one H200 (about 6 minutes):
#   bash bench/runs/2026-12-04-fp8-fused-amax/run.sh
# - the float8-gathered group's params are views of the all-gather output (no copy-out);
# - each group takes its amaxes at its copy-in (no precompute that every all-gather waits for);
# - SwiGLU's forward and backward take the amax of what they write (Note [Fused amax]).
#  1. the GPU tests of fp8 and SwiGLU;
#  2. llama1b at 4 x 2048 tokens, bf16 and --fp8 tensorwise, as in 2026-12-03-fp8-transpose;
#  3. the 3.0B shape (dim 3072, 28 layers, 24/8 heads, FFN 8192, vocab 32000) at 2 x 8192
#     tokens, no checkpointing, 20 steps after 5, bf16 and --fp8 tensorwise, as in
#     2026-12-03-fp8-3b; then tensorwise again, traced, with its device time by op kind.
set -u
source bench/gpu_call.sh
gpu_call_begin fp8-fused-amax fsdp_tool fsdp_gpu_tests
timeout 150 build-gpu/fsdp_gpu_tests --gtest_filter='*Fp8*:*fp8*:*Swiglu*' \
  > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at $((SECONDS - T0)) s: $(grep -E '^\[  (PASSED|FAILED)' "$R/gpu_tests.log" | tr '\n' ' ')"
run_llama l1b_none --tokens 8192 --fp8 none
run_llama l1b_tensorwise --tokens 8192 --fp8 tensorwise
# run_llama's model args are LLAMA1B's; a flag may be given once, so the 3.0B shape replaces them.
LLAMA1B="--model transformer --layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 \
--seq-len 8192 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 --lr 3e-4 \
--min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0"
run_llama b3_none --tokens 16384 --fp8 none
run_llama b3_tensorwise --tokens 16384 --fp8 tensorwise
run_llama b3_tensorwise_traced --tokens 16384 --fp8 tensorwise --trace "$R/b3_tensorwise_traced.trace.json"
python3 bench/trace_op_totals.py "$R/b3_tensorwise_traced.trace.json" --top 30 \
  > "$R/b3_tensorwise_traced.ops.txt" 2>&1
gzip -9 "$R/b3_tensorwise_traced.trace.json"
for f in b3_none b3_tensorwise b3_tensorwise_traced l1b_none l1b_tensorwise; do
  python3 -c "import json; j=json.load(open('$R/$f.json')); print('$f', {k: j.get(k) for k in ('step_ms_median', 'peak_mem_bytes', 'mfu', 'loss_last')})" 2>&1 | tail -1
done
head -30 "$R/b3_tensorwise_traced.ops.txt"
