"""Ladders: how the BPE / BPE-patch gap and the data factor k move with model size, data and S; and lr sweeps.

A ladder experiment has several BPE / BPE-patch pairs (report.crossover_pairs: a pair shares its first
stage and latent sizes). Each pair's final gap (at equal bytes, on the whole eval set) and data factor
k (crossover.py) are put against the pair's size and against tokens per parameter: first-stage tokens
trained (batches x batch x seq_len) over the BPE-patch run's parameters (the paper's model; the BPE
run's count is in the table beside it). At several widths the gap is given twice: at equal width (each
pair) and best against best (the lowest-BPB BPE row against the lowest-BPB BPE-patch row, whatever
their sizes), since a scheme may use its parameters better at another width than the other does.

An lr sweep (plots: lr) trains each model kind (io) at several learning rates; its best rate per kind
(lowest mean final BPB) is printed as the `io_lr=...` override that hands it to the other presets. A sweep
over several widths (lr-sweep-width) picks the best rate per kind and width, and gives the gap between the
two tuned models of each width (tuned_gaps).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hbpe.experiments.eval_noise import gap_noise
from hbpe.experiments.labels import WIDTH_KEY
from hbpe.experiments.seeds import within_noise
from hbpe.experiments.spec import ExperimentSpec


def tokens_trained(spec: ExperimentSpec, batch: float | None = None) -> float:
    """First-stage token positions trained after `batch` batches (default: the whole run)."""
    return (spec.batches if batch is None else batch) * spec.global_batch_size * spec.seq_len


def ladder_points(spec: ExperimentSpec, crossover: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict]:
    """One entry per pair: sizes, tokens per parameter, the final gap and k, and their curves over tokens/param."""
    by_name = {r["name"]: r for r in rows}
    out = []
    for c in crossover:
        a, b = by_name[c["a"]], by_name[c["b"]]
        params = b["params"]["total"]
        gap = np.asarray(c["bytes"]["delta_at_end"], dtype=float)
        k = c["bytes"]["factor"]["at_end"]
        out.append(
            {
                "a": c["a"],
                "b": c["b"],
                "params_a": a["params"]["total"],
                "params_b": params,
                "tokens_per_param": tokens_trained(spec) / params,
                "gap": float(gap.mean()) if len(gap) else None,
                "gap_std": float(gap.std(ddof=1)) if len(gap) > 1 else None,
                "gap_eval_sd": (c.get("final_gap_eval_noise") or {}).get("sd"),
                "k": None if k is None else k["k"],
                "k_ci95": None if k is None else k["k_ci95"],
                "k_bound": c["bytes"]["factor"].get("bound_at_end") if k is None else None,
                "k_compute_executed": (c["executed"]["factor"]["at_end"] or {}).get("k"),
                "gap_curve": [
                    {"tokens_per_param": tokens_trained(spec, p["batch_b"]) / params, "delta": p["delta"]}
                    for p in c["bytes"]["curve"]
                ],
                "k_curve": [
                    {"tokens_per_param": tokens_trained(spec, p["batch"]) / params, "k": p["k"]}
                    for p in c["bytes"]["factor"]["curve"]
                    if p["k"] is not None
                ],
            }
        )
    return out


def best_against_best(
    results: list[dict[str, Any]], rows: list[dict[str, Any]], eval_sets: dict[str, Any]
) -> dict[str, Any] | None:
    """The lowest-BPB BPE row against the lowest-BPB BPE-patch row: their gap over seeds (paired) and eval noise."""
    best = {}
    for io in ("bpe", "hierarchical"):
        candidates = [r for r in rows if r["io"] == io]
        if not candidates:
            return None
        best[io] = min(candidates, key=lambda r: r["bpb"]["mean"])["name"]
    a = [r for r in results if r["name"] == best["bpe"]]
    b = [r for r in results if r["name"] == best["hierarchical"]]
    seeds = [r["seed"] for r in a if r["seed"] in {x["seed"] for x in b}]
    gaps = [next(x for x in b if x["seed"] == s)["bpb"] - next(x for x in a if x["seed"] == s)["bpb"] for s in seeds]
    if not gaps:
        return None
    g = np.asarray(gaps, dtype=float)
    return {
        "a": best["bpe"],
        "b": best["hierarchical"],
        "gap": float(g.mean()),
        "gap_std": float(g.std(ddof=1)) if len(g) > 1 else None,
        "eval_noise": gap_noise(a, b, eval_sets),
    }


def ladder_lines(points: list[dict[str, Any]], best: dict[str, Any] | None) -> list[str]:
    """Markdown: the gap and k of every pair against its size, and best against best."""
    lines = [
        "Ladder: each BPE-patch run against the BPE run of its width and first stage (final gap at equal bytes on "
        "the whole eval set, ± seeds' std, eval-sampling sd; k at the last point every seed measured):",
        "",
        "| pair | params (BPE / BPE-patch) | tokens per parameter (BPE-patch) | gap at the end | eval sampling (sd) "
        "| data factor k [95%] | compute factor k (executed) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in points:
        gap = "–" if p["gap"] is None else f"{p['gap']:+.4f}" + (f" ± {p['gap_std']:.4f}" if p["gap_std"] else "")
        k = "–" if p["k"] is None else f"{p['k']:.3g}"
        if p["k"] is None and p.get("k_bound"):  # BPE-patch's BPB outside BPE's curve: only bounded
            k = f"{'≤' if p['k_bound'][0] == '<=' else '≥'} {p['k_bound'][1]:.3g}"
        if p["k"] is not None and p["k_ci95"]:
            k += f" [{p['k_ci95'][0]:.3g}, {p['k_ci95'][1]:.3g}]"
        kc = "–" if p["k_compute_executed"] is None else f"{p['k_compute_executed']:.3g}"
        noise = "–" if p["gap_eval_sd"] is None else f"{p['gap_eval_sd']:.4f}"
        lines.append(
            f"| {p['b']} − {p['a']} | {p['params_a'] / 1e6:.2f}M / {p['params_b'] / 1e6:.2f}M | "
            f"{p['tokens_per_param']:.3g} | {gap} | {noise} | {k} | {kc} |"
        )
    if best is not None and len(points) > 1:
        spread = f" ± {best['gap_std']:.4f}" if best["gap_std"] else ""
        noise = f", eval-sampling sd {best['eval_noise']['sd']:.4f}" if best["eval_noise"] else ""
        lines += ["", f"Best against best: {best['b']} − {best['a']} (each scheme's lowest BPB at any size): "
                  f"{best['gap']:+.4f}{spread}{noise}."]  # fmt: skip
    return lines


def _width(r: dict[str, Any]) -> Any:
    return r["model"].get(WIDTH_KEY)


def lr_sweep(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """{key: {io, width, lrs: [...], bpb: [spread...], names, best: lr}}: one entry per model kind (io), or per
    kind and width (key "bpe width 96") when the rows have several widths."""
    widths = len({_width(r) for r in rows}) > 1
    out: dict[str, Any] = {}
    for io, width in dict.fromkeys((r["io"], _width(r)) for r in rows):
        rs = sorted((r for r in rows if r["io"] == io and (not widths or _width(r) == width)), key=lambda r: r["lr"])
        best = min(rs, key=lambda r: r["bpb"]["mean"])
        key = f"{io} width {width}" if widths else io
        out[key] = {"io": io, "width": width if widths else None, "lrs": [r["lr"] for r in rs],
                    "bpb": [r["bpb"] for r in rs], "names": [r["name"] for r in rs], "best": best["lr"]}  # fmt: skip
    return out


def tuned_gaps(
    results: list[dict[str, Any]], rows: list[dict[str, Any]], eval_sets: dict[str, Any]
) -> list[dict[str, Any]]:
    """At each width of a sweep over widths: the best-rate BPE row against the best-rate BPE-patch row."""
    out = []
    for width in sorted({_width(r) for r in rows}, key=lambda w: (w is None, w)):
        names = {r["name"] for r in rows if _width(r) == width}
        pair = best_against_best([r for r in results if r["name"] in names], [r for r in rows if r["name"] in names],
                                 eval_sets)  # fmt: skip
        if pair is not None:
            out.append({"width": width, **pair})
    return out


def _tied(v: dict[str, Any]) -> str:
    """' (lr 0.003 within noise)': the rates whose BPB is less than 2 pooled std from the best's (the choice
    between them is the mean's, not a measured difference)."""
    at = dict(zip(v["lrs"], v["bpb"], strict=True))
    tied = [lr for lr in v["lrs"] if lr != v["best"] and within_noise(at[lr], at[v["best"]])]
    return f" ({', '.join(f'lr {lr:g}' for lr in tied)} within noise)" if tied else ""


