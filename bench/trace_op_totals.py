#!/usr/bin/env python3
"""Device time per step of each kind of op in an `fsdp train --trace` file, per stream.

    python3 bench/trace_op_totals.py TRACE.json[.gz] [--rank 0] [--top 25]

An op's kind is its label with the module name dropped ("RS layers.3" -> "RS"), so a row sums
that op over every layer. Waits are left out: this is where the device is busy, not where a
stream stalls (`fsdp trace-report` shows stalls).
"""
import argparse
import collections
import gzip
import json
import re


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def kind_of(label):
    # Drop module names: "layers.3", "layers.3[dp]", "root", "head", "tok_embeddings".
    words = [w for w in label.split() if not re.match(r"^(layers\.\d+\S*|root|head)$", w)]
    return " ".join(words) or label


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    d = load(a.trace)
    ranks = d["otherData"]["fsdp"]["ranks"]
    steps = ranks[a.rank]["metrics"]["steps"] if a.rank < len(ranks) else 1
    names = {}
    totals = collections.Counter()
    counts = collections.Counter()
    for e in d["traceEvents"]:
        if e.get("pid") != a.rank:
            continue
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e["args"]["name"]
        if e.get("ph") == "X" and e.get("cat") != "wait" and e.get("tid", 0) != 0:
            key = (e["tid"], kind_of(e["name"]))
            totals[key] += e["dur"]
            counts[key] += 1
    print(f"rank {a.rank}: device ms per step by op kind ({steps:g} steps)")
    print(f"{'stream':<16}{'op':<40}{'ms/step':>9}{'ops/step':>10}")
    per_stream = collections.Counter()
    for (tid, kind), us in totals.items():
        per_stream[tid] += us
    for (tid, kind), us in totals.most_common(a.top):
        print(f"{names.get(tid, tid):<16}{kind:<40}{us / 1e3 / steps:9.3f}{counts[(tid, kind)] / steps:10.1f}")
    for tid, us in sorted(per_stream.items()):
        print(f"{names.get(tid, tid):<16}{'(all ops)':<40}{us / 1e3 / steps:9.3f}")


if __name__ == "__main__":
    main()
