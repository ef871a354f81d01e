#!/usr/bin/env bash
# The launch forms on a machine with 2+ GPUs (docs/launch.md): each must give the same losses
# as `--nproc 2`, and a rendezvous that never completes must end within --timeout naming the
# missing rank.
#  1. --nproc 2 (the reference);
#  2. two "nodes" of one GPU each on this machine: --nnodes 2 --node-rank 0/1, meeting at node
#     0's store on a free port;
#  3. torchrun --standalone --nproc-per-node 2 --no-python (when torchrun is installed);
#  4. torchrun as two nodes (--nnodes 2 --node-rank 0/1 --master-addr --master-port);
#  5. node 0 of 2 alone, --timeout 5: it must fail naming rank 1, and the time it took is
#     printed.
# Usage: scripts/launch_check.sh [OUTDIR]   (FSDP_BUILD_DIR: a built tree, default build-gpu)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
build=${FSDP_BUILD_DIR:-build-gpu}
fsdp=$(realpath "$build/fsdp")
out=${1:-$build/launch_check}
mkdir -p "$out"
common="--backend cuda --model moe --layers 3 --dim 96 --hidden 160 --experts 3 --tokens 64 --steps 8 --quiet"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
same_losses() {  # A B what: the loss curves must be equal (same GPUs, same NCCL ring)
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
try:
    a, b = (json.load(open(p))["losses"] for p in sys.argv[1:3])
except Exception as e:
    print(f"FAIL {sys.argv[3]}: {e}"); sys.exit(1)
err = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
ok = len(a) == len(b) and err <= 1e-6 * max(abs(x) for x in a)
print(f"{'PASS' if ok else 'FAIL'} {sys.argv[3]}: max loss difference {err:.3g} over {len(a)} steps")
sys.exit(0 if ok else 1)
PY
}
# The forms that span processes of their own meet at a store with the job's secret
# (docs/launch.md); torchrun's agent store takes none and ignores it.
FSDP_STORE_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export FSDP_STORE_SECRET
failed=0
"$fsdp" train $common --nproc 2 --json "$out/nproc2.json" >"$out/nproc2.log" 2>&1 || { failed=1; tail -5 "$out/nproc2.log"; }

port=$(free_port)
CUDA_VISIBLE_DEVICES=1 "$fsdp" train $common --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 \
  --master-port "$port" --nproc 1 >"$out/nodes_1.log" 2>&1 &
node1=$!
CUDA_VISIBLE_DEVICES=0 "$fsdp" train $common --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 \
  --master-port "$port" --nproc 1 --json "$out/nodes.json" >"$out/nodes_0.log" 2>&1 || { failed=1; tail -5 "$out/nodes_0.log"; }
wait $node1 || { failed=1; tail -5 "$out/nodes_1.log"; }
same_losses "$out/nodes.json" "$out/nproc2.json" "--nnodes 2 x --nproc 1 vs --nproc 2" || failed=1

if command -v torchrun >/dev/null; then
  torchrun --standalone --nproc-per-node 2 --no-python "$fsdp" train $common \
    --json "$out/torchrun.json" >"$out/torchrun.log" 2>&1 || { failed=1; tail -5 "$out/torchrun.log"; }
  same_losses "$out/torchrun.json" "$out/nproc2.json" "torchrun --standalone vs --nproc 2" || failed=1
  port=$(free_port)
  pids=()
  for node in 1 0; do
    json=(); [ $node = 0 ] && json=(--json "$out/torchrun_nodes.json")
    CUDA_VISIBLE_DEVICES=$node torchrun --nnodes 2 --node-rank $node --master-addr 127.0.0.1 \
      --master-port "$port" --nproc-per-node 1 --no-python "$fsdp" train $common "${json[@]}" \
      >"$out/torchrun_nodes_$node.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[0]}" || { failed=1; tail -5 "$out/torchrun_nodes_1.log"; }
  wait "${pids[1]}" || { failed=1; tail -5 "$out/torchrun_nodes_0.log"; }
  same_losses "$out/torchrun_nodes.json" "$out/nproc2.json" "torchrun as 2 nodes vs --nproc 2" || failed=1
else
  echo "SKIP torchrun: not installed"
fi

port=$(free_port)
start=$(date +%s.%N)
CUDA_VISIBLE_DEVICES=0 timeout 120 "$fsdp" train $common --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 \
  --master-port "$port" --nproc 1 --timeout 5 >"$out/alone.log" 2>&1
rc=$?
took=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 1 of 2 never arrived" "$out/alone.log"; then
  echo "PASS node 0 alone, --timeout 5: exit $rc after ${took} s naming rank 1"
else
  echo "FAIL node 0 alone, --timeout 5: exit $rc after ${took} s"; tail -3 "$out/alone.log"; failed=1
fi
exit $failed
