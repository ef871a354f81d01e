#!/usr/bin/env bash
# 1 x H200: the code not yet run on a GPU (early grad norm, one store_pack, the two-stream test
# fixture): the whole GPU suite and the llama1b graph rows; then a traced eager llama1b at 4
# sequences (device ms per step by op kind) to see where the step spends the ~19 ms above an
# estimated ~98 ms step floor.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call1; mkdir -p $R
trap 'tar czf $OUT/call1.tgz -C /tmp call1' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp fsdp_gpu_tests) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
grep -E "error" $R/build.log | head
timeout 200 build-gpu/fsdp_gpu_tests > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure|differs|Expected|Which is" $R/gpu_tests.log | head -30
ROWS="llama" timeout 240 bench/run_cuda_graph_bench.sh $R/bench > $R/bench.log 2>&1; echo "bench rc=$? at $((SECONDS-T0)) s"; tail -5 $R/bench.log
for f in $R/bench/llama1b_*.json; do python3 -c "import json; j=json.load(open('$f')); print('$f'.split('/')[-1], 'step', round(j['step_ms_median'],3), 'host us', round(j['host_us_per_step'],1), 'reserved GiB', round(j['backend_reserved_peak_bytes']/2**30,2))"; done
LLAMA="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0 --tokens 8192"
for mode in eager traced; do
  extra=""; [[ $mode == traced ]] && extra="--trace $R/llama1b_s4.trace.json"
  cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 20 --warmup 5 --quiet $LLAMA $extra --json $R/llama1b_s4_$mode.json)
  echo "${cmd[*]}" > $R/llama1b_s4_$mode.cmd
  timeout 120 "${cmd[@]}" > $R/llama1b_s4_$mode.log 2>&1; echo "llama1b s4 $mode rc=$? at $((SECONDS-T0)) s"
  python3 -c "import json; j=json.load(open('$R/llama1b_s4_$mode.json')); print('step_ms_median', j.get('step_ms_median'))"
done
python3 bench/trace_op_totals.py $R/llama1b_s4.trace.json --top 20 > $R/llama1b_s4.ops.txt 2>&1; cat $R/llama1b_s4.ops.txt
build-gpu/fsdp report $R/llama1b_s4.trace.json --top 5 > $R/llama1b_s4.report.txt 2>&1; head -20 $R/llama1b_s4.report.txt
rm -f $R/*.trace.json
echo "total $((SECONDS-T0)) s"
