#!/usr/bin/env python3
"""How far each run's validation losses are from a baseline's, at the same steps.

    bench/val_loss_gaps.py DIR BASE OTHER [OTHER ...]

Reads DIR/NAME.json (`fsdp train --json`, with "val_losses" as [{"step": N, "loss": L}, ...])
for each name, and prints per run its median step time, its last validation loss, and its
worst relative gap to BASE's validation loss over the steps both evaluated. Standard library
only, so it runs on the GPU machine.
"""
import json
import sys


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    folder, names = argv[0], argv[1:]
    runs = {}
    for n in names:
        with open(f"{folder}/{n}.json") as f:
            runs[n] = json.load(f)
    base = {v["step"]: v["loss"] for v in runs[names[0]]["val_losses"]}
    for n, j in runs.items():
        gaps = [abs(v["loss"] - base[v["step"]]) / base[v["step"]] for v in j["val_losses"]
                if v["step"] in base]
        worst = max(gaps, default=float("nan"))
        last = j["val_losses"][-1]["loss"] if j["val_losses"] else float("nan")
        print(f"{n}: step_ms_median {j['step_ms_median']:.2f} final val {last:.4f} "
              f"worst val rel diff vs {names[0]} {worst:.4%} over {len(j['val_losses'])} "
              f"evaluations peak {j.get('peak_mem_bytes')}")


if __name__ == "__main__":
    main(sys.argv[1:])
