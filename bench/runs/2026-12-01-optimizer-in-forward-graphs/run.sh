#!/usr/bin/env bash
# 1 x H200: the optimizer in forward under CUDA graphs (the optimizer-in-forward run found an
# eager wait on an event the capture had recorded last), the whole GPU suite with its new
# bitwise test, then llama1b under --cuda-graph with the step after backward (oif0) and in the
# next forward (oif1), at 1 and 4 sequences.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call4; mkdir -p $R
trap 'tar czf $OUT/call4.tgz -C /tmp call4' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp fsdp_gpu_tests) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
grep -E "error" $R/build.log | head
timeout 200 build-gpu/fsdp_gpu_tests > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure|differs|Expected|Which is|oif" $R/gpu_tests.log | head -30
LLAMA="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0"
run() {  # NAME ARGS...
  local name=$1; shift
  local cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 20 --warmup 5 --quiet $LLAMA "$@" --json $R/$name.json)
  echo "${cmd[*]}" > $R/$name.cmd
  timeout 150 "${cmd[@]}" > $R/$name.log 2>&1; echo "$name rc=$? at $((SECONDS-T0)) s: $(tail -1 $R/$name.log)"
}
run s1_graph_oif1 --tokens 2048 --cuda-graph --optimizer-in-forward 1
run s1_graph_oif0 --tokens 2048 --cuda-graph --optimizer-in-forward 0
run s4_graph_oif1 --tokens 8192 --cuda-graph --optimizer-in-forward 1
run s4_graph_oif0 --tokens 8192 --cuda-graph --optimizer-in-forward 0
for f in $R/s*.json; do python3 -c "import json; j=json.load(open('$f')); print('$f'.split('/')[-1], 'step', round(j['step_ms_median'],3), 'host us', round(j['host_us_per_step'],1), 'peak GiB', round(j['backend_peak_bytes']/2**30,2), 'reserved GiB', round(j['backend_reserved_peak_bytes']/2**30,2), 'streams', j.get('graph_streams'))"; done
echo "total $((SECONDS-T0)) s"
