#!/usr/bin/env python3
"""Each track's busy time per step in an `fsdp train --trace` file, and how much of it ran
while the compute stream was busy (the overlap that hides it).

    python3 bench/trace_tracks.py TRACE.json[.gz] SUMMARY.json [--pid 0]

SUMMARY.json is the same run's `--json`: its losses and warmup give the number of traced
steps. Waits are left out: a track is busy when it runs work, not when it waits on an event.
"""
import argparse

from trace_op_totals import load  # a trace or summary, gzipped or not


def merged(spans):
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def busy(spans):
    return sum(b - a for a, b in spans)


def overlap(u, v):  # both merged and sorted
    i = j = 0
    total = 0.0
    while i < len(u) and j < len(v):
        total += max(0.0, min(u[i][1], v[j][1]) - max(u[i][0], v[j][0]))
        if u[i][1] < v[j][1]:
            i += 1
        else:
            j += 1
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("summary")
    ap.add_argument("--pid", type=int, default=0, help="the rank's process id in the trace")
    a = ap.parse_args()
    trace, summary = load(a.trace), load(a.summary)
    names, spans = {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") == a.pid:
            names[e["tid"]] = e["args"]["name"]
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("pid") == a.pid and e.get("cat") != "wait":
            track = names.get(e["tid"], str(e["tid"]))
            spans.setdefault(track, []).append((e["ts"], e["ts"] + e["dur"]))
    steps = max(1, len(summary.get("losses", [])) - summary.get("warmup", 2))
    compute = merged(spans.get("compute", []))
    print(f"step_ms_median {summary.get('step_ms_median')}  mfu {summary.get('mfu')}  traced steps {steps}")
    for track in sorted(spans):
        m = merged(spans[track])
        print(f"{track:>16}: busy {busy(m) / 1e3 / steps:9.1f} ms/step, "
              f"beside compute {overlap(m, compute) / 1e3 / steps:9.1f} ms/step")


if __name__ == "__main__":
    main()
