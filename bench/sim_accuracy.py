#!/usr/bin/env python3
"""The simulation backend's predictions beside every committed measured step (docs/simulate.md).

    python3 bench/sim_accuracy.py [--fsdp build/fsdp] [--calibration bench/calibrations/h200.json]
                                  [--out TABLE.md]

Each row: a measured step time from docs/performance.md (its run folder under bench/runs/), and
`fsdp simulate` of the same command on the same number of GPUs. The calibration holds op timings
only (bench/calibrations/make_h200.sh), so no row's step time went into it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

LLAMA1B = ("--model transformer --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ffn-dim 5632 "
           "--seq-len 2048 --vocab 32000 --param-dtype bf16 --lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 "
           "--clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0")
MLP16 = "--model mlp --layers 16 --dim 4096 --param-dtype bf16"
MOE = ("--model moe-transformer --layers 16 --dim 2048 --heads 16 --kv-heads 4 --ffn-dim 5504 "
       "--seq-len 2048 --vocab 4096 --experts 8 --top-k 2 --expert-ffn-dim 1408 --capacity-factor 0 "
       "--aux-loss-weight 0.01 --moe-every 2 --tokens 8192 --param-dtype bf16 --lr 3e-4 --min-lr 3e-5 "
       "--warmup-steps 5 --weight-decay 0.1 --clip-grad-norm 1.0 --optimizer-in-backward 0")
# The Llama-3.2-1B shape (tied embeddings) and the 3.0B shape, as their runs' .cmd files give them.
LLAMA32_1B = ("--model transformer --layers 16 --dim 2048 --heads 32 --kv-heads 8 --ffn-dim 8192 "
              "--seq-len 2048 --vocab 128256 --rope-theta 500000 --tie-embeddings --param-dtype bf16 "
              "--lr 3e-4 --min-lr 3e-5 --weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 "
              "--optimizer-in-backward 0 --tokens 8192")
SHAPE_3B = ("--model transformer --layers 28 --dim 3072 --heads 24 --kv-heads 8 --ffn-dim 8192 "
            "--seq-len 8192 --vocab 32000 --tokens 16384 --param-dtype bf16 --lr 3e-4 --min-lr 3e-5 "
            "--weight-decay 0.1 --clip-grad-norm 1.0 --warmup-steps 5 --optimizer-in-backward 0")

SHAPE_3B_6X = SHAPE_3B.replace("--tokens 16384", "--tokens 49152")


def mlp(tokens, oib):
    clip = "--clip-grad-norm 0" if oib else "--clip-grad-norm 0 --optimizer-in-backward 0"
    return f"{MLP16} --tokens {tokens} {clip}" + (" --optimizer-in-backward 1" if oib else "")


def checkpointing_3b(run, none_ms, full_ms, selective_ms):
    """The 3.0B shape's rows without, with full and with selective checkpointing, of one run."""
    return [(f"3.0B shape, {name} checkpointing", 1, ms, run,
             f"{SHAPE_3B} --activation-checkpointing {mode}")
            for name, mode, ms in (("no", "none", none_ms), ("full", "full", full_ms),
                                   ("selective", "selective", selective_ms))]


def optimizer_in_forward(run, graph, s1_after, s1_in_forward, s4_after, s4_in_forward):
    """llama1b at 1 and 4 sequences with the optimizer step after backward and in forward."""
    kind = "graph" if graph else "eager"
    return [(f"llama1b, {seqs}, {kind}, optimizer {where}", 1, ms, run,
             f"{LLAMA1B} --tokens {tokens}{graph} --optimizer-in-forward {oif}")
            for seqs, tokens, where, oif, ms in (
                ("1 seq", 2048, "after backward", 0, s1_after), ("1 seq", 2048, "in forward", 1, s1_in_forward),
                ("4 seqs", 8192, "after backward", 0, s4_after), ("4 seqs", 8192, "in forward", 1, s4_in_forward))]


def moe_one_gpu(run, *ms):
    """The MoE transformer's four one-GPU rows of one run: k 1 and 2, the separate RS group off and on."""
    settings = ((1, 0, "--rs-max-input-buffers 1"), (2, 0, "--rs-max-input-buffers 2"),
                (1, 1, "--separate-rs-group 1"), (2, 1, "--rs-max-input-buffers 2 --separate-rs-group 1"))
    return [(f"MoE transformer, k {k}, S {s}", 1, step, run, f"{MOE} {flags}")
            for (k, s, flags), step in zip(settings, ms, strict=True)]


