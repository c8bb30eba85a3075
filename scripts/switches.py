#!/usr/bin/env python3
"""How much of hackbench's run time follows context switches, and what mmcid costs at equal switches.

usage: scripts/switches.py RESULTS.json        (from `cargo run --release --example hackbench -- --json FILE ...`)
       scripts/switches.py --self-test         (checks the t quantiles and the regressor dropping; exit 1 on failure)

For each group count: per policy, the medians of wall time and of voluntary / involuntary context switches and the
correlation of wall time with each; then an ordinary least-squares fit over all runs of that group count,
    wall = a + b_P * [policy is P] + c * voluntary + d * involuntary,
whose b_P (as % of the `none` median, with a 95 % interval from Student's t at the fit's residual degrees of freedom)
is each policy's cost at equal context switches. A regressor that is constant over the runs (e.g. no involuntary
switch at all) or a linear combination of the others cannot be fitted: it is dropped, with a note.

Caveat: "at equal context switches" holds the switches fixed, but a policy may itself cause switches (a thread that
blocks or is preempted more often because of the policy's work); that part of its cost goes through the switch terms
and is not in b_P. hackbench's paired costs include it.

Standard library only (no numpy), so it runs wherever python3 does. docs/benchmarks.md has its results.
"""
import json
import random
import statistics as st
import sys

# Two-sided 95 % quantiles of Student's t, t_{0.975}(df), for df = 1..30.
T975 = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
]

CAVEAT = (
    "caveat: 'at equal context switches' holds the switches fixed, but a policy may itself cause switches; that part "
    "of its cost is in the switch terms, not in these percentages (hackbench's paired costs include it)"
)


def t975(df):
    """t_{0.975}(df): the table up to 30 degrees of freedom, then the Cornish-Fisher expansion around the normal
    quantile (error below 1e-4 from df = 30 on)."""
    if df < 1:
        raise ValueError(f"no t quantile for {df} degrees of freedom")
    if df <= len(T975):
        return T975[df - 1]
    z = st.NormalDist().inv_cdf(0.975)
    v = float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def solve(a, b):
    """Gauss-Jordan elimination with partial pivoting: x with a x = b. Raises ValueError for a (numerically)
    singular matrix instead of dividing by zero. A pivot counts as zero relative to its own column's largest
    entry, not the whole matrix's: X'X mixes 0/1 policy columns (entries ~ runs) with switch counts (entries ~
    runs * switches^2), and one matrix-wide scale called realistic fits singular once switches reach ~10^5."""
    n = len(a)
    m = [row[:] + [v] for row, v in zip(a, b)]
    scale = [max((abs(row[c]) for row in a), default=0.0) for c in range(n)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) <= 1e-12 * scale[c]:
            raise ValueError(f"singular matrix (column {c})")
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def independent_columns(x, tol=1e-9):
    """Indexes of the columns of x kept for the fit, in order: a column is dropped when it is (nearly) a linear
    combination of the columns kept before it (a Cholesky step of X'X whose pivot falls below tol times the
    column's own square norm), e.g. a constant column next to the intercept, or an all-zero column."""
    k = len(x[0])
    g = [[sum(row[a] * row[b] for row in x) for b in range(k)] for a in range(k)]
    kept, chol = [], {}  # chol[(i, j)]: the factor's entries for kept columns i, j
    for j in range(k):
        l_j = {}
        for i in kept:
            l_j[i] = (g[i][j] - sum(chol[(i, q)] * l_j[q] for q in kept if q in l_j)) / chol[(i, i)]
        d = g[j][j] - sum(v * v for v in l_j.values())
        if g[j][j] > 0 and d > tol * g[j][j]:
            for i, v in l_j.items():
                chol[(j, i)] = v
            chol[(j, j)] = d**0.5
            kept.append(j)
    return kept


