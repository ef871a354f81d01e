#!/usr/bin/env bash
# 2 x H200: the launch forms (scripts/launch_check.sh), a killed rank (tests/gpu/kill_rank.sh,
# with the exit times), and the MoE benchmark with ep 2 (NCCL all-to-all on 2 GPUs) beside
# PyTorch FSDP2 in torchtitan's layout.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
T0=$SECONDS; R=/tmp/call3; mkdir -p $R
trap 'tar czf $OUT/call3.tgz -C /tmp call3' EXIT
nvidia-smi -L
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j32 --target fsdp) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
timeout 100 scripts/launch_check.sh $R/launch > $R/launch_check.log 2>&1; echo "launch_check rc=$? at $((SECONDS-T0)) s"; grep -E "PASS|FAIL|took|seconds| s" $R/launch_check.log | head -12
timeout 120 tests/gpu/kill_rank.sh build-gpu > $R/kill_rank.log 2>&1; echo "kill_rank rc=$? at $((SECONDS-T0)) s"; tail -8 $R/kill_rank.log
NPROC=2 EP=2 FSDP_BIN=build-gpu/fsdp ROWS="ours_k1_sep0 ours_k2_sep1 torch" ROW_TIMEOUT=60 TORCH_TIMEOUT=110 \
  timeout $((540 - (SECONDS - T0))) bench/run_moe_bench.sh $R/moe data/pydocs-4k > $R/moe.log 2>&1; echo "moe rc=$? at $((SECONDS-T0)) s"
grep -E "rc=" $R/moe.log; tail -6 $R/moe/moe_rows.md 2>/dev/null
echo "total $((SECONDS-T0)) s"
