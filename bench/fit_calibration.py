#!/usr/bin/env python3
"""Fits a simulation calibration (Note [Calibration file] in src/backend/sim/sim_calibration.h)
from op timings measured on a GPU; never from step times.

    python3 bench/fit_calibration.py --seed SEED.json [inputs...] --out CAL.json [--log FIT.log]

SEED.json is a calibration whose values stand where nothing measured replaces them (host launch
costs, the network, the kernel minimum). The inputs:

  --gemms FILE        GEMMs alone: bench/op_sweep lines ({"op": "gemm", m, n, k, layout, us}),
                      bench/gemm_floor llama lines ({"gemm": "wqkv fwd", tokens, in, out, ms}) or
                      bench/gemm_floor's mlp line ({tokens, dim, layers, gemm_ms_median}).
                      They make gemm.table.
  --attention FILE    bench/op_sweep's attention lines: attention.forward / backward.
  --grouped FILE      bench/op_sweep's grouped GEMMs alone ({"op": "grouped_gemm", groups, m, n,
                      k, layout, us}): gemm.grouped_factor, each layout's grouped time over the
                      time the simulator gives the same groups from this fit's GEMM table.
  --memory FILE       bench/op_sweep's memory-bound kernels alone ({"op": "memory", class,
                      bytes, us}): memory.by_op, the bandwidth of each op class.
  --step MEASURED COSTLOG
                      one real step's device time per op kind (an `fsdp train --trace` file, or
                      bench/trace_op_totals.py's table) beside `fsdp simulate --cost-log` of the
                      same command, simulated with a calibration that has this fit's GEMM table
                      and no in-step factors. Per op kind (the label without module names):
                      the memory-bound op classes' bandwidths (memory.by_op), each GEMM layout's
                      in-step factor (measured / the table's time) and, where no sweep gave them,
                      attention rows.
  --sharing MEASURED GPUS "ARGS"  (with --fsdp BIN)
                      kernel_sharing, memory_kernel_sharing, memory_kernel_yield and
                      memory_kernel_lead (Note [Shared channels]): the setting (fit_sharing's
                      search over SHARING_VALUES) whose
                      simulated in-step op times of these commands (`fsdp simulate --gpus GPUS
                      ARGS --trace`) are nearest the measured ones, op kind by op kind (per
                      command the sum of |simulated - measured| over its measured device time,
                      averaged over the commands).
  --fp8-step TRACE COSTLOG
                      gemm.fp8 in-step: one real tensorwise step's fp8 GEMM kernels (in an `fsdp
                      train --trace` file, the last kernel of each run of one fp8 Linear's
                      kernels is its GEMM, the ones before it its casts) beside `fsdp simulate
                      --fp8 tensorwise --cost-log` of the same command with this fit's
                      calibration: both recipes' ratios scale by the measured GEMMs' time over
                      the simulated ones', so rowwise keeps its measured relation to tensorwise.
  --moe-step TRACE GPUS "ARGS"  (with --fsdp BIN)
                      a traced step of the dropless MoE transformer (`fsdp train --trace` of
                      ARGS on GPUS GPUs) beside its simulation with this fit's calibration:
                      gemm.grouped_factor by layout from the grouped expert GEMMs' in-step times,
                      and host.moe_route_us and host.moe_route_backward_us from the compute
                      stream's idle time where the host routes (bench/sim_moe_step.py).
  --collectives FILE  bench/collective_sweep lines: links.nvlink's base, per-step latency and
                      bus bandwidth by size.
  --collectives-trace TRACE COSTLOG
                      the same from a multi-GPU `fsdp train --trace` (the fastest of each
                      collective kind, its bytes from the cost log), where no sweep ran.
"""
import argparse
import collections
import json
import math
import re
import os
import statistics
import sys
import tempfile

from sim_moe_step import fit_moe_step, simulated_trace
from trace_op_totals import kind_of, load as load_json  # module names dropped, gzip or not

MEMORY_BOUND_MIN_BYTES = 1 << 20  # per op: below, the kernel minimum dominates
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all")


def shown(path):
    """A path as the calibration records it: relative inside the repository, else its name."""
    rel = os.path.relpath(os.path.abspath(path))
    return os.path.basename(path) if rel.startswith("..") else rel


