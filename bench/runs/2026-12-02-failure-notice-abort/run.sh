#!/usr/bin/env bash
# 1 x H200: the CUDA side of "another rank's failure notice aborts at once" (FailureWatch,
# abort_communicators). One GPU holds one NCCL rank, so rank 1 is fake_rank.py: it joins the
# store and the start barrier, never starts NCCL, and posts a failure notice 5 s later. Rank 0
# (a real `fsdp train --backend cuda`, torchrun form, world 2) is then waiting in NCCL's set-up
# for its peer. It must end with an error naming rank 1 within seconds of the notice, far
# inside its --timeout of 120 s.
set -u
source bench/gpu_call.sh
gpu_call_begin call5 fsdp
PORT=29571
python3 bench/runs/2026-12-02-failure-notice-abort/fake_rank.py $PORT 5 > $R/fake_rank1.log 2>&1 &
FAKE=$!
start=$(date +%s.%N)
timeout 100 env RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT \
  build-gpu/fsdp train --backend cuda --model mlp --layers 2 --dim 256 --tokens 64 --steps 3 --timeout 120 \
  > $R/rank0.log 2>&1
rc=$?
end=$(date +%s.%N)
kill $FAKE 2>/dev/null; wait $FAKE 2>/dev/null
echo "rank 0 rc=$rc after $(python3 -c "print(round($end - $start, 2))") s (the notice came about 5 s in)"
cat $R/fake_rank1.log
grep -v "^\s*$" $R/rank0.log | cut -c1-500 | tail -5
echo "total $((SECONDS-T0)) s"
