#!/usr/bin/env bash
# make test on a fresh machine with the final code.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS
timeout 380 make test > $OUT/make_test.log 2>&1; echo "make test rc=$? at $((SECONDS-T0)) s"
sed -n '/==== make test summary/,$p' $OUT/make_test.log | head -16
grep -E "sanitize:" $OUT/make_test.log | tail -2
