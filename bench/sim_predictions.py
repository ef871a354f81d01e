#!/usr/bin/env python3
"""Prediction tables of the simulation backend (docs/simulate.md), with the commands that make
them:

    python3 bench/sim_predictions.py [--fsdp build/fsdp] [--calibration bench/calibrations/h200.json]
                                     [--out bench/calibrations/h200_predictions.md]

1. Llama-3.1-8B and -70B shapes on 8 to 1024 H200s (8 a node, the calibration's NVLink and
   network), FSDP and HSDP: each the best setting of `fsdp simulate --sweep` that fits in memory;
   70B at 4096-token sequences, and at 8192 with full activation checkpointing.
2. The MoE transformer with its experts on ep 8 sub-meshes on 64 and 512 GPUs, the bounded RS
   ring beside PyTorch 2.12's drain-by-the-last-group policy: step time, RS inputs in flight and
   peak memory over 100 steps, for k 1, 2 and the separate RS group.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

MODELS = {
    "Llama-3.1-8B": "--model transformer --layers 32 --dim 4096 --heads 32 --kv-heads 8 --ffn-dim 14336 "
                    "--vocab 128256 --seq-len 8192 --tokens 8192 --param-dtype bf16",
    "Llama-3.1-70B": "--model transformer --layers 80 --dim 8192 --heads 64 --kv-heads 8 --ffn-dim 28672 "
                     "--vocab 128256 --seq-len 4096 --tokens 4096 --param-dtype bf16",
    # At its own sequence length 70B's activations need checkpointing (the sweep keeps the
    # command's --activation-checkpointing).
    "Llama-3.1-70B, seq 8192, full activation checkpointing":
        "--model transformer --layers 80 --dim 8192 --heads 64 --kv-heads 8 --ffn-dim 28672 "
        "--vocab 128256 --seq-len 8192 --tokens 8192 --param-dtype bf16 --activation-checkpointing full",
}
MOE = ("--model moe-transformer --layers 16 --dim 2048 --heads 16 --kv-heads 4 --ffn-dim 5504 --seq-len 2048 "
       "--vocab 4096 --experts 8 --top-k 2 --expert-ffn-dim 1408 --capacity-factor 0 --aux-loss-weight 0.01 "
       "--moe-every 2 --tokens 8192 --param-dtype bf16 --clip-grad-norm 1.0 --optimizer-in-backward 0 --ep 8")
GPUS = [8, 16, 32, 64, 128, 256, 512, 1024]


def simulate(a, args):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "s.json")
        subprocess.run([a.fsdp, "simulate", "--calibration", a.calibration, "--json", out] + args.split(),
                       check=True, stdout=subprocess.DEVNULL)
        return json.load(open(out))


def gib(b):
    return b / 2**30


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdp", default="build/fsdp")
    ap.add_argument("--calibration", default="bench/calibrations/h200.json")
    ap.add_argument("--out")
    a = ap.parse_args()
    lines = []
    for name, args in MODELS.items():
        lines += [f"### {name}", "", f"`fsdp simulate {args} --gpus N --sweep`", "",
                  "| GPUs | mesh | best setting | step ms | tokens/s/GPU | MFU | exposed comm ms | RS recycle stall ms | peak GiB |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for n in GPUS:
            rows = simulate(a, f"{args} --gpus {n} --sweep")["sweep"]
            for mesh in ("FSDP", "HSDP"):
                fits = [r for r in rows if r["fits"] and (" --hsdp 0 " in r["setting"]) == (mesh == "FSDP")]
                if not fits:
                    if mesh == "FSDP" or n > 8:
                        lines.append(f"| {n} | {mesh} | none fits | | | | | | |")
                    continue
                b = min(fits, key=lambda r: r["step_ms"])
                lines.append(f"| {n} | {mesh} | `{b['setting']}` | {b['step_ms']:.1f} | {b['tokens_per_s_per_gpu']:.0f} | "
                             f"{100 * b['mfu']:.1f}% | {b['exposed_comm_ms']:.2f} | {b['rs_recycle_stall_ms']:.2f} | "
                             f"{gib(b['peak_mem_bytes']):.1f} |")
                print(lines[-1], flush=True)
        lines.append("")
    lines += ["### The MoE transformer, experts on ep 8 sub-meshes", "",
              f"`fsdp simulate {MOE} --gpus N --steps 100 --warmup 5 --rs-max-input-buffers K "
              "--separate-rs-group S --rs-reclaim P`", "",
              "| GPUs | RS reclaim | K | S | step ms | exposed comm ms | RS recycle stall ms | RS inputs in flight | peak GiB after step 1 | after step 100 |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for n in (64, 512):
        for policy in ("bounded", "fsdp2.12"):
            for k, sep in ((1, 0), (2, 0), (1, 1)):
                s = simulate(a, f"{MOE} --gpus {n} --steps 100 --warmup 5 --rs-max-input-buffers {k} "
                                f"--separate-rs-group {sep} --rs-reclaim {policy}")["step"]
                by = s["peak_mem_bytes_by_step"]
                lines.append(f"| {n} | {policy} | {k} | {sep} | {s['step_ms']:.1f} | {s['exposed_comm_ms']:.2f} | "
                             f"{s['rs_recycle_stall_ms']:.2f} | {s['rs_inputs_in_flight_max']} | "
                             f"{gib(by[0]):.2f} | {gib(by[-1]):.2f} |")
                print(lines[-1], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
