"""Does the gap between BPE-patch and BPE close with data? A line through the gap against log10 of training bytes.

    Delta(B) = BPB_BPE-patch(B) - BPB_BPE(B)          (> 0: BPE ahead)
    Delta    ~ m + b * (log10 B - x0)                  (least squares over the later part of training)
    crossover: log10 B* = x0 - m / b                   (where the fitted line reaches 0)

The fit skips the first FIT_FROM of each model's own training: there both models fall steeply
from a uniform guess and through the warm-up, and the gap reflects which one learns the easy
statistics first (unigram frequencies, common spellings), not the trend of interest. A gap point
is fitted only when both curves are past their own cut: against compute the two curves reach an
x at different batches (BPE-patch spends more per byte), and cutting by the batches of the curve
that ends first would fit BPE-patch's steep start. With a constant learning rate every remaining
point is a valid budget (experiments/spec.py `schedule`).

The 95% interval of the slope is taken over seeds when there are several (each seed's own
line; t with seeds - 1 degrees of freedom): the points of one curve are not independent
(one model, evaluated on the same held-out batches), so an interval over points understates
the noise. With one seed it falls back to the points (t with points - 2 degrees of freedom)
and says so. The crossover's interval is Fieller's: the values of log10 B where 0 lies inside
the line's 95% band, sqrt(s_m^2 + u^2 s_b^2) wide with m and b taken at the centre x0 (where
their estimates are uncorrelated); unbounded when the slope's interval contains 0.

The same fit is made against log10 of spent compute (paper count and executed), by
interpolating one curve at the other's points: the comparison at equal compute.

A vertical gap in BPB is hard to read across scales; the data factor says how far apart the curves
are along x instead. At each point of BPE-patch's curve (x_b, BPB_b), k = x_a / x_b, where x_a is
where BPE's curve first reaches BPB_b (linear in log x between its points): k = 0.25 against bytes
means BPE reaches BPE-patch's BPB with a quarter of the bytes (BPE-patch needs 1/k = 4 times the
data); k = 1 would be parity. Against FLOPs it is the compute factor. Where BPE-patch's BPB lies
outside BPE's curve k is not measured, only bounded (k_bound: below BPE's first point, above its
last). Over seeds (paired), the interval is t over log10 k.

The gap's straight line is a description, not a forecast: two copies of one decelerating curve shifted along x by a
constant data factor give a gap that shrinks toward 0 and never crosses it, and the line would still "cross". What
can say both "BPE-patch catches up" and "it never does" is a line through log10 k against log10 x (fit_factor):
k rising with an interval above 0 reaches parity (k = 1) at x* = x0 - m / b (Fieller's interval as above); k flat
or falling does not reach it. Reports give that reading (`k_trend`); the gap's line keeps its slope only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hbpe.experiments.seeds import mean_curve

FIT_FROM = 0.2  # fraction of the training batches skipped before the fit
# t quantiles at 97.5% (two-sided 95%) for 1..30 degrees of freedom
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def t975(df: int) -> float:
    """Student's t quantile at 0.975: a table to 30 degrees of freedom, Cornish-Fisher beyond (error < 1e-3).

    >>> t975(2), round(t975(100), 3)
    (4.303, 1.984)
    """
    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def fit_line(x: np.ndarray, y: np.ndarray, x0: float) -> dict[str, float]:
    """Least squares y ~ m + b (x - x0): {m, b, se_m, se_b, df} (standard errors from the residuals)."""
    u = np.asarray(x, dtype=float) - x0
    y = np.asarray(y, dtype=float)
    n = len(u)
    A = np.stack([np.ones(n), u], axis=1)
    (m, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    df = n - 2
    if df < 1:
        return {"m": float(m), "b": float(b), "se_m": math.nan, "se_b": math.nan, "df": df}
    s2 = float(((y - (m + b * u)) ** 2).sum()) / df
    cov = s2 * np.linalg.inv(A.T @ A)
    return {"m": float(m), "b": float(b), "se_m": math.sqrt(cov[0, 0]), "se_b": math.sqrt(cov[1, 1]), "df": df}


def fieller(m: float, b: float, se_m: float, se_b: float, t: float) -> tuple[float | None, float | None]:
    """The u where |m + b u| <= t sqrt(se_m^2 + u^2 se_b^2): (lo, hi), None for an unbounded end.

    Assumes m and b uncorrelated (x centred at the fit's mean). When the slope's interval
    excludes 0 the set is a finite interval around -m/b; otherwise it reaches to infinity.
    """
    a = b * b - t * t * se_b**2
    bb = 2 * m * b
    c = m * m - t * t * se_m**2
    disc = bb * bb - 4 * a * c
    if a > 0:  # the slope is significant: a finite interval (it holds -m/b, so disc >= 0)
        r = math.sqrt(max(disc, 0.0))
        return ((-bb - r) / (2 * a), (-bb + r) / (2 * a))
    if disc < 0 or (a == 0 and bb == 0):  # every u: the band holds 0 everywhere
        return (None, None)
    if a == 0:  # a linear condition bb u + c <= 0: a half-line
        return (None, -c / bb) if bb > 0 else (-c / bb, None)
    u1, u2 = sorted(((-bb - math.sqrt(disc)) / (2 * a), (-bb + math.sqrt(disc)) / (2 * a)))
    # the set is (-inf, u1] U [u2, inf): the half that holds the point estimate -m/b
    if b != 0 and -m / b <= u1:
        return (None, u1)
    return (u2, None)


def gap_points(a: list[dict[str, float]], b: list[dict[str, float]], key: str) -> list[dict[str, float]]:
    """Delta = BPB_b - BPB_a at the points of the curve that ends first in `key`, the other interpolated.

    Each point keeps that curve's `batch`, and `batch_a` / `batch_b`: where each curve is at that x
    (the other's interpolated), for the fit's cut of each curve by its own batches. Points outside
    the other curve's range are left out.
    """
    if not a or not b:
        return []
    grid, other, sign = (a, b, 1.0) if a[-1][key] <= b[-1][key] else (b, a, -1.0)
    ox = np.array([p[key] for p in other], dtype=float)
    oy = np.array([p["bpb"] for p in other], dtype=float)
    ob = np.array([p["batch"] for p in other], dtype=float)
    out = []
    for p in grid:
        if ox[0] <= p[key] <= ox[-1] and p[key] > 0:
            interp = float(np.interp(p[key], ox, oy))
            delta = (interp - p["bpb"]) * sign  # b - a
            at = float(np.interp(p[key], ox, ob))
            batch_a, batch_b = (p["batch"], at) if sign > 0 else (at, p["batch"])
            out.append({"batch": p["batch"], "batch_a": batch_a, "batch_b": batch_b, "x": math.log10(p[key]),
                        key: p[key], "delta": delta})  # fmt: skip
    return out


def fit_gap(per_seed: list[list[dict[str, float]]], *, batches: int, fit_from: float = FIT_FROM) -> dict[str, Any]:
    """The gap's line and crossover from each seed's gap points (gap_points), as described above."""
    cut = fit_from * batches
    used = [
        [p for p in pts if min(p.get("batch_a", p["batch"]), p.get("batch_b", p["batch"])) > cut] for pts in per_seed
    ]
    n_seeds = len(used)
    if n_seeds == 0 or min(len(u) for u in used) < 3:
        return {"fit": None, "reason": f"fewer than 3 curve points after the first {fit_from:.0%} of both runs"}
    x0 = float(np.mean([p["x"] for u in used for p in u]))
    lines = [fit_line([p["x"] for p in u], [p["delta"] for p in u], x0) for u in used]
    if n_seeds >= 2:
        ms, bs = np.array([f["m"] for f in lines]), np.array([f["b"] for f in lines])
        m, b = float(ms.mean()), float(bs.mean())
        se_m, se_b = float(ms.std(ddof=1)) / math.sqrt(n_seeds), float(bs.std(ddof=1)) / math.sqrt(n_seeds)
        t, over = t975(n_seeds - 1), f"over {n_seeds} seeds (t, {n_seeds - 1} df)"
    else:
        f = lines[0]
        m, b, se_m, se_b = f["m"], f["b"], f["se_m"], f["se_b"]
        if f["df"] < 1:
            return {"fit": None, "reason": "too few curve points for an interval"}
        t, over = t975(f["df"]), f"over {len(used[0])} points of one seed (t, {f['df']} df; points are correlated)"
    slope_ci = (b - t * se_b, b + t * se_b)
    closing = m * b < 0  # the line heads toward 0
    significant = slope_ci[0] > 0 or slope_ci[1] < 0
    crossover = x0 - m / b if b != 0 and closing else None
    ci_x = [None if u is None else x0 + u for u in fieller(m, b, se_m, se_b, t)]
    if not closing:
        verdict = "does not close: the gap widens" if significant else "does not close: no significant trend"
    elif not significant:
        verdict = "does not close within the 95% interval: the slope's interval contains 0"
    else:
        verdict = "closes"
    return {
        "fit": {"x0": x0, "m": m, "b": b, "se_m": se_m, "se_b": se_b, "t": t, "interval_over": over},
        "per_seed": lines,
        "fit_from_batch": cut,
        "fit_x_range": [min(p["x"] for u in used for p in u), max(p["x"] for u in used for p in u)],
        "points_used": [len(u) for u in used],
        "slope": b,
        "slope_ci95": list(slope_ci),
        "gap_at_x0": m,
        "crossover_log10": crossover,
        "crossover_ci95_log10": ci_x,
        "verdict": verdict,
    }


def fit_factor(per_seed: list[list[dict[str, Any]]], *, batches: int, fit_from: float = FIT_FROM) -> dict[str, Any]:
    """log10 k ~ m + b (log10 x - x0) over each seed's measured factor points (factor_points) past the first
    `fit_from` of the batches: k's slope per decade with t's interval (over seeds, else over one seed's points),
    where k would reach 1, and the reading (see the module's docstring)."""
    cut = fit_from * batches
    used = [[p for p in pts if p["batch"] > cut and p.get("k") is not None and p["k"] > 0] for pts in per_seed]
    if not used or min(len(u) for u in used) < 3:
        return {"fit": None, "reason": f"fewer than 3 measured k after the first {fit_from:.0%} of the runs"}
    x0 = float(np.mean([p["x"] for u in used for p in u]))
    lines = [fit_line([p["x"] for p in u], [math.log10(p["k"]) for p in u], x0) for u in used]
    if len(used) >= 2:
        ms, bs = np.array([f["m"] for f in lines]), np.array([f["b"] for f in lines])
        m, b = float(ms.mean()), float(bs.mean())
        se_m, se_b = float(ms.std(ddof=1)) / math.sqrt(len(used)), float(bs.std(ddof=1)) / math.sqrt(len(used))
        t, over = t975(len(used) - 1), f"over {len(used)} seeds (t, {len(used) - 1} df)"
    else:
        f = lines[0]
        if f["df"] < 1:
            return {"fit": None, "reason": "too few measured k for an interval"}
        m, b, se_m, se_b = f["m"], f["b"], f["se_m"], f["se_b"]
        t, over = t975(f["df"]), f"over {len(used[0])} points of one seed (t, {f['df']} df; points are correlated)"
    lo, hi = b - t * se_b, b + t * se_b
    parity = x0 - m / b if b > 0 and m < 0 else None  # log10 x where the line reaches k = 1
    parity_ci = [None if u is None else x0 + u for u in fieller(m, b, se_m, se_b, t)] if parity is not None else None
    if lo > 0:
        reading = "k rises toward 1" if m < 0 else "k is at or above 1"
    elif hi < 0:
        reading = "k falls: BPE-patch falls further behind in data"
    else:
        reading = "k flat within its interval: no parity in sight"
    return {"fit": {"x0": x0, "m": m, "b": b, "se_m": se_m, "se_b": se_b, "t": t, "interval_over": over},
            "slope": b, "slope_ci95": [lo, hi], "parity_log10": parity if lo > 0 else None,
            "parity_ci95_log10": parity_ci if lo > 0 else None, "reading": reading}  # fmt: skip


def reach(curve: list[dict[str, float]], key: str, bpb: float) -> float | None:
    """The x (`key`) where `curve` first reaches `bpb`, linear in log x between its points; None outside it."""
    for p, q in zip(curve, curve[1:]):
        if p["bpb"] >= bpb >= q["bpb"] and p[key] > 0 and q[key] > 0:
            t = (p["bpb"] - bpb) / (p["bpb"] - q["bpb"]) if p["bpb"] != q["bpb"] else 0.0
            return 10 ** (math.log10(p[key]) + t * (math.log10(q[key]) - math.log10(p[key])))
    return None


def factor_points(a: list[dict[str, float]], b: list[dict[str, float]], key: str) -> list[dict[str, Any]]:
    """At each point of b's curve: k = the x where a first reaches b's BPB, over b's x (see above).

    Outside a's curve k is None and `k_bound` says what is known: ["<=", a's first x / x_b] when b's BPB
    is above a's first point, [">=", a's last x / x_b] when it is below every point of a.
    """
    out = []
    for p in b:
        if p[key] <= 0:
            continue
        xa = reach(a, key, p["bpb"])
        point: dict[str, Any] = {"batch": p["batch"], "x": math.log10(p[key]), key: p[key], "k": None}
        if xa is not None:
            point["k"] = xa / p[key]
        elif a and p["bpb"] > a[0]["bpb"]:
            point["k_bound"] = ["<=", a[0][key] / p[key]]
        elif a and p["bpb"] < min(q["bpb"] for q in a):
            point["k_bound"] = [">=", a[-1][key] / p[key]]
        out.append(point)
    return out


def factor_over_seeds(per_seed: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """k at each point of b's curve (matched by index) over the seeds: the geometric mean and t's 95% interval
    over log10 k; at the end, the last point every seed measured."""
    n = min((len(s) for s in per_seed), default=0)
    points = []
    for j in range(n):
        ks = [s[j]["k"] for s in per_seed]
        point: dict[str, Any] = {"batch": per_seed[0][j]["batch"], "x": float(np.mean([s[j]["x"] for s in per_seed]))}
        point.update(_geometric(ks))
        points.append(point)
    measured = [p for p in points if p["k"] is not None]
    return {"curve": points, "at_end": measured[-1] if measured else None, "bound_at_end": _bound(per_seed)}


def _bound(per_seed: list[list[dict[str, Any]]]) -> list[Any] | None:
    """What every seed's last point bounds k by, when none measured it: ["<=", the largest] or [">=", the least]."""
    last = [s[-1].get("k_bound") for s in per_seed if s]
    if not last or any(b is None for b in last) or len({b[0] for b in last}) != 1:
        return None
    op = last[0][0]
    return [op, (max if op == "<=" else min)(b[1] for b in last)]


def _geometric(ks: list[float | None]) -> dict[str, Any]:
    """{k, k_ci95, k_values}: the geometric mean of the seeds' k and t's interval over log10 k (None if any is None)."""
    if any(k is None for k in ks):
        return {"k": None, "k_ci95": None, "k_values": ks}
    logs = np.log10(np.asarray(ks, dtype=float))
    mean = float(logs.mean())
    ci = None
    if len(logs) > 1:
        half = t975(len(logs) - 1) * float(logs.std(ddof=1)) / math.sqrt(len(logs))
        ci = [10 ** (mean - half), 10 ** (mean + half)]
    return {"k": 10**mean, "k_ci95": ci, "k_values": [float(k) for k in ks]}


def analyse_pair(
    a_runs: list[dict[str, Any]],
    b_runs: list[dict[str, Any]],
    *,
    batches: int,
    eval_noise: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The gap of run b over run a (the seeds of each, paired by seed) against bytes and spent compute, and the
    data / compute factor k; `eval_noise`: the final gap's eval-sampling noise (eval_noise.gap_noise)."""

    by_seed_b = {r["seed"]: r for r in b_runs}
    pairs = [(r, by_seed_b[r["seed"]]) for r in a_runs if r["seed"] in by_seed_b]
    out: dict[str, Any] = {"a": a_runs[0]["name"], "b": b_runs[0]["name"], "seeds": [a["seed"] for a, _ in pairs]}
    out["final_gap_eval_noise"] = eval_noise  # at equal bytes, on the whole eval set (the final evaluations)
    for key, name in (("train_bytes", "bytes"), ("train_flops_paper", "paper"), ("train_flops_executed", "executed")):
        per_seed = [gap_points(a["curve"], b["curve"], key) for a, b in pairs]
        fit = fit_gap(per_seed, batches=batches)
        curve = mean_curve([[{**p, "bpb": p["delta"]} for p in pts] for pts in per_seed])
        final = [pts[-1]["delta"] for pts in per_seed if pts]
        factors = [factor_points(a["curve"], b["curve"], key) for a, b in pairs]
        out[name] = {
            "x": key,
            "curve": [_gap_point(p, key) for p in curve],
            "delta_at_end": final,  # at the last point both reached (equal bytes, or equal compute)
            "factor": factor_over_seeds(factors),  # k: where BPE reaches BPE-patch's BPB, over BPE-patch's x
            "k_trend": fit_factor(factors, batches=batches),  # does k head for 1? (the reading; not the gap's line)
            **fit,
        }
    return out


def _gap_point(p: dict[str, float], key: str) -> dict[str, float]:
    """A seed-mean point of the gap (mean_curve's names for BPB renamed to the gap's)."""
    names = {"bpb": "delta", "bpb_min": "delta_min", "bpb_max": "delta_max", "bpb_std": "delta_std"}
    return {names.get(k, k): v for k, v in p.items() if k in names or k in ("x", "batch", "batch_a", "batch_b", key)}


def describe(analysis: dict[str, Any], label_a: str, label_b: str) -> list[str]:
    """Markdown lines: the gap, its slope, the crossover and the factor k, against bytes and against spent compute."""
    lines = [f"Gap Delta = BPB({label_b}) - BPB({label_a}) (> 0: {label_a} ahead), seeds {analysis['seeds']}, on the "
             "curve points' eval set; k = the x where " + label_a + " reaches " + label_b + "'s BPB, over "
             f"{label_b}'s x (k < 1: {label_a} needs k times the data or compute; geometric mean [95% over seeds], "
             f"at the last point of {label_b}'s curve every seed measured; ≤/≥: a bound, outside {label_a}'s curve):", ""]  # fmt: skip
    lines += ["| against | gap at the end (mean ± std of seeds) | gap's slope per decade [95%] | k at the end [95%] | "
              "k's slope per decade [95%] | k = 1 at [95%] | reading (k's trend) |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    unit = {"bytes": "training bytes (k: data factor)", "paper": "training FLOPs (paper count, own context; k: "
            "compute factor)", "executed": "training FLOPs (executed; k: compute factor)"}  # fmt: skip
    for name in ("bytes", "paper", "executed"):
        a = analysis[name]
        d = np.array(a["delta_at_end"], dtype=float)
        end = f"{d.mean():+.4f}" + (f" ± {d.std(ddof=1):.4f}" if len(d) > 1 else "") if len(d) else "–"
        k = _show_k(a.get("factor", {}))
        gap_slope = (
            "–" if a.get("fit") is None else f"{a['slope']:+.4f} [{a['slope_ci95'][0]:+.4f}, {a['slope_ci95'][1]:+.4f}]"
        )
        trend = a.get("k_trend") or {"fit": None, "reason": "not fitted"}
        if trend.get("fit") is None:
            lines.append(f"| {unit[name]} | {end} | {gap_slope} | {k} | – | – | {trend['reason']} |")
            continue
        lo, hi = trend["slope_ci95"]
        cx, ci = trend["parity_log10"], trend["parity_ci95_log10"]
        parity = "never (k not rising)" if cx is None else f"10^{cx:.2f}"
        if cx is not None and ci is not None:
            parity += " [" + ", ".join("∞" if v is None else f"10^{v:.2f}" for v in ci) + "]"
        lines.append(f"| {unit[name]} | {end} | {gap_slope} | {k} | {trend['slope']:+.4f} [{lo:+.4f}, {hi:+.4f}] | "
                     f"{parity} | {trend['reading']} |")  # fmt: skip
    noise = analysis.get("final_gap_eval_noise")
    if noise is not None:
        lo, hi = noise["ci95"]
        lines += ["", f"Eval sampling (the final evaluations, whole eval set, paired bootstrap over its "
                  f"{noise['documents']} documents): the final gap's sd is {noise['sd']:.4f}, 95% [{lo:+.4f}, {hi:+.4f}]."]  # fmt: skip
    b = analysis["bytes"]
    if b.get("fit") is not None:
        lines += ["", f"Each run's first {FIT_FROM:.0%} of training (batch {b['fit_from_batch']:.0f}) is left out "
                  f"of every fit (the steep start and the warm-up), cut by its own batches on every axis; slope "
                  f"interval {b['fit']['interval_over']}. The gap's line is a description only: a gap can shrink "
                  "at a constant k (two copies of one flattening curve), so where it would reach 0 is not "
                  "reported; k's line says whether and where parity (k = 1) would come."]  # fmt: skip
    return lines


def _show_k(factor: dict[str, Any]) -> str:
    """'0.215 [0.190, 0.243] at 10^6.72' (the last point every seed measured), '≤ 0.31' (a bound at the end), or '–'."""
    p = factor.get("at_end")
    if p is None or p.get("k") is None:
        bound = factor.get("bound_at_end")
        return "–" if bound is None else f"{'≤' if bound[0] == '<=' else '≥'} {bound[1]:.3g}"
    ci = p.get("k_ci95")
    return f"{p['k']:.3g}" + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "") + f" at 10^{p['x']:.2f}"
