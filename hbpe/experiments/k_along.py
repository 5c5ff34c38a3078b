"""k along one long run: is BPE-patch's data penalty under-training, or structural at this size?

At each curve point of the BPE-patch run (x_b bytes, BPB_b) the data factor is k = x_a / x_b, where x_a is where
the BPE run's curve first reaches BPB_b (crossover.factor_points). Under-training predicts k rising toward 1 as
tokens per parameter grow at a fixed model; a structural penalty predicts k flat or falling. A vertical gap that
shrinks at a constant k is what two copies of one decelerating curve shifted along x produce, so the gap's trend
is not the measure: k's is.

The readout, from the results of `hbpe experiment k-along-training` (one folder per seed, merged) and
optionally `k-along-training-lr` (the same pair at 1e-2 on a shorter budget, the same eval set and points):
  - k at READOUT tokens per BPE-patch parameter (linear in log k against log tokens between points);
  - the slope of log10 k on log10 training bytes past the first FIT_FROM of training, per seed and their mean;
  - the gap BPB_b - BPB_a at every point (both runs read the same samples: the same bytes at the same batch);
  - every one of these with a document-bootstrap interval: each replicate redraws the eval set's documents with
    replacement (the same draw for every run, point and seed: paired) and recomputes every curve point's BPB from
    the per-block NLL the point stored (runner.EvalCurve), then k, its slope and the gap. The interval holds
    eval-sampling noise; with several seeds the slope also gets t's interval over seeds, and the two are named
    apart (neither holds the other's noise);
  - the verdict against the issue's criteria, as levels: under-training when the slope's interval lies above 0
    and k(40) >= 0.3; structural when the slope's interval does not lie above 0 (flat or falling) and
    k(40) <= 0.15; otherwise neither.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from hbpe.experiments.crossover import factor_points, fit_line, t975
from hbpe.experiments.eval_noise import BOOTSTRAP, replicates
from hbpe.schemas.errors import ConfigError

READOUT = (2, 5, 11, 20, 40)  # tokens per BPE-patch parameter where k is read
FIT_FROM = 0.2  # the slope skips each run's first 20% of batches (the steep start and the warm-up)
UNDER_TRAINING_K40 = 0.3  # the issue's levels at 40 tokens per parameter
STRUCTURAL_K40 = 0.15
RESULTS_FILE, REPORT_FILE, JSON_FILE, PLOT_FILE = "results.json", "k_along.md", "k_along.json", "k_along.png"


def read_experiment(folder: Path) -> dict[str, Any]:
    """results.json of one finished experiment folder; ConfigError when absent or not hbpe's."""
    path = Path(folder) / RESULTS_FILE
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: pass the folder of a finished `hbpe experiment k-along-training`")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable results.json ({type(e).__name__})") from None
    if not isinstance(d, dict) or not isinstance(d.get("runs"), list) or not isinstance(d.get("eval_set"), dict):
        raise ConfigError(f"{path}: not an experiment's results.json (no runs or eval_set)")
    return d


def block_documents(eval_set: dict[str, Any]) -> tuple[np.ndarray, int]:
    """(the document index of each eval block, the number of documents), documents renumbered 0..n-1."""
    docs = [int(b[2]) for b in eval_set["blocks"]]
    order = {d: i for i, d in enumerate(sorted(set(docs)))}
    return np.array([order[d] for d in docs]), len(order)


