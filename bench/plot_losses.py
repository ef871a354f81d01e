#!/usr/bin/env python3
"""Loss curves as one SVG, and how far apart they are.

    bench/plot_losses.py --out curves.svg --title T LABEL=FILE.json [LABEL=FILE.json ...]
        [--val LABEL=FILE.json] [--compare A,B --tolerance 1e-4]

Each FILE.json holds "losses" (one per step, from `fsdp train --json` or bench/torch_llama.py)
and, optionally, "val_losses" as [{"step": N, "loss": L}, ...] (the loss after step N); --val
draws those as points. With
--compare A,B the maximum relative difference between curves A and B is printed, and the exit
status is 1 when it exceeds --tolerance. Standard library only, so it runs anywhere.
"""
import argparse
import json
import math
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def load(spec):
    label, _, path = spec.partition("=")
    if not path:
        sys.exit(f"plot_losses: expected LABEL=FILE, got '{spec}'")
    with open(path) as f:
        return label, json.load(f)


def max_relative_difference(a, b):
    n = min(len(a), len(b))
    if n == 0 or len(a) != len(b):
        return math.inf
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a[:n], b[:n]))


def nice_ticks(lo, hi, count=5):
    span = hi - lo or 1.0
    step = 10 ** math.floor(math.log10(span / count))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= count:
            step *= m
            break
    first = math.ceil(lo / step) * step
    ticks, t = [], first
    while t <= hi + 1e-12:
        ticks.append(round(t, 10))
        t += step
    return ticks


def svg(curves, points, title, width=900, height=520):
    left, right, top, bottom = 70, 190, 40, 50
    xs = [i for _, ys in curves for i in range(1, len(ys) + 1)] + [s for _, p in points for s, _ in p]
    ys = [y for _, c in curves for y in c if math.isfinite(y)] + [v for _, p in points for _, v in p]
    x0, x1 = 1, max(xs) if xs else 2
    y0, y1 = (min(ys), max(ys)) if ys else (0, 1)
    pad = 0.05 * (y1 - y0 or 1)
    y0, y1 = y0 - pad, y1 + pad
    pw, ph = width - left - right, height - top - bottom

    def px(x):
        return left + (x - x0) / ((x1 - x0) or 1) * pw

    def py(y):
        return top + (y1 - y) / ((y1 - y0) or 1) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="22" font-size="15">{title}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>']
    for t in nice_ticks(y0, y1):
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in nice_ticks(x0, x1):
        out.append(f'<text x="{px(t):.1f}" y="{top + ph + 18}" text-anchor="middle">{t:g}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 10}" text-anchor="middle">step</text>')
    out.append(f'<text x="16" y="{top + ph / 2}" transform="rotate(-90 16 {top + ph / 2})" '
               f'text-anchor="middle">loss</text>')
    legend_y = top + 10
    for i, (label, c) in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        dash = ' stroke-dasharray="6 4"' if i % 2 else ""
        pts = " ".join(f"{px(s + 1):.1f},{py(y):.1f}" for s, y in enumerate(c) if math.isfinite(y))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.6"{dash}/>')
        out.append(f'<line x1="{left + pw + 12}" x2="{left + pw + 36}" y1="{legend_y}" y2="{legend_y}" '
                   f'stroke="{color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{left + pw + 42}" y="{legend_y + 4}">{label}</text>')
        legend_y += 20
    for i, (label, p) in enumerate(points):
        color = COLORS[(len(curves) + i) % len(COLORS)]
        for s, v in p:
            out.append(f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="3.5" fill="{color}"/>')
        out.append(f'<circle cx="{left + pw + 24}" cy="{legend_y}" r="3.5" fill="{color}"/>')
        out.append(f'<text x="{left + pw + 42}" y="{legend_y + 4}">{label}</text>')
        legend_y += 20
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("curves", nargs="+", help="LABEL=FILE.json")
    ap.add_argument("--val", action="append", default=[], help="LABEL=FILE.json with val_losses")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="loss")
    ap.add_argument("--compare", help="A,B: labels of two curves to compare")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args()
    curves = [(label, data["losses"]) for label, data in map(load, args.curves)]
    points = [(label, [(v["step"], v["loss"]) for v in data.get("val_losses", [])])
              for label, data in map(load, args.val)]
    with open(args.out, "w") as f:
        f.write(svg(curves, points, args.title))
    if args.compare:
        a, b = args.compare.split(",")
        table = dict(curves)
        err = max_relative_difference(table[a], table[b])
        ok = err <= args.tolerance
        print(f"{'PASS' if ok else 'FAIL'} {a} vs {b}: max relative loss difference {err:.3e} "
              f"over {len(table[a])} steps (tolerance {args.tolerance:g})")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
