#!/usr/bin/env python3
"""Eager against --cuda-graph rows (bench/run_cuda_graph_bench.sh OUTDIR) as one JSON and a table.

usage: bench/cuda_graph_table.py OUTDIR RUN_DIR/cuda_graph_h200x1 [DEVICE] [RESULTS_BASE]
Writes PREFIX.json and PREFIX.md. Every row keeps the exact command that made it. With
RESULTS_BASE (e.g. RUN_DIR/h200x1), the rows also replace that file's "cuda-graph" rows
and its table section.
"""
import json
import pathlib
import sys


def floor_of(outdir, tokens):
    log = outdir / f"floor_mlp16_t{tokens}.log"
    if not log.exists():
        return None
    for line in reversed(log.read_text().splitlines()):
        if line.startswith("{") and "step_floor_ms" in line:
            row = json.loads(line)
            row["command"] = (outdir / f"floor_mlp16_t{tokens}.cmd").read_text().strip()
            return row
    return None


def main():
    outdir, prefix = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    device = sys.argv[3] if len(sys.argv) > 3 else "1x NVIDIA H200"
    rows = []
    for summary in sorted(outdir.glob("*.json")):
        name = summary.stem
        s = json.loads(summary.read_text())
        rows.append({
            "name": name,
            "command": (outdir / f"{name}.cmd").read_text().strip(),
            "world_size": s["world_size"],
            "model": s["model"],
            "tokens_per_rank": s["tokens_per_rank"],
            "cuda_graph": s["cuda_graph"],
            "step_ms_median": s["step_ms_median"],
            "tokens_per_s": s["tokens_per_s"],
            "mfu": s.get("mfu"),
            "host_us_per_step": s["host_us_per_step"],
            "streams_used": s["streams_used"],
            "graph_streams": s["graph_streams"],
            "peak_mem_bytes": s["peak_mem_bytes"],
            "backend_peak_bytes": s["backend_peak_bytes"],
            "backend_reserved_peak_bytes": s.get("backend_reserved_peak_bytes"),
            "loss_first": s["loss_first"],
            "loss_last": s["loss_last"],
            "losses": s["losses"],
        })
    floors = {t: floor_of(outdir, t) for t in (2048, 8192)}
    doc = {"device": device, "world_size": 1, "rows": rows,
           "mlp16_step_floor": {str(t): f for t, f in floors.items() if f}}
    prefix.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [f"# Eager vs --cuda-graph, {device}, world_size 1", "",
             "| row | step ms | host us/step | % of step | streams | backend peak GiB | reserved GiB | loss last |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = 100.0 * r["host_us_per_step"] / 1000.0 / r["step_ms_median"] if r["step_ms_median"] else 0
        streams = r["streams_used"] if r["streams_used"] is not None else "-"
        reserved = r["backend_reserved_peak_bytes"]
        reserved = f"{reserved / 2**30:.2f}" if reserved else "-"
        lines.append(f"| {r['name']} | {r['step_ms_median']:.2f} | {r['host_us_per_step']:.0f} | "
                     f"{share:.1f} | {streams} | {r['backend_peak_bytes'] / 2**30:.2f} | "
                     f"{reserved} | {r['loss_last']:.6g} |")
    lines.append("")
    for t, f in floors.items():
        if f:
            lines.append(f"mlp16 step floor at {t} tokens: {f['step_floor_ms']:.3f} ms "
                         f"(GEMMs {f['gemm_ms']:.3f} ms + AdamW {f['optimizer_bytes'] / 1e9:.2f} GB "
                         f"at {f['copy_gbps']:.0f} GB/s = {f['optimizer_ms']:.3f} ms): `{f['command']}`")
    lines.append("")
    lines.append("Commands: each row's `command` in the JSON file.")
    prefix.with_suffix(".md").write_text("\n".join(lines) + "\n")
    if len(sys.argv) > 4:
        merge(rows, lines, pathlib.Path(sys.argv[4]))


def merge(rows, lines, base):
    """Replaces BASE.json's "cuda-graph" rows and BASE.md's section with these."""
    path, md = base.with_suffix(".json"), base.with_suffix(".md")
    old = json.loads(path.read_text()) if path.exists() else []
    kept = [r for r in old if r.get("config") != "cuda-graph"]
    path.write_text(json.dumps(kept + [dict(r, config="cuda-graph") for r in rows], indent=2) + "\n")
    text = md.read_text() if md.exists() else ""
    begin, end = "<!-- cuda-graph rows: bench/cuda_graph_table.py -->", "<!-- end cuda-graph rows -->"
    section = begin + "\n" + "\n".join(lines).rstrip() + "\n" + end + "\n"
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end) + 1:]
    else:
        text = text.rstrip() + "\n\n" + section
    md.write_text(text)


if __name__ == "__main__":
    main()
