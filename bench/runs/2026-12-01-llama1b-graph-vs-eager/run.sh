#!/usr/bin/env bash
# 1 x H200: why is llama1b at 4 sequences slower under --cuda-graph than eager when the params
# are resharded after forward (the llama1b-copy-ins run: 114.47 against 113.05 ms), and not when
# they are not (112.25 against 112.35)? Eager and graph, untraced and traced (device ms per step
# by op kind; under the graph the times come from events captured in it).
set -u
source bench/gpu_call.sh
gpu_call_begin call3 fsdp
run_llama eager --tokens 8192
run_llama graph --tokens 8192 --cuda-graph
for n in eager graph; do
  extra=""; [ $n = graph ] && extra="--cuda-graph"
  run_llama ${n}_traced --tokens 8192 $extra --trace $R/$n.trace.json
  python3 bench/trace_op_totals.py $R/$n.trace.json --top 30 > $R/$n.ops.txt 2>&1; cat $R/$n.ops.txt
  build-gpu/fsdp report $R/$n.trace.json --top 5 > $R/$n.report.txt 2>&1; head -20 $R/$n.report.txt
  rm -f $R/$n.trace.json
done
echo "total $((SECONDS-T0)) s"
