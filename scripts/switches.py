#!/usr/bin/env python3
"""How much of hackbench's run time follows context switches, and what mmcid costs at equal switches.

usage: scripts/switches.py RESULTS.json        (from `cargo run --release --example hackbench -- --json FILE ...`)

For each group count: per policy, the medians of wall time and of voluntary / involuntary context switches and the
correlation of wall time with each; then an ordinary least-squares fit over all runs of that group count,
    wall = a + b_P * [policy is P] + c * voluntary + d * involuntary,
whose b_P (as % of the `none` median, with a 95 % normal interval) is each policy's cost at equal context switches.
Standard library only (no numpy), so it runs wherever python3 does. docs/benchmarks.md, session 7.
"""
import json
import statistics as st
import sys


def solve(a, b):
    """Gauss-Jordan elimination with partial pivoting: x with a x = b."""
    n = len(a)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def corr(x, y):
    mx, my = st.mean(x), st.mean(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else float("nan")


def main(path):
    data = json.load(open(path))
    if "results" not in data:
        sys.exit(f"{path}: not a --compare result (run hackbench without --policy, e.g. --policies none,mmcid)")
    cells = {}
    for r in data["results"]:
        cells.setdefault(r["groups"], []).append(r)
    for g, rows in cells.items():
        if "voluntary_switches" not in rows[0]:
            sys.exit(f"{path}: no context switches recorded (a hackbench from before session 7?)")
        print(f"{g} group(s)")
        for r in rows:
            w, v, i = r["runs_s"], r["voluntary_switches"], r["involuntary_switches"]
            print(
                f"  {r['policy']:<13} wall {st.median(w):.4f} s, switches voluntary {st.median(v):.0f} "
                f"involuntary {st.median(i):.0f}; corr(wall, voluntary) {corr(w, v):+.2f}, "
                f"corr(wall, involuntary) {corr(w, i):+.2f}"
            )
        others = [r["policy"] for r in rows[1:]]
        x, y = [], []
        for r in rows:
            for w, v, i in zip(r["runs_s"], r["voluntary_switches"], r["involuntary_switches"]):
                x.append([1.0] + [1.0 if r["policy"] == p else 0.0 for p in others] + [float(v), float(i)])
                y.append(w)
        k = len(x[0])
        if len(y) <= k:
            print("  too few runs for the fit")
            continue
        xtx = [[sum(row[a] * row[b] for row in x) for b in range(k)] for a in range(k)]
        xty = [sum(row[a] * t for row, t in zip(x, y)) for a in range(k)]
        beta = solve(xtx, xty)
        resid = [t - sum(b * v for b, v in zip(beta, row)) for row, t in zip(x, y)]
        s2 = sum(e * e for e in resid) / (len(y) - k)
        ym = st.mean(y)
        r2 = 1 - sum(e * e for e in resid) / sum((t - ym) ** 2 for t in y)
        base = st.median(rows[0]["runs_s"])
        print(f"  fit: R^2 {r2:.2f}; per voluntary switch {beta[-2] * 1e6:.2f} us, per involuntary {beta[-1] * 1e6:.2f} us")
        for j, p in enumerate(others, start=1):
            e_j = [1.0 if q == j else 0.0 for q in range(k)]
            var = s2 * solve(xtx, e_j)[j]
            print(f"  {p}: {100 * beta[j] / base:+.2f} % ± {196 * var ** 0.5 / base:.2f} at equal context switches")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
