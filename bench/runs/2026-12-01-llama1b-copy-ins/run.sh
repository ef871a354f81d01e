#!/usr/bin/env bash
# 1 x H200: at world size 1, how much of llama1b's step at 4 sequences is the FSDP side-stream
# traffic? The copy-ins of the all-gather disappear with --reshard-after-forward 0 (no backward
# all-gather) plus --optimizer-in-forward 1 (the update writes the forward all-gather's input).
# Eager and graph, then one traced step of each config.
set -u
source bench/gpu_call.sh
gpu_call_begin call1 fsdp
run_llama oif1 --tokens 8192 --optimizer-in-forward 1
run_llama oif1_rsf0 --tokens 8192 --optimizer-in-forward 1 --reshard-after-forward 0
run_llama oif0_rsf0 --tokens 8192 --optimizer-in-forward 0 --reshard-after-forward 0
run_llama oif1_rsf0_graph --tokens 8192 --optimizer-in-forward 1 --reshard-after-forward 0 --cuda-graph
run_llama oif1_graph --tokens 8192 --optimizer-in-forward 1 --cuda-graph
python3 - $R <<'PY'
import json, sys
R = sys.argv[1]
for n in ["oif1", "oif1_rsf0", "oif0_rsf0", "oif1_rsf0_graph", "oif1_graph"]:
    try: x = json.load(open(f"{R}/{n}.json"))
    except Exception: continue
    print(n, "step_ms", round(x["step_ms_median"], 3), "host_us", round(x["host_us_per_step"], 1), "peak GiB", round(x["backend_peak_bytes"] / 2**30, 2), "loss_last", x["loss_last"])
PY
for n in oif1 oif1_rsf0; do
  extra="--optimizer-in-forward 1"; [ $n = oif1_rsf0 ] && extra="$extra --reshard-after-forward 0"
  run_llama ${n}_traced --tokens 8192 $extra --trace $R/$n.trace.json
  python3 bench/trace_op_totals.py $R/$n.trace.json --top 26 > $R/$n.ops.txt 2>&1; cat $R/$n.ops.txt
  rm -f $R/$n.trace.json
done
echo "total $((SECONDS-T0)) s"
