#!/usr/bin/env bash
# GPU call 2 of wave 8 (1 x H200): the one-rank copy-in into the grad shard (commit "One
# rank: ...") on the GPU: the GPU suite, then llama1b at 4 sequences. Also an experiment,
# applied from priority_experiment.patch and not committed: FSDP_EXP_PRIORITY=flat gives every
# stream the same priority, =compute gives compute the high one (by default the all-gather and
# reduce-scatter streams have it, as in FSDP2).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call2; mkdir -p $R
trap 'tar czf $OUT/call2.tgz -C /tmp call2' EXIT
git apply bench/results/gpu_wave8/priority_experiment.patch || patch -p1 < bench/results/gpu_wave8/priority_experiment.patch
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp fsdp_gpu_tests) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
grep -E "error" $R/build.log | head
timeout 200 build-gpu/fsdp_gpu_tests > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure|differs|Expected|Which is" $R/gpu_tests.log | head -30
LLAMA="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0 --tokens 8192"
run() {  # NAME PRIORITY ARGS...
  local name=$1 prio=$2; shift 2
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 20 --warmup 5 --quiet $LLAMA "$@" --json $R/$name.json)
  echo "FSDP_EXP_PRIORITY=$prio ${cmd[*]}" > $R/$name.cmd
  FSDP_EXP_PRIORITY=$prio timeout 150 "${cmd[@]}" > $R/$name.log 2>&1; echo "$name rc=$? at $((SECONDS-T0)) s: $(tail -1 $R/$name.log)"
}
run oif0 default --optimizer-in-forward 0
run oif1 default --optimizer-in-forward 1
run oif0_flat flat --optimizer-in-forward 0
run oif1_flat flat --optimizer-in-forward 1
run oif0_compute compute --optimizer-in-forward 0
run oif1_compute compute --optimizer-in-forward 1
run oif1_rsf0_compute compute --optimizer-in-forward 1 --reshard-after-forward 0
python3 - $R <<'PY'
import json, sys
R = sys.argv[1]
for n in ["oif0", "oif1", "oif0_flat", "oif1_flat", "oif0_compute", "oif1_compute", "oif1_rsf0_compute"]:
    try: x = json.load(open(f"{R}/{n}.json"))
    except Exception: continue
    print(n, "step_ms", round(x["step_ms_median"], 3), "peak GiB", round(x["backend_peak_bytes"] / 2**30, 2), "loss_last", x["loss_last"])
PY
best=${BEST:-compute}
run oif1_${best}_traced $best --optimizer-in-forward 1 --trace $R/t.trace.json
python3 bench/trace_op_totals.py $R/t.trace.json --top 26 > $R/oif1_${best}.ops.txt 2>&1; cat $R/oif1_${best}.ops.txt
rm -f $R/*.trace.json
echo "total $((SECONDS-T0)) s"
