#!/usr/bin/env bash
# 1 x H200: where llama1b's GEMMs lose time. Our GEMMs alone (bench/gemm_floor llama) with
# cuBLASLt's first choice and with FSDP_GEMM_AUTOTUNE=1, the same shapes through PyTorch
# (bench/torch_gemm_llama.py), and the 4-sequence step with autotune on.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS; R=/tmp/call2; mkdir -p $R
trap 'tar czf $OUT/call2.tgz -C /tmp call2' EXIT
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
 cmake --build build-gpu -j16 --target fsdp gemm_floor) > $R/build.log 2>&1; echo "build rc=$? at $((SECONDS-T0)) s"
grep -E "error" $R/build.log | head
which nsys ncu 2>&1 | head -3
timeout 60 build-gpu/bench/gemm_floor llama > $R/gemm_floor_llama.jsonl 2>&1; echo "gemm_floor rc=$? at $((SECONDS-T0)) s"
FSDP_GEMM_AUTOTUNE=1 timeout 90 build-gpu/bench/gemm_floor llama > $R/gemm_floor_llama_autotune.jsonl 2>&1; echo "gemm_floor autotune rc=$? at $((SECONDS-T0)) s"
timeout 90 python3 bench/torch_gemm_llama.py > $R/torch_gemm_llama.jsonl 2>&1; echo "torch gemm rc=$? at $((SECONDS-T0)) s"
python3 - $R <<'PY'
import json, sys
R = sys.argv[1]
def load(name):
    out = {}
    for line in open(f"{R}/{name}"):
        try: j = json.loads(line)
        except Exception: continue
        if "gemm" in j: out[j["gemm"]] = j
    return out
a, b, c = load("gemm_floor_llama.jsonl"), load("gemm_floor_llama_autotune.jsonl"), load("torch_gemm_llama.jsonl")
print(f"{'gemm':45s} {'ours ms':>8s} {'autotune':>8s} {'torch':>8s}")
for k in c:
    print(f"{k:45s} {a.get(k,{}).get('ms',0):8.4f} {b.get(k,{}).get('ms',0):8.4f} {c[k]['ms']:8.4f}")
PY
LLAMA="--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 --seq-len 2048 --vocab 32000 --param-dtype bf16 --data data/pydocs-4k --eval-every 0 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0 --tokens 8192"
cmd=(build-gpu/fsdp train --backend cuda --nproc 1 --steps 20 --warmup 5 --quiet $LLAMA --json $R/llama1b_s4_autotune.json)
echo "FSDP_GEMM_AUTOTUNE=1 ${cmd[*]}" > $R/llama1b_s4_autotune.cmd
FSDP_GEMM_AUTOTUNE=1 timeout 120 "${cmd[@]}" > $R/llama1b_s4_autotune.log 2>&1; echo "llama1b s4 autotune rc=$? at $((SECONDS-T0)) s"; tail -2 $R/llama1b_s4_autotune.log
echo "total $((SECONDS-T0)) s"