# (row, GPUs, measured step ms, run folder, simulate arguments)
ROWS = [
    ("llama1b, 1 seq, eager", 1, 40.40, "2026-12-02-model-layer", f"{LLAMA1B} --tokens 2048"),
    ("llama1b, 2 seqs, eager", 1, 65.76, "2026-12-01-llama1b-graphs", f"{LLAMA1B} --tokens 4096"),
    ("llama1b, 4 seqs, eager", 1, 112.20, "2026-12-02-model-layer", f"{LLAMA1B} --tokens 8192"),
    ("llama1b, 4 seqs, eager", 1, 113.84, "2026-12-02-merged-tree", f"{LLAMA1B} --tokens 8192"),
    ("llama1b, 1 seq, graph", 1, 41.89, "2026-12-01-llama1b-graphs", f"{LLAMA1B} --tokens 2048 --cuda-graph"),
    ("llama1b, 2 seqs, graph", 1, 65.52, "2026-12-01-llama1b-graphs", f"{LLAMA1B} --tokens 4096 --cuda-graph"),
    ("llama1b, 4 seqs, graph", 1, 113.32, "2026-12-01-llama1b-graph-vs-eager", f"{LLAMA1B} --tokens 8192 --cuda-graph"),
    ("llama1b, 1 seq, eager", 1, 42.61, "2026-12-01-llama1b-graphs", f"{LLAMA1B} --tokens 2048"),
    ("llama1b, 4 seqs, eager", 1, 113.37, "2026-12-01-llama1b-graph-vs-eager", f"{LLAMA1B} --tokens 8192"),
    ("llama1b, 4 seqs, eager", 1, 118.34, "2026-12-01-llama1b-vs-fsdp2", f"{LLAMA1B} --tokens 8192"),
    ("llama1b, 1 seq, eager", 1, 43.71, "2026-12-01-llama1b-vs-fsdp2", f"{LLAMA1B} --tokens 2048"),
    *optimizer_in_forward("2026-12-01-optimizer-in-forward", "", 42.27, 41.16, 113.74, 112.48),
    *optimizer_in_forward("2026-12-01-optimizer-in-forward-graphs", " --cuda-graph", 42.12, 41.17, 116.08, 115.14),
    ("llama1b, 4 seqs, eager, optimizer in forward, no reshard", 1, 112.35, "2026-12-01-llama1b-copy-ins",
     f"{LLAMA1B} --tokens 8192 --optimizer-in-forward 1 --reshard-after-forward 0"),
    ("llama1b, 4 seqs, graph, optimizer in forward, no reshard", 1, 112.25, "2026-12-01-llama1b-copy-ins",
     f"{LLAMA1B} --tokens 8192 --cuda-graph --optimizer-in-forward 1 --reshard-after-forward 0"),
    ("mlp16, 2048 tokens, eager", 1, 7.06, "2026-12-01-labels-on-device", mlp(2048, True)),
    ("mlp16, 8192 tokens, eager", 1, 20.33, "2026-12-01-labels-on-device", mlp(8192, True)),
    ("mlp16, 2048 tokens, graph", 1, 7.04, "2026-12-01-labels-on-device", mlp(2048, True) + " --cuda-graph"),
    ("mlp16, 8192 tokens, graph", 1, 20.50, "2026-12-01-labels-on-device", mlp(8192, True) + " --cuda-graph"),
    ("Llama-3.2-1B shape, 4 seqs, eager", 1, 126.28, "2026-12-03-llama32-1b", LLAMA32_1B),
    *checkpointing_3b("2026-12-02-activation-checkpointing", 638.60, 825.02, 650.04),
    # The grads freed after each step (the default since; it costs no time).
    *checkpointing_3b("2026-12-04-grads-set-to-none", 662.91, 849.36, 670.65),
    ("3.0B shape, no checkpointing", 1, 642.18, "2026-12-03-fp8-3b", SHAPE_3B),
    ("3.0B shape, no checkpointing", 1, 650.17, "2026-12-04-fp8-3b-trace", SHAPE_3B),
    ("3.0B shape, no checkpointing", 1, 645.54, "2026-12-04-fp8-fused-amax", SHAPE_3B),
    # 6 x 8192 tokens, which does not fit one H200 in one batch: the planner's choice and two
    # settings by hand.
    ("3.0B shape, 6 x 8192, 2 micro-batches (the plan)", 1, 1961.86, "2026-12-03-memory-planner",
     f"{SHAPE_3B_6X} --micro-batches 2 --activation-checkpointing none"),
    ("3.0B shape, 6 x 8192, 3 micro-batches", 1, 1966.33, "2026-12-03-memory-planner",
     f"{SHAPE_3B_6X} --micro-batches 3 --activation-checkpointing none"),
    ("3.0B shape, 6 x 8192, selective, 2 micro-batches", 1, 1989.53, "2026-12-03-memory-planner",
     f"{SHAPE_3B_6X} --micro-batches 2 --activation-checkpointing selective"),
    ("llama1b, 4 seqs, eager", 1, 112.36, "2026-12-04-fp8-fused-amax", f"{LLAMA1B} --tokens 8192"),
    *moe_one_gpu("2026-12-01-moe-transformer", 91.36, 90.34, 90.47, 90.18),
    # After the early-stopping recompute, the norms' fused amaxes and the MoE residuals fused
    # into its norms.
    *checkpointing_3b("2026-12-05-checkpointing-3b", 652.47, 798.41, 661.56),
    ("3.0B shape, no checkpointing", 1, 647.45, "2026-12-05-fp8-3b", SHAPE_3B),
    ("llama1b, 4 seqs, eager", 1, 113.09, "2026-12-05-fp8-3b", f"{LLAMA1B} --tokens 8192"),
    *moe_one_gpu("2026-12-05-moe-gpu-tests-sweep", 93.0, 93.3, 93.4, 93.6),
    ("MoE transformer, ep 2, k 1, S 0", 2, 102.26, "2026-12-01-h200x2-launch-moe", f"{MOE} --ep 2"),
    ("MoE transformer, ep 2, k 2, S 1", 2, 101.24, "2026-12-01-h200x2-launch-moe",
     f"{MOE} --ep 2 --rs-max-input-buffers 2 --separate-rs-group 1"),
]
# Runs of an older schedule than the one the simulator runs (the summary also leaves them out).
OLDER_CODE = "2026-11-30"
# bench/runs/2026-11-30-mlp16-h200x2/h200x2.json: every row of ours (R, K, S, O by its name)
H200X2 = "bench/runs/2026-11-30-mlp16-h200x2/h200x2.json"


