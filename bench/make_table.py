#!/usr/bin/env python3
"""Merge the per-run JSON files of one bench/run_bench.sh run into one JSON list and a markdown table.

    python3 bench/make_table.py RUN_DIR/rows --out RUN_DIR/h200x2.json --md RUN_DIR/h200x2.md

Files in the rows folder (RUN_DIR/rows, written by bench/run_bench.sh):
  NAME.json       a result: ours (`fsdp train --json`, has "step_ms_median") or torch (has "engine")
  NAME.fail.json  run_bench.sh's record of a row that failed, timed out or was skipped; when NAME.json
                  exists too, its numbers are kept and the row's status says what went wrong
  meta.json       the machine (GPU, driver, torch, git revision); only used for the markdown header
Without --out / --md the JSON list / the markdown go to stdout.
"""
import argparse
import glob
import json
import os
import sys

GIB = float(1 << 30)
ENGINE_ORDER = {"torch-local": 0, "torch-fsdp2": 0, "fsdp": 1}


def as_bool(v):
    if v is None:
        return None
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def as_int(v):
    return None if v is None else int(v)


def our_config(j):
    model = j.get("model", "mlp")
    layers = j.get("layers", "")
    t = j.get("tokens_per_rank")
    suffix = "" if as_bool(j.get("optimizer_in_backward", True)) else " oib0"
    if int(j.get("world_size", 0)) == 1:
        return f"{model}{layers} t{t} 1gpu{suffix}"
    return (f"{model}{layers} t{t} reshard{int(as_bool(j.get('reshard_after_forward')))}"
            f" k{j.get('rs_max_input_buffers')} sep{int(as_bool(j.get('separate_rs_group')))}{suffix}")


def row_from_ours(j):
    row = {
        "config": j.get("config") or our_config(j),
        "engine": "fsdp",
        "world_size": as_int(j["world_size"]),
        "tokens_per_rank": as_int(j["tokens_per_rank"]),
        "step_ms": float(j["step_ms_median"]),
        "tflops_per_gpu": float(j["tflops_per_gpu"]),
        "peak_mem_bytes": as_int(j["peak_mem_bytes"]),
    }
    for k in ("exposed_comm_ms", "host_schedule_us_per_unit"):
        if j.get(k) is not None:
            row[k] = float(j[k])
    row["rs_max_input_buffers"] = as_int(j.get("rs_max_input_buffers"))
    row["separate_rs_group"] = as_bool(j.get("separate_rs_group"))
    row["reshard_after_forward"] = as_bool(j.get("reshard_after_forward"))
    row["optimizer_in_backward"] = as_bool(j.get("optimizer_in_backward", False))
    return row


def row_from_torch(j):
    row = {
        "config": j["config"],
        "engine": j["engine"],
        "world_size": as_int(j["world_size"]),
        "tokens_per_rank": as_int(j["tokens_per_rank"]),
        "step_ms": float(j["step_ms"]),
        "tflops_per_gpu": float(j["tflops_per_gpu"]),
        "peak_mem_bytes": as_int(j["peak_mem_bytes"]),
        "rs_max_input_buffers": None,
        "separate_rs_group": None,
        "reshard_after_forward": as_bool(j.get("reshard_after_forward")),
    }
    return row


def row_from_fail(f):
    row = {k: f.get(k) for k in ("config", "engine", "world_size", "tokens_per_rank")}
    row.update(step_ms=None, tflops_per_gpu=None, peak_mem_bytes=None)
    row["world_size"] = as_int(row["world_size"])
    row["tokens_per_rank"] = as_int(row["tokens_per_rank"])
    row["rs_max_input_buffers"] = as_int(f.get("rs_max_input_buffers"))
    row["separate_rs_group"] = as_bool(f.get("separate_rs_group"))
    row["reshard_after_forward"] = as_bool(f.get("reshard_after_forward"))
    return row


def fail_status(f):
    status = f.get("status", "failed")
    if f.get("rc") is not None:
        status += f" (rc={f['rc']})"
    return status


