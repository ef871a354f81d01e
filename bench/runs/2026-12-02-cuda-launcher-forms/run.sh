#!/usr/bin/env bash
# 1 x H200: the CUDA launcher after "Failure notices under torchrun, srun and mpirun" (each rank
# sets the watchdog's lost-rank reader, posts its own error, and under an external launcher
# arms its store connection). One GPU runs one rank, so this checks that the launcher still
# trains as --nproc 1 and as one rank of torchrun and of srun; then two torchrun-form ranks on
# the one GPU, which NCCL refuses: what each rank says.
set -u
source bench/gpu_call.sh
gpu_call_begin call4 fsdp
MLP="train --backend cuda --model mlp --layers 4 --dim 1024 --param-dtype bf16 --tokens 2048 --steps 5 --warmup 1 --timeout 20"
timeout 120 build-gpu/fsdp $MLP --nproc 1 --json $R/nproc1.json > $R/nproc1.log 2>&1; echo "nproc1 rc=$?: $(tail -1 $R/nproc1.log)"
timeout 120 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29561 build-gpu/fsdp $MLP --json $R/torchrun1.json > $R/torchrun1.log 2>&1; echo "torchrun1 rc=$?: $(tail -1 $R/torchrun1.log)"
timeout 120 env SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 SLURM_NNODES=1 SLURM_NODEID=0 SLURM_STEP_NODELIST=127.0.0.1 MASTER_PORT=29562 build-gpu/fsdp $MLP --json $R/srun1.json > $R/srun1.log 2>&1; echo "srun1 rc=$?: $(tail -1 $R/srun1.log)"
python3 -c "
import json
a, b, c = (json.load(open('$R/' + n + '.json'))['losses'] for n in ['nproc1', 'torchrun1', 'srun1'])
print('losses equal across the three launches:', a == b == c, a)"
E="WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29563"
(timeout 90 env RANK=1 LOCAL_RANK=1 $E build-gpu/fsdp $MLP > $R/two_on_one1.log 2>&1; echo "two-on-one rank 1 rc=$?") &
timeout 90 env RANK=0 LOCAL_RANK=0 $E build-gpu/fsdp $MLP > $R/two_on_one0.log 2>&1; echo "two-on-one rank 0 rc=$?"
wait
for r in 0 1; do echo "-- rank $r:"; grep -v "^NCCL\|^\s*$" $R/two_on_one$r.log | cut -c1-400 | tail -4; done
echo "total $((SECONDS-T0)) s"