def json_lines(path):
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def measured_ops(path, rank=None):
    """{kind: (us per step, ops per step, [stream names])} from a trace (of `rank`, or of its
    first rank) or an ops table."""
    per = {}
    if path.endswith(".txt"):
        with open(path) as f:
            for line in f:
                if len(line) < 60 or line.startswith(("rank", "stream")) or "(all ops)" in line:
                    continue
                stream, kind = line[:16].strip(), line[16:56].strip()
                ms, ops = (float(v) for v in line[56:].split())
                us, n, streams = per.get(kind, (0.0, 0.0, []))
                per[kind] = (us + ms * 1e3, n + ops, streams + [stream])
        return per
    d = load_json(path)
    ranks = d["otherData"]["fsdp"]["ranks"]
    entry = next((r for r in ranks if rank is None or r["rank"] == rank), ranks[0])
    rank = entry["rank"]
    steps = entry["metrics"]["steps"] or 1
    names, totals = {}, collections.defaultdict(lambda: [0.0, 0, set()])
    for e in d["traceEvents"]:
        if e.get("pid") == rank and e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e["args"]["name"]
    for e in d["traceEvents"]:
        if e.get("pid") == rank and e.get("ph") == "X" and e.get("cat") != "wait" and e.get("tid", 0):
            t = totals[kind_of(e["name"])]
            t[0] += e["dur"]
            t[1] += 1
            t[2].add(e["tid"])
    return {k: (v[0] / steps, v[1] / steps, [names.get(t, str(t)) for t in v[2]])
            for k, v in totals.items()}


def cost_log(path):
    """{kind: {op class: [ops, bytes, flops, us] per step}}."""
    per = collections.defaultdict(lambda: collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0]))
    for row in json_lines(path):
        e = per[kind_of(row["label"])][row["op"]]
        steps = row.get("steps", 1) or 1
        for i, key in enumerate(("ops", "bytes", "flops", "us")):
            e[i] += row[key] / steps
    return per


def fp8_gemm_us_per_step(trace_path):
    """A traced tensorwise step's fp8 GEMM kernel time per step: each fp8 Linear runs its casts
    and then its GEMM as kernels of one label, so the last kernel of each run of one label on
    one stream is the GEMM."""
    d = load_json(trace_path)
    entry = d["otherData"]["fsdp"]["ranks"][0]
    kernels = sorted((e for e in d["traceEvents"] if e.get("ph") == "X" and e.get("pid") == entry["rank"]
                      and e.get("cat") == "kernel"), key=lambda e: (e["tid"], e["ts"]))
    total = 0.0
    for i, e in enumerate(kernels):
        last = i + 1 == len(kernels) or (kernels[i + 1]["name"], kernels[i + 1]["tid"]) != (e["name"], e["tid"])
        if last and "fp8 gemm" in e["name"]:
            total += e["dur"]
    return total / (entry["metrics"]["steps"] or 1)


def gemm_rows(path):
    rows = []
    for r in json_lines(path):
        if r.get("op") == "gemm":
            rows.append((r.get("dtype", "bf16"), r["m"], r["n"], r["k"], r["layout"], r["us"]))
        elif "gemm" in r and "in" in r and "out" in r and "ms" in r:
            t, i, o, us = r["tokens"], r["in"], r["out"], r["ms"] * 1e3
            what = r["gemm"].split()[-1]
            shape = {"fwd": (t, o, i, "nt"), "dX": (t, i, o, "nn"), "dW": (o, i, t, "tn")}.get(what)
            if shape:
                rows.append(("bf16",) + shape + (us,))
        elif "gemm_ms_median" in r:  # mlp: 3L - 1 GEMMs of one square shape, forward, dW, dX
            t, dim, layers = r["tokens"], r["dim"], r["layers"]
            us = r["gemm_ms_median"] * 1e3 / (3 * layers - 1)
            rows += [("bf16", t, dim, dim, "nt", us), ("bf16", dim, dim, t, "tn", us),
                     ("bf16", t, dim, dim, "nn", us)]
    return rows