def load(outdir):
    rows, meta, problems = [], {}, []
    results = {}
    fails = {}
    for path in sorted(glob.glob(os.path.join(outdir, "*.json"))):
        base = os.path.basename(path)
        if base == "meta.json":
            try:
                with open(path) as fh:
                    meta = json.load(fh)
            except (OSError, ValueError) as e:
                problems.append(f"{base}: {e}")
            continue
        if base.endswith(".fail.json"):
            stem, target = base[: -len(".fail.json")], fails
        else:
            stem, target = base[: -len(".json")], results
        try:
            with open(path) as fh:
                target[stem] = json.load(fh)
        except (OSError, ValueError) as e:
            problems.append(f"{base}: unreadable ({e})")
            if target is results:
                results[stem] = None
    for stem in sorted(set(results) | set(fails)):
        j, f = results.get(stem), fails.get(stem)
        row = None
        if isinstance(j, dict):
            try:
                if "step_ms_median" in j:
                    row = row_from_ours(j)
                elif "engine" in j:
                    row = row_from_torch(j)
                else:
                    problems.append(f"{stem}.json: neither ours nor torch's summary, ignored")
            except (KeyError, TypeError, ValueError) as e:
                problems.append(f"{stem}.json: missing/bad field {e}")
        if row is not None:
            row["status"] = "ok" if f is None else fail_status(f) + ", result kept"
        elif f is not None:
            row = row_from_fail(f)
            row["status"] = fail_status(f)
        elif j is not None or stem in results:
            row = {"config": stem, "engine": None, "world_size": None, "tokens_per_rank": None,
                   "step_ms": None, "tflops_per_gpu": None, "peak_mem_bytes": None,
                   "rs_max_input_buffers": None, "separate_rs_group": None,
                   "reshard_after_forward": None, "status": "unreadable result"}
        if row is None:
            continue
        row["source"] = stem
        rows.append(row)
    return rows, meta, problems


def match_key(row):
    # Torch has no reduce-scatter knobs, so each of our k/sep variants is compared with the torch run
    # of the same GPU count, tokens per rank and reshard_after_forward. On 1 GPU reshard is moot.
    w = row["world_size"]
    return (w, row["tokens_per_rank"], row["reshard_after_forward"] if w and w > 1 else None)


def add_comparisons(rows):
    torch_rows = {}
    for r in rows:
        if r["engine"] in ("torch-fsdp2", "torch-local") and r["step_ms"]:
            torch_rows.setdefault(match_key(r), r)
    for r in rows:
        if r["engine"] != "fsdp":
            continue
        t = torch_rows.get(match_key(r))
        if t is None or not r["step_ms"]:
            continue
        r["torch_config"] = t["config"]
        r["speedup_vs_torch"] = t["step_ms"] / r["step_ms"]
        if r["peak_mem_bytes"] and t["peak_mem_bytes"]:
            r["peak_mem_vs_torch"] = r["peak_mem_bytes"] / t["peak_mem_bytes"]


def sort_key(r):
    def neg(v):
        return -(v or 0)
    rsf = r.get("reshard_after_forward")
    return (neg(r["tokens_per_rank"]), neg(r["world_size"]), ENGINE_ORDER.get(r["engine"], 2),
            0 if rsf in (None, True) else 1, r.get("rs_max_input_buffers") or 0,
            1 if r.get("separate_rs_group") else 0, r["config"] or "")


def fmt(v, spec, suffix=""):
    return "" if v is None else format(v, spec) + suffix


def flag(v):
    return "" if v is None else str(int(bool(v)))