def point_sums(point: dict[str, Any], block_doc: np.ndarray, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """(NLL in nats, target bytes) per document from one curve point's per-block sums.

    >>> point_sums({"eval_batch_nll": [1.0, 2.0, 4.0], "eval_batch_bytes": [10, 20, 40]}, np.array([0, 1, 0]), 2)
    (array([5., 2.]), array([50., 20.]))
    """
    nll, nbytes = point.get("eval_batch_nll"), point.get("eval_batch_bytes")
    if nll is None or nbytes is None or len(nll) != len(block_doc) or len(nbytes) != len(block_doc):
        raise ConfigError(
            f"a curve point at batch {point.get('batch')} stores no per-block NLL of the eval set's "
            f"{len(block_doc)} blocks: its run was trained before curves kept them; train it again"
        )
    return (np.bincount(block_doc, weights=np.asarray(nll, float), minlength=n_docs),
            np.bincount(block_doc, weights=np.asarray(nbytes, float), minlength=n_docs))  # fmt: skip


def curve_bpb(run: dict[str, Any], counts: np.ndarray, block_doc: np.ndarray, n_docs: int) -> np.ndarray:
    """(replicates, points) BPB of each curve point under each document draw `counts` (replicates, n_docs)."""
    sums = [point_sums(p, block_doc, n_docs) for p in run["curve"]]
    nll = np.stack([s[0] for s in sums], axis=1)  # (n_docs, points)
    nbytes = np.stack([s[1] for s in sums], axis=1)
    return (counts @ nll) / (counts @ nbytes) / math.log(2)


def k_values(a: dict[str, Any], b: dict[str, Any], bpb_a: np.ndarray, bpb_b: np.ndarray) -> np.ndarray:
    """k at each of b's points (NaN where BPE's curve does not reach b's BPB) from the given BPB values."""
    ca = [{**p, "bpb": float(v)} for p, v in zip(a["curve"], bpb_a, strict=True)]
    cb = [{**p, "bpb": float(v)} for p, v in zip(b["curve"], bpb_b, strict=True)]
    return np.array([np.nan if q["k"] is None else q["k"] for q in factor_points(ca, cb, "train_bytes")])


def interp_log(x: np.ndarray, y: np.ndarray, at: float) -> float | None:
    """y at `at`, linear in log y against log x between the points around it; None outside them or at a NaN.

    >>> round(interp_log(np.array([1.0, 100.0]), np.array([0.1, 1.0]), 10.0), 6)
    0.316228
    """
    if len(x) == 0 or not (x[0] <= at <= x[-1]):
        return None
    j = int(np.searchsorted(x, at))
    lo, hi = (j, j) if x[j] == at else (j - 1, j)
    if not (np.isfinite(y[lo]) and np.isfinite(y[hi]) and y[lo] > 0 and y[hi] > 0):
        return None
    if lo == hi:
        return float(y[lo])
    t = (math.log(at) - math.log(x[lo])) / (math.log(x[hi]) - math.log(x[lo]))
    return float(math.exp(math.log(y[lo]) + t * (math.log(y[hi]) - math.log(y[lo]))))


def slope(x_bytes: np.ndarray, k: np.ndarray, keep: np.ndarray) -> float | None:
    """Least-squares slope of log10 k on log10 bytes over the kept, measured points (None under 3 of them)."""
    use = keep & np.isfinite(k) & (k > 0)
    if use.sum() < 3:
        return None
    x = np.log10(x_bytes[use])
    return float(fit_line(x, np.log10(k[use]), float(x.mean()))["b"])


def _interval(values: list[float]) -> list[float] | None:
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if len(v) < 0.9 * len(values) or len(v) < 2:  # too many draws where it is not measured: no interval
        return None
    return [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]


def pair_runs(runs: list[dict[str, Any]], a_name: str, b_name: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(BPE, BPE-patch) runs of each seed both hold, in seed order; duplicates of one seed are refused."""
    by: dict[tuple[str, int], dict[str, Any]] = {}
    for r in runs:
        key = (r.get("name"), r.get("seed"))
        if key[0] in (a_name, b_name):
            if key in by and by[key].get("fingerprint") != r.get("fingerprint"):
                raise ConfigError(f"run {key[0]} seed {key[1]} appears twice with different specs; pass one of them")
            by[key] = r
    seeds = sorted({s for (n, s) in by if n == a_name} & {s for (n, s) in by if n == b_name})
    return [(by[(a_name, s)], by[(b_name, s)]) for s in seeds]


DEFAULT_PAIR = ("bpe-x0.5", "bpe-patch-x0.5")  # k-along-training's runs


def analyse(
    experiments: list[dict[str, Any]], *, a_name: str | None = None, b_name: str | None = None,
    rate_suffix: str = "-lr", readout: tuple[float, ...] = READOUT,
) -> dict[str, Any]:  # fmt: skip
    """The readout described above from one or more results.json dicts (seeds and the rate check merged).

    The pair: `a_name` (BPE) and `b_name` (BPE-patch), else the first experiment's `k_along_pair` (infra/gpu/k_rung.py
    names its best runs so), else k-along-training's."""
    pair = experiments[0].get("k_along_pair") if experiments else None
    default = tuple(pair) if isinstance(pair, list) and len(pair) == 2 else DEFAULT_PAIR
    a_name, b_name = a_name or default[0], b_name or default[1]
    runs = [r for d in experiments for r in d["runs"]]
    pairs = pair_runs(runs, a_name, b_name)
    if not pairs:
        raise ConfigError(f"no seed has both {a_name} and {b_name} finished in these experiments")
    eval_set = _one_eval_set(experiments, pairs[0][1]["first_stage"])
    block_doc, n_docs = block_documents(eval_set)
    counts = replicates(n_docs).astype(float)  # (BOOTSTRAP, n_docs), one draw for every run, point and seed
    ones = np.ones((1, n_docs))
    spec = experiments[0]["spec"]
    tokens_per_batch = spec["global_batch_size"] * spec["seq_len"]
    params_b = pairs[0][1]["params"]["total"]
    cut = FIT_FROM * spec["batches"]

    seeds, k_point, k_boot, gap_point, gap_boot = [], [], [], [], []
    for a, b in pairs:
        at_a = {p["batch"]: i for i, p in enumerate(a["curve"])}  # BPE's curve may hold more (early) points
        # b's points where a was evaluated too (a shorter run's last point, off a's grid, is left out)
        b = {**b, "curve": [p for p in b["curve"] if p["batch"] in at_a]}
        if len(b["curve"]) < 2:
            raise ConfigError(f"seed {a['seed']}: {a_name} and {b_name} share fewer than 2 evaluated batches")
        batches = np.array([p["batch"] for p in b["curve"]], dtype=float)
        same = [at_a[int(x)] for x in batches]
        x_b = np.array([p["train_bytes"] for p in b["curve"]], dtype=float)
        est_a, est_b = curve_bpb(a, ones, block_doc, n_docs)[0], curve_bpb(b, ones, block_doc, n_docs)[0]
        boot_a, boot_b = curve_bpb(a, counts, block_doc, n_docs), curve_bpb(b, counts, block_doc, n_docs)
        k = k_values(a, b, est_a, est_b)
        kb = np.stack([k_values(a, b, ra, rb) for ra, rb in zip(boot_a, boot_b, strict=True)])
        est_a, boot_a = est_a[same], boot_a[:, same]  # the gap: at b's batches
        keep = batches > cut
        seeds.append({"seed": a["seed"], "batches": batches, "x_bytes": x_b, "keep": keep,
                      "tokens_per_param": batches * tokens_per_batch / params_b, "k": k,
                      "slope": slope(x_b, k, keep),
                      "slope_boot": [slope(x_b, row, keep) for row in kb]})  # fmt: skip
        k_point.append(k)
        k_boot.append(kb)
        gap_point.append(est_b - est_a)
        gap_boot.append(boot_b - boot_a)

    # the seeds' points at the batches every seed evaluated (a run with early points holds more of them)
    common = sorted(set.intersection(*(set(s["batches"].tolist()) for s in seeds)))
    at = [[s["batches"].tolist().index(c) for c in common] for s in seeds]
    n = len(common)
    tpp = np.mean([s["tokens_per_param"][i] for s, i in zip(seeds, at, strict=True)], axis=0)
    x_bytes = np.mean([s["x_bytes"][i] for s, i in zip(seeds, at, strict=True)], axis=0)
    k_mean = _geo([k[i] for k, i in zip(k_point, at, strict=True)])  # (points,)
    k_boot_mean = _geo([kb[:, i] for kb, i in zip(k_boot, at, strict=True)])  # (BOOTSTRAP, points)
    gap_mean = np.mean([g[i] for g, i in zip(gap_point, at, strict=True)], axis=0)
    gap_boot_mean = np.mean([g[:, i] for g, i in zip(gap_boot, at, strict=True)], axis=0)

    points = []
    for j in range(n):
        points.append({
            "batch": int(common[j]), "train_bytes": float(x_bytes[j]),
            "tokens_per_param": float(tpp[j]), "k": _finite(k_mean[j]),
            "k_ci95": _interval(list(k_boot_mean[:, j])), "gap": float(gap_mean[j]),
            "gap_ci95": _interval(list(gap_boot_mean[:, j])),
        })  # fmt: skip
    at = {}
    for t in readout:
        at[str(t)] = {"k": interp_log(tpp, k_mean, t),
                      "k_ci95": _interval([interp_log(tpp, row, t) for row in k_boot_mean]),
                      "gap": _linear(tpp, gap_mean, t),
                      "gap_ci95": _interval([_linear(tpp, row, t) for row in gap_boot_mean])}  # fmt: skip
    slopes = [s["slope"] for s in seeds]
    boot_slopes = [
        None if any(s["slope_boot"][r] is None for s in seeds) else float(np.mean([s["slope_boot"][r] for s in seeds]))
        for r in range(BOOTSTRAP)
    ]  # fmt: skip
    slope_mean = None if any(s is None for s in slopes) else float(np.mean(slopes))
    over_seeds = None
    if slope_mean is not None and len(slopes) > 1:
        half = t975(len(slopes) - 1) * float(np.std(slopes, ddof=1)) / math.sqrt(len(slopes))
        over_seeds = [slope_mean - half, slope_mean + half]
    out = {
        "a": a_name, "b": b_name, "seeds": [s["seed"] for s in seeds], "params_b": params_b,
        "params_a": pairs[0][0]["params"]["total"], "lr": {"a": pairs[0][0]["lr"], "b": pairs[0][1]["lr"]},
        "eval_set": {"documents": n_docs, "blocks": len(block_doc), "bytes": eval_set.get("bytes"),
                     "held_out": eval_set.get("held_out")},
        "bootstrap": {"replicates": BOOTSTRAP, "over": "the eval set's documents, paired across runs and points"},
        "points": points, "at_tokens_per_param": at, "fit_from_batch": cut,
        "slope": {"value": slope_mean, "per_seed": slopes, "ci95_documents": _interval(boot_slopes),
                  "ci95_seeds": over_seeds},
        "final_gap": {"value": float(gap_mean[-1]), "ci95": _interval(list(gap_boot_mean[:, -1])),
                      "documents_b_behind": _documents_behind(pairs, block_doc, n_docs)},
    }  # fmt: skip
    out["verdict"] = verdict(out, readout_max=max(readout))
    out["rate_check"] = rate_check(runs, pairs, (a_name, b_name), rate_suffix, counts, block_doc, n_docs)
    return out


def verdict(analysis: dict[str, Any], *, readout_max: float = 40) -> dict[str, Any]:
    """The issue's criteria applied to k at `readout_max` tokens per parameter and the slope's interval(s)."""
    k40 = analysis["at_tokens_per_param"].get(str(readout_max), {}).get("k")
    s = analysis["slope"]
    intervals = [ci for ci in (s["ci95_documents"], s["ci95_seeds"]) if ci is not None]
    if k40 is None or s["value"] is None or not intervals:
        return {"reading": "not measured", "why": f"k at {readout_max:g} tokens per parameter or the slope's "
                "interval is missing (a curve short of it, or BPE's curve not reaching BPE-patch's BPB)"}  # fmt: skip
    rising = all(ci[0] > 0 for ci in intervals)  # every interval above 0: k rises
    falling = all(ci[1] < 0 for ci in intervals)
    trend = "rising" if rising else "falling" if falling else "flat (the slope's interval contains 0)"
    if rising and k40 >= UNDER_TRAINING_K40:
        reading = "supports under-training"
    elif not rising and k40 <= STRUCTURAL_K40:
        reading = "supports a structural penalty at this size"
    else:
        reading = "neither reading's criteria are met"
    return {"reading": reading, "k_at_end_of_readout": k40, "trend": trend,
            "criteria": {"under_training": f"slope > 0 (interval) and k({readout_max:g}) >= {UNDER_TRAINING_K40}",
                         "structural": f"slope not > 0 and k({readout_max:g}) <= {STRUCTURAL_K40}"}}  # fmt: skip


def rate_check(
    runs: list[dict[str, Any]], pairs: list[tuple[dict, dict]], names: tuple[str, str], suffix: str,
    counts: np.ndarray, block_doc: np.ndarray, n_docs: int,
) -> list[dict[str, Any]]:  # fmt: skip
    """Each model at the other rate against the main run of its seed at the last batch both evaluated:
    BPB(other rate) - BPB(main), paired bootstrap interval (< 0: the other rate is better there)."""
    out = []
    for main_index, name in enumerate(names):
        for other in (r for r in runs if str(r.get("name", "")).startswith(name + suffix)):
            main = next((p[main_index] for p in pairs if p[main_index]["seed"] == other["seed"]), None)
            if main is None:
                continue
            common = sorted({p["batch"] for p in main["curve"]} & {p["batch"] for p in other["curve"]})
            if not common:
                continue
            last = common[-1]
            pm = next(i for i, p in enumerate(main["curve"]) if p["batch"] == last)
            po = next(i for i, p in enumerate(other["curve"]) if p["batch"] == last)
            ones = np.ones((1, n_docs))
            est = curve_bpb(other, ones, block_doc, n_docs)[0, po], curve_bpb(main, ones, block_doc, n_docs)[0, pm]
            boot_other = curve_bpb(other, counts, block_doc, n_docs)[:, po]
            boot = boot_other - curve_bpb(main, counts, block_doc, n_docs)[:, pm]
            out.append({"run": other["name"], "lr": other["lr"], "main": main["name"], "main_lr": main["lr"],
                        "seed": other["seed"], "batch": last, "bpb_other": float(est[0]), "bpb_main": float(est[1]),
                        "diff": float(est[0] - est[1]), "diff_ci95": _interval(list(boot))})  # fmt: skip
    return out


def _documents_behind(pairs: list[tuple[dict, dict]], block_doc: np.ndarray, n_docs: int) -> list[int]:
    """[documents where BPE-patch's final seed-mean BPB is above BPE's, documents]: the final points, per document."""
    diffs = []
    for a, b in pairs:
        sa, sb = point_sums(a["curve"][-1], block_doc, n_docs), point_sums(b["curve"][-1], block_doc, n_docs)
        diffs.append(sb[0] / sb[1] - sa[0] / sa[1])
    d = np.mean(diffs, axis=0)
    return [int((d > 0).sum()), n_docs]


def _geo(arrays: list[np.ndarray]) -> np.ndarray:
    """The geometric mean over seeds, NaN where any seed is NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.exp(np.mean(np.log(np.stack(arrays)), axis=0))


def _finite(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


def _linear(x: np.ndarray, y: np.ndarray, at: float) -> float | None:
    return float(np.interp(at, x, y)) if len(x) and x[0] <= at <= x[-1] else None


def _one_eval_set(experiments: list[dict[str, Any]], first_stage: str) -> dict[str, Any]:
    """The eval set every experiment shares for `first_stage`; ConfigError when they were evaluated on others."""
    sets = [d["eval_set"].get(first_stage) for d in experiments]
    if any(s is None for s in sets) or any(s["blocks"] != sets[0]["blocks"] for s in sets):
        raise ConfigError("these experiments were not evaluated on one eval set (another corpus, split or number "
                          "of blocks): k and its bootstrap need the same documents in every run")  # fmt: skip
    return sets[0]


def render(analysis: dict[str, Any]) -> str:
    """k_along.md: the readout table, the slope, the final gap and the verdict, in plain words."""
    e = analysis["eval_set"]
    lines = [
        f"# k along training: {analysis['b']} against {analysis['a']}",
        "",
        f"Seeds {analysis['seeds']}; {analysis['a']} {analysis['params_a'] / 1e6:.2f}M parameters at lr "
        f"{analysis['lr']['a']:g}, {analysis['b']} {analysis['params_b'] / 1e6:.2f}M at lr {analysis['lr']['b']:g}. "
        f"Eval set: {e['blocks']} blocks, {e['documents']} documents, {(e['bytes'] or 0) / 1e3:.0f} KB; intervals are "
        f"95% percentiles of {analysis['bootstrap']['replicates']} document-bootstrap replicates (eval sampling, "
        "paired across runs and points)" + (", and t over seeds where named." if len(analysis["seeds"]) > 1 else
                                            "; one seed: seed noise is not in them."),
        "",
        "k = where BPE's curve reaches BPE-patch's BPB, over BPE-patch's training bytes (k < 1: BPE-patch needs 1/k "
        "times the data). Gap = BPB(BPE-patch) - BPB(BPE) at equal bytes.",
        "",
        "| tokens per BPE-patch parameter | k [95%] | gap [95%] |",
        "|---|---|---|",
    ]  # fmt: skip
    for t, r in analysis["at_tokens_per_param"].items():
        lines.append(f"| {t} | {_ci(r['k'], r['k_ci95'], '.3f')} | {_ci(r['gap'], r['gap_ci95'], '+.3f')} |")
    s = analysis["slope"]
    lines += ["", f"Slope of log10 k on log10 training bytes past batch {analysis['fit_from_batch']:.0f}: "
              f"{_ci(s['value'], s['ci95_documents'], '+.3f')} (documents)"
              + (f", [{s['ci95_seeds'][0]:+.3f}, {s['ci95_seeds'][1]:+.3f}] (t over seeds)" if s["ci95_seeds"] else "")
              + "; per seed " + ", ".join("–" if v is None else f"{v:+.3f}" for v in s["per_seed"]) + "."]  # fmt: skip
    g = analysis["final_gap"]
    behind, n = g["documents_b_behind"]
    lines += ["", f"Final gap {_ci(g['value'], g['ci95'], '+.4f')}; BPE-patch is behind on {behind} of the eval "
              f"set's {n} documents."]  # fmt: skip
    v = analysis["verdict"]
    lines += ["", f"**Reading: {v['reading']}**" + (f" (k is {v['trend']}; k at the last readout "
              f"{v['k_at_end_of_readout']:.3f})." if "trend" in v else f": {v.get('why', '')}")]  # fmt: skip
    if "criteria" in v:
        c = v["criteria"]
        lines += [
            "",
            f"Criteria, set before the run: under-training if {c['under_training']}; structural if {c['structural']}.",
        ]
    if analysis["rate_check"]:
        lines += ["", "Rate check (the other rate against the main run of its seed, at the last batch both "
                  "evaluated; < 0: the other rate is better there):", "",
                  "| run | lr | vs | batch | BPB | main BPB | difference [95%] |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in analysis["rate_check"]:
            lines.append(f"| {r['run']} | {r['lr']:g} | {r['main']} (lr {r['main_lr']:g}) | {r['batch']} | "
                         f"{r['bpb_other']:.4f} | {r['bpb_main']:.4f} | {_ci(r['diff'], r['diff_ci95'], '+.4f')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _ci(v: float | None, ci: list[float] | None, fmt: str) -> str:
    if v is None:
        return "–"
    return f"{v:{fmt}}" + (f" [{ci[0]:{fmt}}, {ci[1]:{fmt}}]" if ci else "")


def plot(analysis: dict[str, Any], path: Path) -> None:
    """k (with its document-bootstrap band) and the gap against tokens per BPE-patch parameter, log x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in analysis["points"] if p["k"] is not None]
    fig, (ax_k, ax_g) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = [p["tokens_per_param"] for p in pts]
    ax_k.plot(x, [p["k"] for p in pts], "o-", ms=3, label="k (seed mean)")
    band = [p for p in pts if p["k_ci95"]]
    ax_k.fill_between([p["tokens_per_param"] for p in band], [p["k_ci95"][0] for p in band],
                      [p["k_ci95"][1] for p in band], alpha=0.25, label="95% (documents)")  # fmt: skip
    ax_k.axhline(UNDER_TRAINING_K40, ls="--", c="C2", lw=1, label=f"under-training level at 40 ({UNDER_TRAINING_K40})")
    ax_k.axhline(STRUCTURAL_K40, ls="--", c="C3", lw=1, label=f"structural level at 40 ({STRUCTURAL_K40})")
    scale = "log" if pts else "linear"  # nothing to put on a log scale without a measured k
    ax_k.set(xscale=scale, yscale=scale, xlabel="tokens per BPE-patch parameter", ylabel="data factor k")
    if not pts:  # BPE's curve never reached BPE-patch's BPB at a point of it
        ax_k.text(0.5, 0.5, "k not measured at any point", ha="center", transform=ax_k.transAxes)
    ax_k.legend(fontsize=7)
    allp = analysis["points"]
    ax_g.plot([p["tokens_per_param"] for p in allp], [p["gap"] for p in allp], "o-", ms=3, c="C1")
    gb = [p for p in allp if p["gap_ci95"]]
    ax_g.fill_between([p["tokens_per_param"] for p in gb], [p["gap_ci95"][0] for p in gb],
                      [p["gap_ci95"][1] for p in gb], alpha=0.25, color="C1")  # fmt: skip
    ax_g.axhline(0, c="k", lw=0.8)
    ax_g.set(xscale="log", xlabel="tokens per BPE-patch parameter", ylabel="gap: BPB(BPE-patch) - BPB(BPE)")
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    for ax in (ax_k, ax_g) if pts else (ax_g,):  # plain numbers at round tokens per parameter, not 3x10^0
        ax.xaxis.set_major_locator(FixedLocator([1, 2, 5, 10, 20, 40, 100, 200]))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
    fig.suptitle(f"k along training: {analysis['b']} vs {analysis['a']}, seeds {analysis['seeds']}")
    fig.tight_layout()
    tmp = _fresh(path.with_name(path.name + ".partial.png"))
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def write_readout(folders: list[Path], out: Path, **names: str) -> dict[str, Any]:
    """k_along.json, k_along.md and k_along.png in `out` from finished experiment folders -> {analysis, table, files}.

    Every output is written to a temporary file first and renamed only when all of them were made: a failure
    leaves none of them half-written."""
    analysis = analyse([read_experiment(f) for f in folders], **names)
    analysis["folders"] = [str(Path(f)) for f in folders]
    out.mkdir(parents=True, exist_ok=True)
    targets = [out / JSON_FILE, out / REPORT_FILE, out / PLOT_FILE]
    for target in targets:
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise ConfigError(f"{target} is a link or not a regular file; move it away or pass another --out")
    table = render(analysis)
    plot(analysis, out / PLOT_FILE)
    for target, text in ((out / JSON_FILE, json.dumps(analysis, indent=1, sort_keys=True) + "\n"),
                         (out / REPORT_FILE, table)):  # fmt: skip
        tmp = _fresh(target.with_name(target.name + ".partial"))
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)
    return {"analysis": analysis, "table": table, "files": [str(t) for t in targets]}


def _fresh(tmp: Path) -> Path:
    """`tmp` with nothing in its place: a leftover file or link is removed (unlink never follows a link), so the
    write creates a new regular file rather than writing through a link someone left there; a folder is refused."""
    if tmp.is_dir() and not tmp.is_symlink():
        raise ConfigError(f"{tmp} is a folder; move it away or pass another --out")
    tmp.unlink(missing_ok=True)
    return tmp