def gemm_us(cal, m, n, k, layout):
    """The simulator's time of one bf16 GEMM (gemm_us in src/backend/sim/sim_calibration.cpp)."""
    gap = lambda a, b: abs(math.log(a) - math.log(b))
    near = []
    for r in cal["gemm"].get("table", []):
        if r["dtype"] != "bf16":
            continue
        d = gap(m, r["m"]) + gap(n, r["n"]) + gap(k, r["k"]) + (0 if r["layout"] == layout else 0.05)
        e = 2.0 * r["m"] * r["n"] * r["k"] / r["us"]
        if d < 1e-9:
            near = [(0, e)]
            break
        near.append((d, e))
    flops = 2.0 * m * n * k
    if not near:
        eff = cal["gemm"]["default_tflops"].get("bf16", 100) * 1e6
    elif near[0][0] == 0:
        eff = near[0][1]
    else:
        near = sorted(near)[:4]
        eff = sum(e / d ** 2 for d, e in near) / sum(1 / d ** 2 for d, _ in near)
    us = max(flops / eff, (m * k + k * n + m * n) * 2 / (cal["memory"]["gbps"] * 1e3))
    return max(cal["kernel_min_us"], us) * cal["gemm"].get("in_step_factor", {}).get(layout, 1.0)


# The sharing factors (Note [Shared channels]) and the values each may take; None: the
# memory sharing's own (a yield or a lead no different from the plain split).
SHARING_VALUES = {
    "kernel_sharing": (0.0, 0.25, 0.5, 0.75, 1.0),
    "memory_kernel_sharing": (0.5, 1.0, 1.5, 2.0, 3.0, 4.0),
    "memory_kernel_yield": (None, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0),
    "memory_kernel_lead": (None, 0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0),
}


