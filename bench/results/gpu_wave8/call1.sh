#!/usr/bin/env bash
# GPU call 1 of wave 8 (1 x H200): at world size 1, how much of llama1b's step at 4 sequences is
# the FSDP side-stream traffic? The copy-ins of the all-gather disappear with
# --reshard-after-forward 0 (no backward all-gather) plus --optimizer-in-forward 1 (the update
# writes the forward all-gather's input). Eager and graph, then one traced step of each config.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call1; mkdir -p $R
trap 'tar czf $OUT/call1.tgz -C /tmp call1' EXIT
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
run oif1 --optimizer-in-forward 1
run oif1_rsf0 --optimizer-in-forward 1 --reshard-after-forward 0
run oif0_rsf0 --optimizer-in-forward 0 --reshard-after-forward 0
run oif1_rsf0_graph --optimizer-in-forward 1 --reshard-after-forward 0 --cuda-graph
run oif1_graph --optimizer-in-forward 1 --cuda-graph
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
  run ${n}_traced $extra --trace $R/$n.trace.json
  python3 bench/trace_op_totals.py $R/$n.trace.json --top 26 > $R/$n.ops.txt 2>&1; cat $R/$n.ops.txt
  rm -f $R/$n.trace.json
done
echo "total $((SECONDS-T0)) s"
