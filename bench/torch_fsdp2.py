#!/usr/bin/env python3
"""PyTorch FSDP2 reference for the "mlp16" workload (see bench/README.md).

FSDP2, N GPUs:  torchrun --standalone --nproc_per_node=N bench/torch_fsdp2.py --tokens 8192 --json out.json
Local, 1 GPU:   python3 bench/torch_fsdp2.py --local --tokens 8192 --json out.json

Model: L blocks of Sequential(Linear(D, D, bias=False), ReLU), weights uniform(-1/sqrt(D), 1/sqrt(D)).
FSDP2 mode: fully_shard on every block (reshard_after_forward from the flag) and on the root (its
default), MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), fp32 master weights,
AdamW(fused=True, lr=1e-4). Local mode: the same model held in bf16 on one GPU, no FSDP, no
process group (a compute reference).
"""
import os

# NVLink SHARP / multicast stays off on the GPU machines. Set before torch.distributed (and NCCL)
# is imported so that every process, torchrun's children included, sees them.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

try:  # PyTorch >= 2.6
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # older releases kept FSDP2 under _composable
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=16, help="blocks (default 16)")
    p.add_argument("--dim", type=int, default=4096, help="model width D (default 4096)")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per rank per step (default 8192)")
    p.add_argument("--steps", type=int, default=30,
                   help="total steps, warm-up included, like `fsdp train --steps` (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timing (default 5)")
    p.add_argument("--reshard-after-forward", type=int, choices=(0, 1), default=1,
                   help="reshard_after_forward of the blocks (the root keeps its default)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--local", action="store_true", help="one GPU, no FSDP, model in bf16")
    p.add_argument("--config", default=None, help="row name in the JSON (default: derived)")
    p.add_argument("--json", default=None, help="rank 0 writes the summary object here")
    a = p.parse_args()
    if a.warmup < 0 or a.warmup >= a.steps:
        p.error(f"--warmup must be in [0, steps), got {a.warmup}")
    if a.steps - a.warmup < 20:
        print(f"warning: only {a.steps - a.warmup} timed steps (>= 20 recommended)", file=sys.stderr)
    return a


def build_model(layers, dim, seed):
    blocks = [nn.Sequential(nn.Linear(dim, dim, bias=False), nn.ReLU()) for _ in range(layers)]
    model = nn.Sequential(*blocks)
    # Same on every rank (same seed): FSDP2 then keeps each rank's shard of identical weights.
    gen = torch.Generator(device="cuda").manual_seed(seed)
    bound = 1.0 / math.sqrt(dim)
    with torch.no_grad():
        for blk in blocks:
            blk[0].weight.uniform_(-bound, bound, generator=gen)
    return model


def nccl_version():
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)
    except Exception:  # informational only
        return None


def main():
    a = parse_args()
    local = a.local
    if local:
        rank, world, local_rank = 0, 1, 0
    else:
        if "LOCAL_RANK" not in os.environ:
            sys.exit("FSDP2 mode needs torchrun (LOCAL_RANK unset); use --local for one GPU")
        local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    if not local:
        dist.init_process_group("nccl", device_id=device)
        rank, world = dist.get_rank(), dist.get_world_size()

    reshard = bool(a.reshard_after_forward)
    engine = "torch-local" if local else "torch-fsdp2"
    config = a.config or (f"mlp{a.layers} t{a.tokens} 1gpu" if local
                          else f"mlp{a.layers} t{a.tokens} reshard{int(reshard)}")

    with torch.device(device):
        model = build_model(a.layers, a.dim, a.seed)
    params = sum(p.numel() for p in model.parameters())  # before sharding: L * D * D
    assert params == a.layers * a.dim * a.dim, params
    if local:
        model = model.to(torch.bfloat16)  # bf16 params, grads and AdamW state
    else:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for blk in model:
            fully_shard(blk, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mp_policy=mp)  # root: reshard_after_forward left at its default
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, fused=True)

    # Every step's input, generated before timing: [tokens, D] bf16, unit variance (uniform in
    # +-sqrt(3), like our engine's data), different per rank and per step.
    torch.cuda.synchronize()
    before_pool = torch.cuda.memory_allocated()
    gen = torch.Generator(device=device).manual_seed(a.seed * 1000003 + rank)
    s3 = math.sqrt(3.0)
    batches = [torch.empty(a.tokens, a.dim, dtype=torch.bfloat16, device=device).uniform_(-s3, s3, generator=gen)
               for _ in range(a.steps)]
    torch.cuda.synchronize()
    pool_bytes = torch.cuda.memory_allocated() - before_pool
    one_batch_bytes = pool_bytes // a.steps

    # Peak memory: the peak counter is reset HERE, before the first (warm-up) step, not after the
    # warm-up. AdamW allocates its state lazily in step 1, so the optimizer state, the fp32 master
    # shards, the gradients and the activations all count. The pre-generated
    # input pool is a benchmark artifact: it is subtracted, except for the one batch a step uses.
    torch.cuda.reset_peak_memory_stats()

    # Step time: torch.cuda.synchronize + perf_counter around each step (the same way our engine
    # times its steps: host clock, device synchronised at the end of every step). The loss is not
    # read back to the host inside the step.
    step_ms, losses = [], []
    for step in range(a.steps):
        x = batches[step]
        t0 = time.perf_counter()
        y = model(x)
        loss = torch.mean(y.square(), dtype=torch.float32)  # mean of squares of the output
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.detach())
        del y, loss

    raw_peak = torch.cuda.max_memory_allocated()
    peak = raw_peak - pool_bytes + one_batch_bytes
    timed = step_ms[a.warmup:]
    med = statistics.median(timed)
    if not local:
        t = torch.tensor([peak, raw_peak], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # max over ranks
        peak, raw_peak = int(t[0].item()), int(t[1].item())
        m = torch.tensor([med], dtype=torch.float64, device=device)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        med_max_rank = float(m.item())
    else:
        med_max_rank = med
    loss_vals = [float(v) for v in losses]

    if rank == 0:
        out = {
            "config": config,
            "engine": engine,
            "world_size": world,
            "tokens_per_rank": a.tokens,
            "step_ms": med,                      # median over the timed steps, rank 0
            "tflops_per_gpu": 6.0 * params * a.tokens / (med * 1e-3) / 1e12,
            "peak_mem_bytes": int(peak),         # max over ranks
            "reshard_after_forward": None if local else reshard,
            "step_ms_mean": statistics.fmean(timed),
            "step_ms_min": min(timed),
            "step_ms_median_max_rank": med_max_rank,
            "peak_mem_bytes_raw": int(raw_peak),  # with the whole input pool
            "input_pool_bytes": int(pool_bytes),
            "layers": a.layers,
            "dim": a.dim,
            "params": params,
            "steps": a.steps,
            "warmup": a.warmup,
            "loss_first": loss_vals[0],
            "loss_last": loss_vals[-1],
            "torch_version": torch.__version__,
            "nccl_version": nccl_version(),
            "gpu": torch.cuda.get_device_name(device),
        }
        print(f"done: {engine} {config}, {world} ranks, step_ms median {med:.2f}, "
              f"{out['tflops_per_gpu']:.0f} TFLOP/s per GPU, peak {peak / 2**30:.3f} GiB, "
              f"loss {loss_vals[0]:.6g} -> {loss_vals[-1]:.6g}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=2)
                f.write("\n")
    if not local:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
