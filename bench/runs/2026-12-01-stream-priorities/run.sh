#!/usr/bin/env bash
# 1 x H200: the one-rank copy-in into the grad shard (commit "One rank: ...") on the GPU: the GPU
# suite, then llama1b at 4 sequences. Also an experiment, applied from
# priority_experiment.patch and not committed: FSDP_EXP_PRIORITY=flat gives every stream the
# same priority, =compute gives compute the high one (by default the all-gather and
# reduce-scatter streams have it, as in FSDP2).
set -u
git apply bench/runs/2026-12-01-stream-priorities/priority_experiment.patch || patch -p1 < bench/runs/2026-12-01-stream-priorities/priority_experiment.patch
source bench/gpu_call.sh
gpu_call_begin call2 fsdp fsdp_gpu_tests
timeout 200 build-gpu/fsdp_gpu_tests > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $((SECONDS-T0)) s"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure|differs|Expected|Which is" $R/gpu_tests.log | head -30
FSDP_RUN_ENV=FSDP_EXP_PRIORITY=default run_llama oif0 --tokens 8192 --optimizer-in-forward 0
FSDP_RUN_ENV=FSDP_EXP_PRIORITY=default run_llama oif1 --tokens 8192 --optimizer-in-forward 1
FSDP_RUN_ENV=FSDP_EXP_PRIORITY=flat run_llama oif0_flat --tokens 8192 --optimizer-in-forward 0
FSDP_RUN_ENV=FSDP_EXP_PRIORITY=flat run_llama oif1_flat --tokens 8192 --optimizer-in-forward 1
FSDP_RUN_ENV=FSDP_EXP_PRIORITY=compute run_llama oif0_compute --tokens 8192 --optimizer-in-forward 0
FSDP_RUN_ENV=FSDP_EXP_PRIORITY=compute run_llama oif1_compute --tokens 8192 --optimizer-in-forward 1
FSDP_RUN_ENV=FSDP_EXP_PRIORITY=compute run_llama oif1_rsf0_compute --tokens 8192 --optimizer-in-forward 1 --reshard-after-forward 0
python3 - $R <<'PY'
import json, sys
R = sys.argv[1]
for n in ["oif0", "oif1", "oif0_flat", "oif1_flat", "oif0_compute", "oif1_compute", "oif1_rsf0_compute"]:
    try: x = json.load(open(f"{R}/{n}.json"))
    except Exception: continue
    print(n, "step_ms", round(x["step_ms_median"], 3), "peak GiB", round(x["backend_peak_bytes"] / 2**30, 2), "loss_last", x["loss_last"])
PY
best=${BEST:-compute}
FSDP_RUN_ENV=FSDP_EXP_PRIORITY=$best run_llama oif1_${best}_traced --tokens 8192 --optimizer-in-forward 1 --trace $R/t.trace.json
python3 bench/trace_op_totals.py $R/t.trace.json --top 26 > $R/oif1_${best}.ops.txt 2>&1; cat $R/oif1_${best}.ops.txt
rm -f $R/*.trace.json
echo "total $((SECONDS-T0)) s"