def corr(x, y):
    mx, my = st.mean(x), st.mean(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else float("nan")


def fit(rows):
    """The least-squares fit of one group count's runs; prints the fit and each policy's cost at equal switches."""
    others = [r["policy"] for r in rows[1:]]
    names = ["intercept"] + [f"[policy is {p}]" for p in others] + ["voluntary switches", "involuntary switches"]
    x, y = [], []
    for r in rows:
        for w, v, i in zip(r["runs_s"], r["voluntary_switches"], r["involuntary_switches"]):
            x.append([1.0] + [1.0 if r["policy"] == p else 0.0 for p in others] + [float(v), float(i)])
            y.append(w)
    kept = independent_columns(x)
    for j in range(len(names)):
        if j not in kept:
            print(f"  note: dropped {names[j]} from the fit: constant over the runs or a combination of the others")
    x = [[row[j] for j in kept] for row in x]
    k = len(kept)
    if len(y) <= k:
        print("  too few runs for the fit")
        return
    xtx = [[sum(row[a] * row[b] for row in x) for b in range(k)] for a in range(k)]
    xty = [sum(row[a] * t for row, t in zip(x, y)) for a in range(k)]
    try:
        beta = solve(xtx, xty)
    except ValueError as e:
        print(f"  fit skipped: {e}")
        return
    resid = [t - sum(b * v for b, v in zip(beta, row)) for row, t in zip(x, y)]
    dof = len(y) - k
    s2 = sum(e * e for e in resid) / dof
    ym = st.mean(y)
    sst = sum((t - ym) ** 2 for t in y)
    r2 = 1 - sum(e * e for e in resid) / sst if sst > 0 else float("nan")
    coef = {kept[c]: beta[c] for c in range(k)}
    base = st.median(rows[0]["runs_s"])
    per = [
        f"per {what} switch {coef[j] * 1e6:.2f} us"
        for j, what in [(len(names) - 2, "voluntary"), (len(names) - 1, "involuntary")]
        if j in coef
    ]
    t = t975(dof)
    print(f"  fit: R^2 {r2:.2f}, {dof} residual dof (t {t:.3f}); {', '.join(per) or 'no switch term'}")
    for j, p in enumerate(others, start=1):
        if j not in coef:
            print(f"  {p}: not estimable (its indicator was dropped)")
            continue
        c = kept.index(j)
        e_c = [1.0 if q == c else 0.0 for q in range(k)]
        var = s2 * solve(xtx, e_c)[c]
        print(f"  {p}: {100 * coef[j] / base:+.2f} % ± {100 * t * var**0.5 / base:.2f} at equal context switches")


def main(path):
    data = json.load(open(path))
    if "results" not in data:
        sys.exit(f"{path}: not a --compare result (run hackbench without --policy, e.g. --policies none,mmcid)")
    cells = {}
    for r in data["results"]:
        cells.setdefault(r["groups"], []).append(r)
    for g, rows in cells.items():
        if "voluntary_switches" not in rows[0]:
            sys.exit(f"{path}: no context switches recorded (a hackbench too old to record them?)")
        print(f"{g} group(s)")
        for r in rows:
            w, v, i = r["runs_s"], r["voluntary_switches"], r["involuntary_switches"]
            print(
                f"  {r['policy']:<13} wall {st.median(w):.4f} s, switches voluntary {st.median(v):.0f} "
                f"involuntary {st.median(i):.0f}; corr(wall, voluntary) {corr(w, v):+.2f}, "
                f"corr(wall, involuntary) {corr(w, i):+.2f}"
            )
        fit(rows)
    print(CAVEAT)


def self_test():
    """Checks that can fail: the t quantiles against known values, the dropping of a constant or collinear
    column, and solve's refusal of a singular matrix."""
    checks = [
        (abs(t975(1) - 12.706) < 1e-9, "t(1)"),
        (abs(t975(30) - 2.042) < 1e-9, "t(30)"),
        (abs(t975(31) - 2.0395) < 2e-4, "t(31) from the expansion"),
        (abs(t975(60) - 2.0003) < 2e-4, "t(60)"),
        (abs(t975(120) - 1.9799) < 2e-4, "t(120)"),
        (abs(t975(10**6) - 1.95997) < 1e-4, "t(large) -> z"),
        (all(t975(d) > t975(d + 1) for d in range(1, 200)), "t decreases with the dof"),
    ]
    x = [[1.0, float(i % 2), float(3 * i + 1), 0.0, 2.0 * (i % 2) + 1.0] for i in range(8)]
    checks.append((independent_columns(x) == [0, 1, 2], "drops the all-zero and the collinear column"))
    checks.append((independent_columns([[1.0, 5.0], [1.0, 5.0], [1.0, 5.0]]) == [0], "drops a constant column"))
    try:
        solve([[1.0, 2.0], [2.0, 4.0]], [1.0, 2.0])
        checks.append((False, "solve refuses a singular matrix"))
    except ValueError:
        checks.append((True, "solve refuses a singular matrix"))
    checks.append((solve([[2.0, 0.0], [0.0, 4.0]], [2.0, 2.0]) == [1.0, 0.5], "solve"))
    # A well-posed fit with switch counts of ~5*10^5 per run (6 policies x 5 repeats, as bench16 runs on many
    # cores): X'X's switch entries are ~10^13 times its policy entries, which a matrix-wide scale called singular.
    rng = random.Random(1)
    x = [[1.0] + [1.0 if i % 6 == p else 0.0 for p in range(1, 6)] + [5e5 + rng.uniform(-5e4, 5e4)] for i in range(30)]
    xtx = [[sum(r[a] * r[b] for r in x) for b in range(7)] for a in range(7)]
    try:
        solve(xtx, [sum(r[a] for r in x) for a in range(7)])
        checks.append((True, "solve fits switch counts of 10^5 next to 0/1 columns"))
    except ValueError:
        checks.append((False, "solve fits switch counts of 10^5 next to 0/1 columns"))
    failed = [name for ok, name in checks if not ok]
    for name in failed:
        print(f"FAILED: {name}")
    print(f"self-test: {len(checks) - len(failed)} of {len(checks)} checks passed")
    return not failed


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--self-test":
        sys.exit(0 if self_test() else 1)
    main(sys.argv[1])
