#!/usr/bin/env bash
# 1 x H200: the optimizer in forward (Note [Optimizer in forward]). llama1b at 4 and 1
# sequences, eager, with the step after backward (oif0) and in the next forward (oif1); losses
# must be bitwise equal. Then --cuda-graph with oif1 at 1 sequence, and a traced oif1 step at 4
# sequences (device ms per step by op kind).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call3; mkdir -p $R
trap 'tar czf $OUT/call3.tgz -C /tmp call3' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
grep -E "error" $R/build.log | head
LLAMA="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0"
run() {  # NAME ARGS...
  local name=$1; shift
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 20 --warmup 5 --quiet $LLAMA "$@" --json $R/$name.json)
  echo "${cmd[*]}" > $R/$name.cmd
  timeout 150 "${cmd[@]}" > $R/$name.log 2>&1; echo "$name rc=$? at $((SECONDS-T0)) s: $(tail -1 $R/$name.log)"
}
run s4_oif0 --tokens 8192 --optimizer-in-forward 0
run s4_oif1 --tokens 8192 --optimizer-in-forward 1
run s1_oif0 --tokens 2048 --optimizer-in-forward 0
run s1_oif1 --tokens 2048 --optimizer-in-forward 1
run s1_oif1_graph --tokens 2048 --optimizer-in-forward 1 --cuda-graph
run s1_oif0_graph --tokens 2048 --optimizer-in-forward 0 --cuda-graph
python3 - $R <<'PY'
import json, sys
R = sys.argv[1]
def j(n):
    try: return json.load(open(f"{R}/{n}.json"))
    except Exception as e: return None
for n in ["s4_oif0", "s4_oif1", "s1_oif0", "s1_oif1", "s1_oif1_graph", "s1_oif0_graph"]:
    x = j(n)
    if x: print(n, "step_ms", round(x["step_ms_median"], 3), "host_us", round(x["host_us_per_step"], 1), "peak GiB", round(x["backend_peak_bytes"] / 2**30, 2), "loss_last", x["loss_last"])
for a, b in [("s4_oif0", "s4_oif1"), ("s1_oif0", "s1_oif1"), ("s1_oif0", "s1_oif1_graph"), ("s1_oif0_graph", "s1_oif1_graph")]:
    x, y = j(a), j(b)
    if x and y: print(a, "vs", b, "losses bitwise equal:", x["losses"] == y["losses"], "grad norms equal:", x["grad_norms"] == y["grad_norms"])
PY
run s4_oif1_traced --tokens 8192 --optimizer-in-forward 1 --trace $R/s4_oif1.trace.json
python3 bench/trace_op_totals.py $R/s4_oif1.trace.json --top 24 > $R/s4_oif1.ops.txt 2>&1; cat $R/s4_oif1.ops.txt
build-gpu/fsdp report $R/s4_oif1.trace.json --top 5 > $R/s4_oif1.report.txt 2>&1; head -16 $R/s4_oif1.report.txt
rm -f $R/*.trace.json
echo "total $((SECONDS-T0)) s"
