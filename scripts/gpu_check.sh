#!/usr/bin/env bash
# Builds for Hopper and runs the GPU tests on a machine with NVIDIA GPUs:
#  1. fsdp_gpu_tests: every CUDA Device op against a host reference;
#  2. CUDA vs CPU backend parity on the same model and seed (fp32: 1e-4 relative on the loss
#     curve; bf16 compute: 3e-2, bf16 keeps ~3 significant digits);
#  3. 2-GPU vs 1-GPU parity (when 2 GPUs are present).
# Usage: scripts/gpu_check.sh [OUTDIR]
#   FSDP_BUILD_DIR=DIR: use that already built tree (with the CUDA backend) instead of
#   building build-gpu here; `make test` passes its own.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
build=${FSDP_BUILD_DIR:-build-gpu}
out=${1:-$build/check}
mkdir -p "$out"
if [ -z "${FSDP_BUILD_DIR:-}" ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
  cmake --build build-gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -40; exit 1; }
fi
failed=0
"$build"/fsdp_gpu_tests >"$out/gpu_tests.log" 2>&1; rc=$?
tail -5 "$out/gpu_tests.log"
[ $rc -eq 0 ] || failed=1

gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
common="--model moe --layers 3 --dim 96 --hidden 160 --experts 3 --tokens 64 --steps 8 --quiet"
compare() {  # compare two summaries' loss curves: A B tolerance what
  python3 - "$1" "$2" "$3" "$4" <<'PY'
import json, sys
a, b = (json.load(open(p))["losses"] for p in sys.argv[1:3])
tol = float(sys.argv[3])
err = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))
ok = len(a) == len(b) and err <= tol
print(f"{'PASS' if ok else 'FAIL'} {sys.argv[4]}: max relative loss difference {err:.2e} (tolerance {tol:g})")
sys.exit(0 if ok else 1)
PY
}
same_counts() {  # the first micro-batch's collectives per communicator, in two summaries: A B what
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
keys = ("forward_by_comm_first_step", "backward_by_comm_first_step")
a, b = ([json.load(open(p)).get(k) for k in keys] for p in sys.argv[1:3])
ok = all(a) and a == b
print(f"{'PASS' if ok else 'FAIL'} {sys.argv[3]}: first-step collectives per communicator"
      + ("" if ok else f": {a} vs {b}"))
sys.exit(0 if ok else 1)
PY
}
for dt in fp32 bf16; do
  tol=1e-4; [ $dt = bf16 ] && tol=3e-2
  "$build"/fsdp train --backend cpu --world-size 1 $common --param-dtype $dt --json "$out/cpu1_$dt.json" >"$out/cpu1_$dt.log" 2>&1 || failed=1
  "$build"/fsdp train --backend cuda --nproc 1 $common --param-dtype $dt --json "$out/cuda1_$dt.json" >"$out/cuda1_$dt.log" 2>&1 || { failed=1; tail -5 "$out/cuda1_$dt.log"; }
  compare "$out/cuda1_$dt.json" "$out/cpu1_$dt.json" $tol "CUDA vs CPU, 1 rank, $dt" || failed=1
  if [ "$gpus" -ge 2 ]; then
    "$build"/fsdp train --backend cpu --world-size 2 $common --param-dtype $dt --json "$out/cpu2_$dt.json" >"$out/cpu2_$dt.log" 2>&1 || failed=1
    "$build"/fsdp train --backend cuda --nproc 2 $common --param-dtype $dt --separate-rs-group 1 --rs-max-input-buffers 2 --json "$out/cuda2_$dt.json" >"$out/cuda2_$dt.log" 2>&1 || { failed=1; tail -5 "$out/cuda2_$dt.log"; }
    compare "$out/cuda2_$dt.json" "$out/cpu2_$dt.json" $tol "CUDA vs CPU, 2 ranks, $dt" || failed=1
    # One GPU with twice the tokens sees the same global batch as two GPUs.
    "$build"/fsdp train --backend cuda --nproc 1 ${common/--tokens 64/--tokens 128} --param-dtype $dt --json "$out/cuda1g_$dt.json" >"$out/cuda1g_$dt.log" 2>&1 || failed=1
    compare "$out/cuda2_$dt.json" "$out/cuda1g_$dt.json" $tol "2 GPUs vs 1 GPU on the same global batch, $dt" || failed=1
  fi
done
# The MoE transformer (docs/moe.md), fp32: grouped GEMM, host routing; with 2 GPUs the experts
# are split over ep 2 and dispatched by NCCL all-to-all. (fp32 only: in bf16 a top-k choice
# can flip between backends.)
moe="--model moe-transformer --layers 2 --dim 64 --heads 4 --ffn-dim 96 --experts 4 --top-k 2 --expert-ffn-dim 48 --seq-len 16 --vocab 97 --tokens 64 --steps 8 --quiet --param-dtype fp32"
"$build/fsdp" train --backend cpu --world-size 1 $moe --json "$out/moe_cpu1.json" >"$out/moe_cpu1.log" 2>&1 || failed=1
"$build/fsdp" train --backend cuda --nproc 1 $moe --json "$out/moe_cuda1.json" >"$out/moe_cuda1.log" 2>&1 || { failed=1; tail -5 "$out/moe_cuda1.log"; }
compare "$out/moe_cuda1.json" "$out/moe_cpu1.json" 1e-3 "MoE transformer, CUDA vs CPU, 1 rank" || failed=1
same_counts "$out/moe_cuda1.json" "$out/moe_cpu1.json" "MoE transformer, CUDA vs CPU, 1 rank" || failed=1
if [ "$gpus" -ge 2 ]; then
  "$build/fsdp" train --backend cpu --world-size 2 --ep 2 $moe --json "$out/moe_cpu2.json" >"$out/moe_cpu2.log" 2>&1 || failed=1
  "$build/fsdp" train --backend cuda --nproc 2 --ep 2 $moe --json "$out/moe_cuda2.json" >"$out/moe_cuda2.log" 2>&1 || { failed=1; tail -5 "$out/moe_cuda2.log"; }
  compare "$out/moe_cuda2.json" "$out/moe_cpu2.json" 1e-3 "MoE transformer, CUDA vs CPU, 2 ranks as ep 2" || failed=1
  same_counts "$out/moe_cuda2.json" "$out/moe_cpu2.json" "MoE transformer, CUDA vs CPU, 2 ranks as ep 2" || failed=1
fi
# --check-collectives on NCCL trains like without it; a rank killed mid-training ends the job
# within the bound, naming the lost rank (tests/gpu/kill_rank.sh prints the exit times).
if [ "$gpus" -ge 2 ]; then
  "$build/fsdp" train --backend cuda --nproc 2 $common --param-dtype fp32 --separate-rs-group 1 --rs-max-input-buffers 2 --check-collectives --json "$out/cuda2_check.json" >"$out/cuda2_check.log" 2>&1 || { failed=1; tail -5 "$out/cuda2_check.log"; }
  compare "$out/cuda2_check.json" "$out/cuda2_fp32.json" 0 "2 GPUs with --check-collectives vs without, fp32" || failed=1
  bash "$(dirname "$0")/../tests/gpu/kill_rank.sh" "$build" 2>&1 | tee "$out/kill_rank.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
fi
[ $failed -eq 0 ] && echo "GPU CHECK PASSED" || echo "GPU CHECK FAILED"
exit $failed
