#!/usr/bin/env bash
# One H200, one device call: the MoE benchmark rows again (their accuracy rows predate the fused
# norms and the early-stopping recompute), the whole GPU test binary, then the op sweep with its
# MoE dense-Linear shapes:   bash bench/runs/2026-12-05-moe-gpu-tests-sweep/run.sh
set -u
source bench/gpu_call.sh
gpu_call_begin moe-gpu-tests-sweep fsdp_tool fsdp_gpu_tests op_sweep
mkdir -p "$R/bench"
timeout 200 bash bench/run_moe_bench.sh "$R/bench" > "$R/moe_bench.log" 2>&1
echo "moe bench rc=$? at $((SECONDS - T0)) s"; tail -8 "$R/bench/moe_rows.md" 2>/dev/null
timeout 170 build-gpu/fsdp_gpu_tests > "$R/gpu_tests.log" 2>&1
echo "gpu tests rc=$? at $((SECONDS - T0)) s: $(grep -E '^\[  (PASSED|FAILED)' "$R/gpu_tests.log" | tr '\n' ' ')"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 170 build-gpu/bench/op_sweep 5 > "$R/op_sweep.jsonl" 2> "$R/op_sweep.err"
echo "op_sweep rc=$? at $((SECONDS - T0)) s: $(wc -l < "$R/op_sweep.jsonl") lines"; tail -2 "$R/op_sweep.err"
