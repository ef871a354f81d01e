#!/usr/bin/env bash
# One GPU run for --cuda-graph (docs/cuda_graphs.md): build, the capture tests, the
# eager-vs-graph bitwise tests, then bench/run_cuda_graph_bench.sh's rows, most important first,
# each phase only while BUDGET_S (default 390) seconds have not run out.
#
#   bench/cuda_graph_check.sh OUTDIR
#
# OUTDIR (best a run folder, bench/runs/DATE-purpose/) gets summary.txt (one line per phase), the
# logs, and OUTDIR/cuda_graph_h200x1.{json,md} from bench/cuda_graph_table.py.
set -u
OUTDIR=${1:?usage: bench/cuda_graph_check.sh OUTDIR}
BUDGET_S=${BUDGET_S:-390}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUTDIR/bench"
S=$OUTDIR/summary.txt
left() { echo $((BUDGET_S - SECONDS)); }
note() { echo "[$SECONDS s] $*" | tee -a "$S"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUTDIR/gpu.txt" 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDP_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUTDIR/cmake.log" 2>&1 &&
  cmake --build build-gpu -j16 --target fsdp fsdp_gpu_tests gemm_floor > "$OUTDIR/build.log" 2>&1
rc=$?
note "build rc=$rc"
if (( rc != 0 )); then tail -n 40 "$OUTDIR/build.log" >> "$S"; exit 1; fi

gtest() {  # NAME FILTER TIMEOUT
  if (( $(left) < $3 )); then note "$1 skipped: $(left) s left"; return; fi
  timeout "$3" build-gpu/fsdp_gpu_tests --gtest_filter="$2" > "$OUTDIR/$1.log" 2>&1
  note "$1 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUTDIR/$1.log" | tr '\n' ' ')"
  grep -E "Failure|differs|error|streams \[" "$OUTDIR/$1.log" | head -n 30 >> "$S"
}
gtest capture_device 'CudaGraphDevice.*' 60
gtest refusal 'CudaGraphTrain.MoeTransformer*' 30
gtest bitwise_mlp 'CudaGraphTrain.Mlp*' 120
gtest bitwise_transformer 'CudaGraphTrain.Transformer*' 80
gtest bitwise_moe 'CudaGraphTrain.MoeWith*' 30

bench_rows() {  # ROWS NEEDED_S
  if (( $(left) < $2 )); then note "bench $1 skipped: $(left) s left"; return; fi
  ROWS="$1" bench/run_cuda_graph_bench.sh "$OUTDIR/bench" >> "$S" 2>&1
}
bench_rows mlp 60
bench_rows floor 25
bench_rows llama 100
python3 bench/cuda_graph_table.py "$OUTDIR/bench" "$OUTDIR/cuda_graph_h200x1" >> "$S" 2>&1
note "done"