def h200x2_rows():
    rows = []
    for r in json.load(open(H200X2)):
        if r.get("engine") != "fsdp" or r.get("status") != "ok":
            continue
        n, t = r["world_size"], r["tokens_per_rank"]
        oib = r.get("optimizer_in_backward", True)
        args = mlp(t, oib)
        if n > 1:
            args += (f" --reshard-after-forward {int(r['reshard_after_forward'])}"
                     f" --rs-max-input-buffers {r['rs_max_input_buffers']}"
                     f" --separate-rs-group {int(r['separate_rs_group'])}")
        rows.append((f"h200x2 {r['source']}", n, r["step_ms"], "2026-11-30-mlp16-h200x2", args))
    return rows


def simulate(fsdp, calibration, gpus, args):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "s.json")
        cmd = [fsdp, "simulate", "--gpus", str(gpus), "--calibration", calibration, "--json", out] + args.split()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return json.load(open(out))["step"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdp", default="build/fsdp")
    ap.add_argument("--calibration", default="bench/calibrations/h200.json")
    ap.add_argument("--out")
    a = ap.parse_args()
    lines = ["| row | GPUs | measured ms | predicted ms | error | run |", "|---|---|---|---|---|---|"]
    errors, recent = [], []
    for name, gpus, measured, run, args in ROWS + h200x2_rows():
        predicted = simulate(a.fsdp, a.calibration, gpus, args)["step_ms"]
        err = (predicted - measured) / measured
        errors.append(abs(err))
        if not run.startswith(OLDER_CODE):
            recent.append(abs(err))
        lines.append(f"| {name} | {gpus} | {measured:.2f} | {predicted:.2f} | {100 * err:+.1f}% | {run} |")
        print(lines[-1], flush=True)
    summary = (f"{len(errors)} rows: mean |error| {100 * statistics.mean(errors):.1f}%, "
               f"worst {100 * max(errors):.1f}%; the {len(recent)} rows measured on the code of "
               f"2026-12-01 or later (not the {OLDER_CODE} runs): mean "
               f"{100 * statistics.mean(recent):.1f}%, worst {100 * max(recent):.1f}%")
    print(summary)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n\n" + summary + "\n")


if __name__ == "__main__":
    sys.exit(main())
