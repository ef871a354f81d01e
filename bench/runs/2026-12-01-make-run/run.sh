#!/usr/bin/env bash
# The README's two commands on a fresh machine (no network): make run, then make test.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; FINAL_OUT=$OUT; OUT=/tmp/o3; mkdir -p $OUT; trap "tar czf $FINAL_OUT/gpu3.tgz -C /tmp o3" EXIT
ls -d build* 2>/dev/null; nvidia-smi -L
timeout 200 make run > $OUT/make_run.log 2>&1; echo "make run rc=$? at $((SECONDS-T0)) s"
head -3 $OUT/make_run.log; grep -E "validation|^done" $OUT/make_run.log | tail -4
timeout $((570-(SECONDS-T0))) make test > $OUT/make_test.log 2>&1; echo "make test rc=$? at $((SECONDS-T0)) s"
sed -n '/==== make test summary/,$p' $OUT/make_test.log
grep -E "sanitize:|tests passed" $OUT/make_test.log | tail -3
