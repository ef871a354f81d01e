#!/usr/bin/env bash
# A rank killed mid-training ends the job: the others exit non-zero within the bound, with a
# message naming the lost rank where it can be known. Needs 2 GPUs (exit 77 otherwise).
#  1. `fsdp train --nproc 2`: SIGKILL rank 1's process; the parent must stop rank 0, reap both
#     and fail with "rank 1 was killed by signal 9" (src/launch/rank_processes.h).
#  2. Two ranks started as an external launcher would (RANK, WORLD_SIZE, MASTER_ADDR,
#     MASTER_PORT): SIGKILL rank 1; rank 0 is blocked in NCCL and only its watchdog can end
#     it (Note [NCCL watchdog]): it must exit non-zero within --timeout plus the watchdog's
#     grace, saying why.
# Prints the measured exit times. Usage: tests/gpu/kill_rank.sh [BUILD_DIR]
set -uo pipefail
export NCCL_NVLS_ENABLE=0
build=${1:-${FSDP_BUILD_DIR:-build-gpu}}
fsdp="$build/fsdp"
timeout_s=${FSDP_KILL_TIMEOUT_S:-20}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 2 ]; then
  echo "SKIP kill_rank: needs 2 GPUs, this machine has $gpus"
  exit 77
fi
[ -x "$fsdp" ] || { echo "FAIL kill_rank: no $fsdp (build with -DFSDP_CUDA=ON)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Long enough to be killed mid-training; a step line every step.
train="train --backend cuda --model mlp --layers 8 --dim 1024 --tokens 4096 --steps 1000000
       --log-every 1 --timeout $timeout_s"
failed=0

now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }  # bash 5
# Waits until FILE shows step N of training (at most 300 s).
wait_for_step() {
  for _ in $(seq 3000); do
    grep -q "^step $2/" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "FAIL kill_rank: training never reached step $2; its log:"; tail -20 "$1"; return 1
}
# Waits up to LIMIT seconds for PID to end; prints its exit code, or "hung".
wait_exit() {
  local pid=$1 limit_ms=$(($2 * 1000)) start
  start=$(now_ms)
  while kill -0 "$pid" 2>/dev/null; do
    if (( $(now_ms) - start > limit_ms )); then echo hung; return; fi
    sleep 0.05
  done
  wait "$pid"; echo $?
}
check() {  # check NAME CONDITION-TEXT RESULT(0/1)
  if [ "$3" -eq 0 ]; then echo "PASS $1: $2"; else echo "FAIL $1: $2"; failed=1; fi
}

# ---- 1. --nproc: the parent names the child that died.
log="$work/nproc.log"
"$fsdp" $train --nproc 2 >"$log" 2>&1 &
parent=$!
if wait_for_step "$log" 10; then
  # The parent forks rank 0 first, then rank 1 (its other children have exited by now).
  children=($(ps -o pid= --ppid "$parent" | sort -n))
  rank1=${children[1]}
  start=$(now_ms)
  kill -9 "$rank1"
  code=$(wait_exit "$parent" $((timeout_s + 30)))
  elapsed=$(($(now_ms) - start))
  echo "nproc: rank 1 (pid $rank1) killed; fsdp exited with $code after ${elapsed} ms"
  [ "$code" != hung ] && [ "$code" != 0 ]; check nproc "exits non-zero" $?
  grep -q "rank 1 was killed by signal 9" "$log"; check nproc "names rank 1 as killed" $?
  left=0
  for pid in "${children[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
  check nproc "no rank process is left" $left
  (( elapsed < timeout_s * 1000 )); check nproc "within the bound ($timeout_s s)" $?
  grep "fsdp: error" "$log" | tail -3
else
  failed=1
fi
kill -9 "$parent" 2>/dev/null

# ---- 2. external launcher: the survivor's NCCL watchdog ends it.
port=$((29000 + RANDOM % 2000))
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$fsdp" $train >"$work/ext$r.log" 2>&1 &
  pids[$r]=$!
done
if wait_for_step "$work/ext0.log" 10; then
  start=$(now_ms)
  kill -9 "${pids[1]}"
  bound=$((timeout_s + 15))  # the timeout, polling, and the watchdog's 10 s exit grace
  code=$(wait_exit "${pids[0]}" $((bound + 30)))
  elapsed=$(($(now_ms) - start))
  echo "external: rank 1 killed; rank 0 exited with $code after ${elapsed} ms"
  [ "$code" != hung ] && [ "$code" != 0 ]; check external "rank 0 exits non-zero" $?
  grep -q "NCCL watchdog" "$work/ext0.log"; check external "rank 0 says the watchdog ended it" $?
  (( elapsed < bound * 1000 )); check external "within the bound ($bound s)" $?
  grep "fsdp" "$work/ext0.log" | tail -3
else
  failed=1
fi
kill -9 "${pids[@]}" 2>/dev/null
exit $failed