def fit_sharing(a, cal, sources, log):
    """The sharing factors whose simulated in-step op times of the --sharing commands are
    nearest the measured ones (per command the sum of |simulated - measured| over its measured
    device time, averaged over the commands): kernel_sharing and memory_kernel_sharing over
    their whole grid with no yield or lead, then each factor in turn over its values, the others
    held, until none moves (coordinate descent; each setting is simulated once)."""
    measured = [(measured_ops(m), gpus, args) for m, gpus, args in a.sharing]
    errors = {}

    def apply(setting):  # a factor of None is left out of the calibration
        for key, value in zip(SHARING_VALUES, setting):
            cal.pop(key, None)
            if value is not None:
                cal[key] = value

    with tempfile.TemporaryDirectory() as tmp:
        def error(setting):
            if setting in errors:
                return errors[setting]
            apply(setting)
            per_trace = []
            for ops, gpus, args in measured:
                sim = measured_ops(simulated_trace(a.fsdp, cal, gpus, args, tmp, "t"))
                err = total = 0.0
                for kind, (us, _, _) in ops.items():
                    # Kernels only: a collective's span is its link's, not the device's.
                    if kind in sim and kind not in ("AG", "RS") and "all-" not in kind:
                        err += abs(sim[kind][0] - us)
                        total += us
                if total:
                    per_trace.append(err / total)
            # Each traced step counts alike, so a short step's ops weigh as much as a long one's.
            errors[setting] = statistics.mean(per_trace) if per_trace else 0
            log(", ".join(f"{k} {v}" for k, v in zip(SHARING_VALUES, setting) if v is not None) +
                f": in-step op times off by {100 * errors[setting]:.1f}% of the measured")
            return errors[setting]

        best = min(((s, m, None, None) for s in SHARING_VALUES["kernel_sharing"]
                    for m in SHARING_VALUES["memory_kernel_sharing"]), key=error)
        moved = True
        while moved:
            moved = False
            for i, values in enumerate(SHARING_VALUES.values()):
                candidate = min((best[:i] + (v,) + best[i + 1:] for v in values), key=error)
                if error(candidate) < error(best):
                    best, moved = candidate, True
    apply(best)
    log(", ".join(f"{k} = {v}" for k, v in zip(SHARING_VALUES, best) if v is not None) +
        f" (in-step op times off by {100 * errors[best]:.1f}%)")
    sources.append(", ".join(SHARING_VALUES) + ": the in-step op times of " +
                   ", ".join(shown(m) for m, _, _ in a.sharing))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", required=True)
    ap.add_argument("--gemms", action="append", default=[])
    ap.add_argument("--attention", action="append", default=[])
    ap.add_argument("--memory", action="append", default=[])
    ap.add_argument("--grouped", action="append", default=[])
    ap.add_argument("--step", nargs=2, action="append", default=[], metavar=("MEASURED", "COSTLOG"))
    ap.add_argument("--fp8-step", nargs=2, action="append", default=[], metavar=("TRACE", "COSTLOG"))
    ap.add_argument("--collectives", action="append", default=[])
    ap.add_argument("--collectives-trace", nargs=2, action="append", default=[],
                    metavar=("TRACE", "COSTLOG"))
    ap.add_argument("--step-bandwidths", action="store_true",
                    help="also fit memory-bound bandwidths and GEMM in-step factors from the --step "
                         "pairs (for a calibration with kernel_sharing 0: in-step times already "
                         "hold what the kernels beside them cost)")
    ap.add_argument("--sharing", nargs=3, action="append", default=[],
                    metavar=("MEASURED", "GPUS", "ARGS"))
    ap.add_argument("--moe-step", nargs=3, action="append", default=[],
                    metavar=("TRACE", "GPUS", "ARGS"))
    ap.add_argument("--fsdp", default="build/fsdp")
    ap.add_argument("--device")
    ap.add_argument("--out", required=True)
    ap.add_argument("--log")
    a = ap.parse_args()
    log_lines = []

    def log(*parts):
        log_lines.append(" ".join(str(p) for p in parts))

    cal = load_json(a.seed)
    if a.device:
        cal["device"] = a.device
    sources = list(cal.get("sources", []))

    # ---- GEMMs alone: the table, one row per shape (the median of repeats)
    if a.gemms:
        by_shape = collections.defaultdict(list)
        for path in a.gemms:
            for dtype, m, n, k, layout, us in gemm_rows(path):
                by_shape[(dtype, m, n, k, layout)].append(us)
            sources.append(f"gemm timings: {shown(path)}")
        table = []
        for (dtype, m, n, k, layout), us in sorted(by_shape.items()):
            table.append({"dtype": dtype, "m": m, "n": n, "k": k, "layout": layout,
                          "us": round(statistics.median(us), 3)})
            log(f"gemm {dtype} {m}x{n}x{k} {layout}: {statistics.median(us):.1f} us "
                f"({2 * m * n * k / statistics.median(us) / 1e6:.0f} TFLOP/s, {len(us)} samples)")
        cal["gemm"]["table"] = table

    # ---- grouped GEMMs alone, against the same groups from the table
    grouped = collections.defaultdict(list)
    for path in a.grouped:
        for r in json_lines(path):
            if r.get("op") == "grouped_gemm" and r.get("dtype", "bf16") == "bf16":
                kmin = cal["kernel_min_us"]
                one = gemm_us(cal, r["m"], r["n"], r["k"], r["layout"]) - kmin
                if one > 0:
                    grouped[r["layout"]].append((r["us"] - kmin) / (r["groups"] * one))
        sources.append(f"grouped GEMM timings: {shown(path)}")
    if grouped:
        factors = cal["gemm"].setdefault("grouped_factor", {})
        for layout, v in sorted(grouped.items()):
            factors[layout] = round(statistics.median(v), 4)
            log(f"gemm.grouped_factor.{layout} = {factors[layout]} (median of {len(v)} shapes)")

    # ---- attention alone
    attention = {"forward": [], "backward": []}
    for path in a.attention:
        for r in json_lines(path):
            if r.get("op") in ("attention_forward", "attention_backward"):
                attention["backward" if r["op"].endswith("backward") else "forward"].append(
                    {k: r[k] for k in ("batch", "seq", "heads", "kv_heads", "head_dim", "us")})
        sources.append(f"attention timings: {shown(path)}")

    # ---- memory-bound kernels alone
    alone = collections.defaultdict(list)
    for path in a.memory:
        for r in json_lines(path):
            if r.get("op") == "memory" and r["us"] > 0:
                alone[r["class"]].append(r["bytes"] / r["us"] / 1e3)
        sources.append(f"memory-bound kernels alone: {shown(path)}")
    if alone:
        cal["memory"].setdefault("by_op", {})
        for op, gbps in sorted(alone.items()):
            cal["memory"]["by_op"][op] = round(statistics.median(gbps), 1)
            log(f"memory.by_op.{op} = {cal['memory']['by_op'][op]} GB/s (alone)")

    # ---- one real step against its simulation, op kind by op kind
    bandwidth = collections.defaultdict(lambda: [0.0, 0.0])  # class -> [bytes, us]
    gemm_fit = collections.defaultdict(lambda: [0.0, 0.0])   # layout -> [measured, table us]
    traced_attention = {"forward": [], "backward": []}
    for measured_path, costs_path in a.step:
        measured, sim = measured_ops(measured_path), cost_log(costs_path)
        sources.append(f"op timings of a real step: {shown(measured_path)} (simulated: {shown(costs_path)})")
        for kind, (us, ops, streams) in sorted(measured.items()):
            classes = sim.get(kind)
            if not classes or us <= 0:
                log(f"step {measured_path}: '{kind}' ({us / 1e3:.3f} ms) has no simulated op; left out")
                continue
            names = list(classes)
            if not a.step_bandwidths and not (len(names) == 1 and names[0].startswith("attention_")):
                continue
            if all(n.startswith("gemm_") for n in names) and len(names) == 1:
                layout = names[0][5:]
                gemm_fit[layout][0] += us
                gemm_fit[layout][1] += classes[names[0]][3]
                log(f"step: '{kind}' gemm {layout}: measured {us / 1e3:.3f} ms, table "
                    f"{classes[names[0]][3] / 1e3:.3f} ms")
            elif len(names) == 1 and names[0].startswith("attention_") and not attention[
                    "backward" if "backward" in names[0] else "forward"]:
                m = re.match(r"attention_(forward|backward) b(\d+) s(\d+) h(\d+) kv(\d+) d(\d+)", names[0])
                n_ops = classes[names[0]][0]
                if m and n_ops > 0:
                    row = dict(zip(("batch", "seq", "heads", "kv_heads", "head_dim"),
                                   (int(g) for g in m.groups()[1:])))
                    row["us"] = round(us / n_ops, 3)
                    traced_attention[m.group(1)].append(row)
                    log(f"step: '{kind}' {names[0]}: {row['us']} us per call")
            elif len(names) == 1 and names[0] not in COLLECTIVES and not names[0].startswith("gemm"):
                n_ops, nbytes = classes[names[0]][0], classes[names[0]][1]
                if n_ops > 0 and nbytes / n_ops >= MEMORY_BOUND_MIN_BYTES:
                    bandwidth[names[0]][0] += nbytes
                    bandwidth[names[0]][1] += us
                    log(f"step: '{kind}' {names[0]}: {nbytes / n_ops / 2**20:.1f} MiB a call, "
                        f"{nbytes / us / 1e3:.0f} GB/s")
            else:
                log(f"step: '{kind}' mixes {', '.join(sorted(names))}; left out")
    by_op = dict(cal["memory"].get("by_op", {}))
    for op, (nbytes, us) in sorted(bandwidth.items()):
        by_op[op] = round(nbytes / us / 1e3, 1)
        log(f"memory.by_op.{op} = {by_op[op]} GB/s")
    cal["memory"]["by_op"] = by_op
    factors = dict(cal["gemm"].get("in_step_factor", {}))
    for layout, (measured, table) in sorted(gemm_fit.items()):
        if table > 0:
            factors[layout] = round(measured / table, 4)
            log(f"gemm.in_step_factor.{layout} = {factors[layout]}")
    cal["gemm"]["in_step_factor"] = factors
    shape = lambda r: tuple(r[k] for k in ("batch", "seq", "heads", "kv_heads", "head_dim"))
    for direction in ("forward", "backward"):
        # Timed alone (this fit's --attention, else the seed's) wins over the same shape traced.
        rows = attention[direction] or list(cal["attention"].get(direction, []))
        have = {shape(r) for r in rows}
        rows += [r for r in traced_attention[direction] if shape(r) not in have]
        if rows:
            cal["attention"][direction] = rows

    # ---- collectives: base + steps x latency + traffic / busbw
    samples = []  # (op, ranks, bytes, us)
    for path in a.collectives:
        samples += [(r["op"], r["ranks"], r["bytes"], r["us"]) for r in json_lines(path) if r.get("op") in COLLECTIVES]
        sources.append(f"collective timings: {shown(path)}")
    for trace_path, costs_path in a.collectives_trace:
        d, sim = load_json(trace_path), cost_log(costs_path)
        ranks = len(d["otherData"]["fsdp"]["ranks"])
        fastest = {}
        for e in d["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "collective":
                k = kind_of(e["name"])
                fastest[k] = min(fastest.get(k, 1e300), e["dur"])
        for k, us in fastest.items():
            for op, (n, nbytes, _, _) in sim.get(k, {}).items():
                if op in COLLECTIVES and n > 0:
                    samples.append((op, ranks, nbytes / n, us))
        sources.append(f"collective timings of a real step (the fastest of each kind): {shown(trace_path)}")
    if samples:
        link = cal["links"]["nvlink"]
        steps = lambda op, p: (2 if op == "all_reduce" else 1) * (p - 1)
        small = [s for s in samples if s[2] <= 64]
        if small:
            op, p, _, us = min(small, key=lambda s: s[3])
            link["base_us"] = round(max(0.0, us - steps(op, p) * link["latency_us"]), 2)
            log(f"links.nvlink.base_us = {link['base_us']} (a {op} of <= 64 bytes on {p} GPUs: {us:.1f} us)")
        curve = collections.defaultdict(list)
        for op, p, nbytes, us in samples:
            if nbytes < (1 << 20):
                continue
            traffic = nbytes * (2 if op == "all_reduce" else 1) * (p - 1) / p
            t = us - link["base_us"] - steps(op, p) * link["latency_us"]
            if t > 0:
                curve[2 ** round(math.log2(nbytes))].append(traffic / t / 1e3)
        if curve:
            link["busbw_gbps"] = [[b, round(statistics.median(v), 1)] for b, v in sorted(curve.items())]
            log(f"links.nvlink.busbw_gbps = {link['busbw_gbps']}")

    if a.sharing:
        fit_sharing(a, cal, sources, log)

    # ---- the MoE step: grouped GEMMs in-step and the host's routing (after the sharing fit,
    # whose kernel_sharing decides how the simulated GEMMs' times line up with the traced ones)
    for trace, gpus, args in a.moe_step:
        fit_moe_step(a.fsdp, cal, trace, gpus, args, log)
        sources.append("gemm.grouped_factor, host.moe_route_us and host.moe_route_backward_us: "
                       f"the traced MoE step {shown(trace)} beside its simulation")

    # ---- gemm.fp8 from a traced tensorwise step's GEMM kernels
    measured = simulated = 0.0
    for trace_path, costs_path in a.fp8_step:
        measured += fp8_gemm_us_per_step(trace_path)
        simulated += sum(v[3] for ops in cost_log(costs_path).values()
                         for op, v in ops.items() if op.startswith("fp8_gemm"))
        sources.append(f"gemm.fp8: the fp8 GEMM kernels of {shown(trace_path)} in-step")
    if simulated > 0:
        fp8 = cal["gemm"]["fp8"]
        scale = measured / simulated
        for recipe in ("tensorwise", "rowwise"):
            before = fp8[recipe]
            fp8[recipe] = round(before * scale, 4)
            log(f"gemm.fp8.{recipe} = {fp8[recipe]} (was {before}: the traced fp8 GEMMs took "
                f"{measured / 1e3:.2f} ms a step against {simulated / 1e3:.2f} simulated, x{scale:.4f})")

    cal["sources"] = sources
    with open(a.out, "w") as f:
        json.dump(cal, f, indent=1)
        f.write("\n")
    if a.log:
        with open(a.log, "w") as f:
            f.write("\n".join(log_lines) + "\n")
    else:
        print("\n".join(log_lines))


if __name__ == "__main__":
    sys.exit(main())