def lr_lines(sweep: dict[str, Any], tuned: list[dict[str, Any]] | None = None) -> list[str]:
    """Markdown: BPB per lr for each model kind (and width), and the override that passes the best ones on, or
    with several widths the gap between the tuned models of each width."""
    lrs = sorted({lr for v in sweep.values() for lr in v["lrs"]})
    lines = ["Learning rate sweep (final BPB, mean ± std of seeds):", "",
             "| model (io) | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best lr |",
             "|---|" + "---|" * (len(lrs) + 1)]  # fmt: skip
    for key, v in sweep.items():
        at = dict(zip(v["lrs"], v["bpb"], strict=True))
        cells = [
            "–" if lr not in at else f"{at[lr]['mean']:.4f}" + (f" ± {at[lr]['std']:.4f}" if at[lr]["std"] else "")
            for lr in lrs
        ]
        edge = " (at the edge of the sweep)" if len(v["lrs"]) > 1 and v["best"] in (v["lrs"][0], v["lrs"][-1]) else ""
        lines.append(f"| {key} | " + " | ".join(cells) + f" | {v['best']:g}{_tied(v)}{edge} |")
    if any(v.get("width") is not None for v in sweep.values()):
        lines += ["", "The tuned models at each width (each kind at its best rate there): BPE-patch − BPE, final BPB "
                  "(± seeds' std where several; eval-sampling sd):", "", "| width | BPE | BPE-patch | gap |",
                  "|---|---|---|---|"]  # fmt: skip
        for t in tuned or []:
            spread = f" ± {t['gap_std']:.4f}" if t["gap_std"] else ""
            noise = f" (eval sd {t['eval_noise']['sd']:.4f})" if t["eval_noise"] else ""
            lines.append(f"| {t['width']} | {t['a']} | {t['b']} | {t['gap']:+.4f}{spread}{noise} |")
        return lines
    chosen = ", ".join(f"{io}: {v['best']:g}" for io, v in sweep.items())
    lines += ["", f"Pass the best rates to the other presets: `io_lr={{{chosen}}}` (e.g. `hbpe experiment ladder-width "
              f"'io_lr={{{chosen}}}'`)."]  # fmt: skip
    return lines