def markdown(rows, meta, problems, outdir):
    lines = []
    lines.append("# mlp16 benchmark: ours (fsdp) vs PyTorch FSDP2")
    lines.append("")
    info = [f"{k}: {meta[k]}" for k in ("date", "gpu", "ngpus", "driver", "torch", "git_rev") if meta.get(k)]
    if info:
        lines.append("; ".join(str(x) for x in info))
        lines.append("")
    lines.append("Step ms = median over the timed steps. TFLOP/s per GPU = 6 x params x tokens per rank / step. "
                 "Peak = max over ranks of peak allocated device memory. Speed-up = torch step ms / our step ms "
                 "for the torch run with the same GPUs, tokens per rank and reshard_after_forward "
                 "(on 1 GPU: torch-local, plain bf16 without FSDP).")
    lines.append("")
    hdr = ["config", "engine", "GPUs", "tokens/rank", "reshard", "k", "sep", "step ms", "TFLOP/s/GPU",
           "peak GiB", "exposed comm ms", "host µs/unit", "speed-up vs torch", "peak vs torch", "status"]
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|" + "|".join("---" for _ in hdr) + "|")
    for r in rows:
        cells = [
            r["config"] or "", r["engine"] or "", fmt(r["world_size"], "d"), fmt(r["tokens_per_rank"], "d"),
            flag(r["reshard_after_forward"]) if (r["world_size"] or 0) > 1 else "",
            fmt(r["rs_max_input_buffers"], "d"), flag(r["separate_rs_group"]),
            fmt(r["step_ms"], ".2f"), fmt(r["tflops_per_gpu"], ".0f"),
            fmt(None if r["peak_mem_bytes"] is None else r["peak_mem_bytes"] / GIB, ".3f"),
            fmt(r.get("exposed_comm_ms"), ".2f"), fmt(r.get("host_schedule_us_per_unit"), ".1f"),
            fmt(r.get("speedup_vs_torch"), ".2f", "×"), fmt(r.get("peak_mem_vs_torch"), ".2f", "×"),
            r["status"],
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    lines.append("")
    # Best of ours per (GPUs, tokens) against FSDP2's default (reshard_after_forward=True) and its best.
    def best_by(engine, pred=lambda r: True):
        out = {}
        for r in rows:
            if r["engine"] == engine and r["step_ms"] and (r["world_size"] or 0) > 1 and pred(r):
                k = (r["world_size"], r["tokens_per_rank"])
                if k not in out or r["step_ms"] < out[k]["step_ms"]:
                    out[k] = r
        return out
    ours_best = best_by("fsdp")
    torch_default = best_by("torch-fsdp2", lambda r: r["reshard_after_forward"] is not False)
    torch_best = best_by("torch-fsdp2")
    summary = []
    for k in sorted(ours_best, key=lambda k: (-k[1], k[0])):
        b = ours_best[k]
        s = f"- {k[0]} GPUs, {k[1]} tokens/rank: best of ours {b['step_ms']:.2f} ms ({b['config']})"
        for label, t in (("FSDP2 reshard=True", torch_default.get(k)), ("FSDP2's best", torch_best.get(k))):
            if t:
                s += f"; vs {label} {t['step_ms']:.2f} ms ({t['config']}): {t['step_ms'] / b['step_ms']:.2f}×"
        summary.append(s)
    if summary:
        lines.append("Best of ours vs FSDP2:")
        lines.extend(summary)
        lines.append("")
    bad = [r for r in rows if r["status"] != "ok"]
    if bad or problems:
        lines.append("Problems:")
        lines.extend(f"- {r['config']} ({r['engine']}): {r['status']}" for r in bad)
        lines.extend(f"- {p}" for p in problems)
        lines.append("")
    lines.append(f"Source: per-run JSON files in `{outdir}`.")
    return "\n".join(lines) + "\n"


def write(path, text):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outdir", help="directory with the per-run JSON files")
    p.add_argument("--out", help="write the merged JSON list here")
    p.add_argument("--md", help="write the markdown table here")
    a = p.parse_args()
    if not os.path.isdir(a.outdir):
        sys.exit(f"make_table: no such directory: {a.outdir}")
    rows, meta, problems = load(a.outdir)
    add_comparisons(rows)
    rows.sort(key=sort_key)
    for pr in problems:
        print(f"make_table: {pr}", file=sys.stderr)
    js = json.dumps(rows, indent=2) + "\n"
    # The table names its rows' folder relative to itself (a run folder moves with the repository).
    source = os.path.relpath(a.outdir, os.path.dirname(os.path.abspath(a.md))) if a.md else a.outdir
    md = markdown(rows, meta, problems, source)
    if a.out:
        write(a.out, js)
    else:
        sys.stdout.write(js)
    if a.md:
        write(a.md, md)
    elif a.out:
        sys.stdout.write(md)
    else:
        sys.stdout.write("\n" + md)
    if not rows:
        print("make_table: no rows found", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
