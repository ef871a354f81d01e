"""What bench/fit_calibration.py's --moe-step fits from a traced step of the dropless MoE
transformer beside the simulation of the same command (never from a step time):

  - gemm.grouped_factor by layout, from the in-step times of the grouped expert GEMMs: each
    layout's traced time over the time the simulator gives the same groups one by one from the
    GEMM table (timed alone, cuBLAS's grouped GEMM is 1.7-1.8x the same GEMMs one by one; in the
    step the weight-gradient ones run far faster than alone, the forward ones a little slower);
  - host.moe_route_us and host.moe_route_backward_us (Note [Simulated host routing] in
    src/backend/sim/sim_device.cpp), from the compute stream's idle time where the host routes:
    the traced idle less what the simulation already has there (its launch costs).

Which traced call is which is the simulator's to say, not this file's: the command is simulated
twice, once with every grouped factor 1 and no routing cost (A), once with a factor per layout of
2, 3, 4 and 5 and the routing costs PROBE_ROUTE_US (B). A call whose time, less the kernel
minimum, is k times A's in B is a grouped GEMM of the k-th layout; a stretch between two kernels
of a stream (copies only between them) whose idle time grew by a probe's cost in B is that
routing's wait. Calls and stretches pair up by stream, label and place among the label's calls
in a step (both traces run the same code, so a step holds the same calls in the same order).
"""
import collections
import copy
import json
import os
import shlex
import subprocess
import tempfile

from trace_op_totals import load as load_json

LAYOUTS = ("nn", "nt", "tn", "tt")
PROBE_FACTOR = {"nn": 2.0, "nt": 3.0, "tn": 4.0, "tt": 5.0}
PROBE_ROUTE_US = {"moe_route_us": 1000.0, "moe_route_backward_us": 2000.0}


def step_calls(path):
    """A trace's calls and idle stretches, each averaged over its steps:
    ({(stream, label, j): us}, {(stream, label, j): idle us before that kernel}), j the call's
    place among its label's calls in a step."""
    d = load_json(path)
    entry = d["otherData"]["fsdp"]["ranks"][0]
    steps = int(entry["metrics"]["steps"] or 1)
    names, by_stream = {}, collections.defaultdict(list)
    for e in d["traceEvents"]:
        if e.get("pid") != entry["rank"]:
            continue
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e["args"]["name"]
        elif e.get("ph") == "X" and e.get("tid", 0) and e.get("cat") != "wait":
            by_stream[e["tid"]].append(e)
    calls, idle = collections.defaultdict(float), collections.defaultdict(float)
    for tid, events in by_stream.items():
        events.sort(key=lambda e: e["ts"])
        per_step = collections.Counter(e["name"] for e in events)
        seen = collections.Counter()
        last_end, copies = None, []
        for e in events:
            n, i = per_step[e["name"]], seen[e["name"]]
            seen[e["name"]] += 1
            key = (names.get(tid, str(tid)), e["name"], i % (n // steps)) if n % steps == 0 else None
            if e["cat"] == "copy":  # the rest (kernels, the optimizer, collectives) keep it busy
                copies.append(e)
                continue
            if key:
                calls[key] += e["dur"] / steps
                if copies and last_end is not None:  # the host's stretch: copies only
                    idle[key] += (e["ts"] - last_end - sum(c["dur"] for c in copies)) / steps
            last_end, copies = e["ts"] + e["dur"], []
    return calls, idle


def simulated_trace(fsdp, cal, gpus, args, tmp, name):
    """The trace of `fsdp simulate` of `args` on `gpus` GPUs with calibration `cal` (a dict),
    written under `tmp` as NAME.trace.json; its path."""
    path, trace = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".trace.json")
    with open(path, "w") as f:
        json.dump(cal, f)
    subprocess.run([fsdp, "simulate", "--gpus", gpus, "--calibration", path, "--trace", trace]
                   + shlex.split(args), check=True, stdout=subprocess.DEVNULL)
    return trace


def fit_moe_step(fsdp, cal, trace, gpus, args, log):
    """Sets cal's grouped factors and routing costs from `trace` (a traced `fsdp train` step of
    `args` on `gpus` GPUs); the log says what each value came from."""
    measured, measured_idle = step_calls(trace)
    kmin = cal["kernel_min_us"]
    a, b = copy.deepcopy(cal), copy.deepcopy(cal)
    a["gemm"]["grouped_factor"] = {layout: 1.0 for layout in LAYOUTS}
    b["gemm"]["grouped_factor"] = dict(PROBE_FACTOR)
    for key, probe in PROBE_ROUTE_US.items():
        a["host"][key], b["host"][key] = 0.0, probe
    with tempfile.TemporaryDirectory() as tmp:
        a_calls, a_idle = step_calls(simulated_trace(fsdp, a, gpus, args, tmp, "a"))
        b_calls, b_idle = step_calls(simulated_trace(fsdp, b, gpus, args, tmp, "b"))

    before = dict(cal["gemm"].get("grouped_factor", {}))
    sums = collections.defaultdict(lambda: [0.0, 0.0, 0])  # layout -> [traced, table, calls]
    for key, us in a_calls.items():
        if key not in measured or key not in b_calls or us <= kmin:
            continue
        ratio = (b_calls[key] - kmin) / (us - kmin)
        layout = next((l for l, f in PROBE_FACTOR.items() if abs(ratio - f) < 0.25), None)
        if layout:
            s = sums[layout]
            s[0] += measured[key] - kmin
            s[1] += us - kmin
            s[2] += 1
    factors = cal["gemm"].setdefault("grouped_factor", {})
    for layout, (traced, table, n) in sorted(sums.items()):
        factors[layout] = round(traced / table, 4)
        was = before.get(layout, 1.0)
        log(f"gemm.grouped_factor.{layout} = {factors[layout]} (was {was}, alone): {n} grouped "
            f"GEMMs a step took {(traced + n * kmin) / 1e3:.3f} ms in-step, "
            f"{(table * was + n * kmin) / 1e3:.3f} ms at the factor timed alone")

    for key, probe in PROBE_ROUTE_US.items():
        waits = [k for k, us in a_idle.items()
                 if k in measured_idle and abs(b_idle.get(k, 0) - us - probe) < 0.1 * probe]
        if not waits:
            log(f"host.{key}: no routing wait in the simulation of {trace}; left as it was")
            continue
        traced = sum(measured_idle[k] for k in waits) / len(waits)
        simulated = sum(a_idle[k] for k in waits) / len(waits)
        cal["host"][key] = round(max(0.0, traced - simulated), 1)
        log(f"host.{key} = {cal['host'][key]} us: {len(waits)} routing waits a step, the compute "
            f"stream idle {traced:.1f} us each traced, {simulated:.1f} us simulated without it")
