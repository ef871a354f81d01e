#!/usr/bin/env bash
# GPU call 3 of wave 8 (1 x H200): why is llama1b at 4 sequences slower under --cuda-graph than
# eager when the params are resharded after forward (call 1: 114.47 against 113.05 ms), and not
# when they are not (112.25 against 112.35)? Eager and graph, untraced and traced (device ms per
# step by op kind; under the graph the times come from events captured in it).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call3; mkdir -p $R
trap 'tar czf $OUT/call3.tgz -C /tmp call3' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
grep -E "error" $R/build.log | head
LLAMA="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0 --tokens 8192"
run() {  # NAME ARGS...
  local name=$1; shift
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 20 --warmup 5 --quiet $LLAMA "$@" --json $R/$name.json)
  echo "${cmd[*]}" > $R/$name.cmd
  timeout 150 "${cmd[@]}" > $R/$name.log 2>&1; echo "$name rc=$? at $((SECONDS-T0)) s: $(tail -1 $R/$name.log)"
}
run eager
run graph --cuda-graph
for n in eager graph; do
  extra=""; [ $n = graph ] && extra="--cuda-graph"
  run ${n}_traced $extra --trace $R/$n.trace.json
  python3 bench/trace_op_totals.py $R/$n.trace.json --top 30 > $R/$n.ops.txt 2>&1; cat $R/$n.ops.txt
  build-gpu/fsdp report $R/$n.trace.json --top 5 > $R/$n.report.txt 2>&1; head -20 $R/$n.report.txt
  rm -f $R/$n.trace.json
done
echo "total $((SECONDS-T0)) s"
