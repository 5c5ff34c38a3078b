"""An experiment's report: results.json, table.md (the paper's Table 1 form) and PNG plots.

BPB is compared at equal training bytes (the final held-out BPB: every run of a seed saw the
same samples) and at equal spent compute, both ways experiments/compute.py counts it (the
paper's formula at the run's own context, and the FLOPs a step executes): each curve
interpolated at the most compute every run reached. The paper's 8,192-byte GFLOPs stay in a
column of their own, labelled as its convention, for comparison with its Table 1 only.

With several seeds a row is the mean ± standard deviation over them, its curve a band
(min to max), and a row whose BPB is within 2 pooled standard deviations of the best row's is
marked "within noise" (experiments/seeds.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hbpe.experiments.crossover import analyse_pair, describe
from hbpe.experiments.labels import row_label_suffix
from hbpe.experiments.out_folder import RESULTS_FORMAT
from hbpe.experiments.plots import write_plots
from hbpe.experiments.seeds import mean_curve, show, spread, within_noise
from hbpe.experiments.spec import ExperimentSpec

COMPUTE = {  # result key -> how the table names it
    "train_flops_paper": "paper count at own context",
    "train_flops_executed": "executed",
}


def bpb_at(curve: list[dict[str, float]], key: str, x: float) -> float | None:
    """Held-out BPB interpolated at `x` training bytes or FLOPs (None outside the curve)."""
    xs = np.array([p[key] for p in curve], dtype=float)
    if len(xs) == 0 or x < xs[0] or x > xs[-1]:
        return None
    return float(np.interp(x, xs, [p["bpb"] for p in curve]))


def group_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run name (in run order) over its seeds: the first seed's measurements, BPB as a spread."""
    names = list(dict.fromkeys(r["name"] for r in results))
    rows = []
    for name in names:
        rs = [r for r in results if r["name"] == name]
        rows.append(
            {
                **{k: v for k, v in rs[0].items() if k not in ("curve", "seed", "fingerprint")},
                "seeds": [r.get("seed") for r in rs],
                "bpb": spread([r["bpb"] for r in rs]),
                "train_flops_paper": float(np.mean([r["train_flops_paper"] for r in rs])),
                "train_flops_executed": float(np.mean([r["train_flops_executed"] for r in rs])),
                "train_bytes_per_sec": float(np.mean([r["train_bytes_per_sec"] for r in rs])),
                "curve": mean_curve([r["curve"] for r in rs]),
            }
        )
    return rows


def equal_compute(results: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """{train_flops: the compute every run (every seed) reached, bpb: {name: spread or None}} for one count."""
    reached = [r["curve"][-1][key] for r in results if r["curve"]]
    if not reached:
        return {"train_flops": None, "bpb": {}}
    at = min(reached)
    bpb: dict[str, Any] = {}
    for name in dict.fromkeys(r["name"] for r in results):
        values = [bpb_at(r["curve"], key, at) for r in results if r["name"] == name]
        bpb[name] = None if any(v is None for v in values) else spread(values)
    return {"train_flops": at, "bpb": bpb}


def noise_notes(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Each row's BPB against the best row's: '+0.0123', '+0.0012 (within noise)' or 'best'."""
    best = min(rows, key=lambda r: r["bpb"]["mean"])
    out = {}
    for r in rows:
        if r is best:
            out[r["name"]] = "best"
            continue
        d = r["bpb"]["mean"] - best["bpb"]["mean"]
        noise = within_noise(r["bpb"], best["bpb"])
        out[r["name"]] = f"{d:+.4f}" + (" (within noise)" if noise else "")
    return out


def render_table(spec: ExperimentSpec, results: list[dict[str, Any]], equal: dict[str, dict[str, Any]]) -> str:
    rows = group_rows(results)
    context = np.mean([r["context_bytes"] for r in results])
    seeds = f"{spec.seeds} seeds ({', '.join(str(s) for s in rows[0]['seeds'])}), mean ± std" if spec.seeds > 1 else (
        f"1 seed ({spec.seed}): noise not measured")  # fmt: skip
    schedule = {
        "constant": "constant learning rate after a linear warm-up (every curve point is a valid budget)",
        "cosine": "cosine decay over the whole run (curve points inside it are not runs of that length)",
    }[spec.schedule]
    lines = [
        f"{spec.description}. {spec.batches} batches of {spec.global_batch_size} x {spec.seq_len}-token samples per "
        f"run (context: {spec.seq_len} tokens = {context:.0f} bytes of text per sample on average; the same samples "
        f"for every run of a seed); schedule: {schedule}; {seeds}. BPB on {spec.final_eval_batches} held-out batches; "
        f"BPB at equal compute interpolated on the training curves, whose points use the first {spec.eval_batches} "
        "of them. Training compute is forward + backward as spent: the paper's formula at each run's own context, "
        "and the FLOPs the step executes (SwiGLU, every position of every patch, PAD included). The 8,192-byte "
        "column is the paper's convention, for comparison with its Table 1 only.",
        "",
        "| model | params | fertility | bytes/patch | GFLOPs fwd (paper's convention, 8,192 B) | training TFLOPs "
        "(paper count, own context) | training TFLOPs (executed) | BPB | vs best | BPB at equal compute (paper "
        "count) | BPB at equal compute (executed) | train KB/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = noise_notes(rows)
    for r in rows:
        eq = [equal[k]["bpb"].get(r["name"]) for k in COMPUTE]
        lines.append(
            f"| {r['scheme']}{row_label_suffix(r, rows)} | {r['params']['total'] / 1e6:.2f}M | {r['fertility']:.2f} | "
            f"{r['bytes_per_patch']:.2f} | {r['gflops']['total']:.2f} | {r['train_flops_paper'] / 1e12:#.3g} | "
            f"{r['train_flops_executed'] / 1e12:#.3g} | {show(r['bpb'])} | {notes[r['name']]} | "
            + " | ".join("-" if e is None else show(e) for e in eq)
            + f" | {r['train_bytes_per_sec'] / 1e3:.1f} |"
        )
    lines.append("")
    for key, label in COMPUTE.items():
        at = equal[key]["train_flops"]
        if at is not None:
            lines.append(f"Equal compute ({label}): {at / 1e12:#.3g} TFLOPs of training, the most every run reached.")
    if spec.seeds > 1:
        lines.append("'within noise': less than 2 pooled standard deviations of the seeds from the best row.")
    return "\n".join(lines) + "\n"


def crossover_pairs(results: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(BPE run, BPE-patch run) names per first stage that has one of each."""
    pairs = []
    for fs in dict.fromkeys(r["first_stage"] for r in results):
        bpe = list(dict.fromkeys(r["name"] for r in results if r["first_stage"] == fs and r["io"] == "bpe"))
        hier = list(dict.fromkeys(r["name"] for r in results if r["first_stage"] == fs and r["io"] == "hierarchical"))
        if len(bpe) == 1 and len(hier) == 1:
            pairs.append((bpe[0], hier[0]))
    return pairs


def crossover_analyses(spec: ExperimentSpec, results: list[dict[str, Any]]) -> list[dict[str, Any]]:

    return [
        analyse_pair(
            [r for r in results if r["name"] == a], [r for r in results if r["name"] == b], batches=spec.batches
        )
        for a, b in crossover_pairs(results)
    ]


def write_report(spec: ExperimentSpec, results: list[dict[str, Any]], out: Path) -> dict[str, Any]:

    equal = {key: equal_compute(results, key) for key in COMPUTE}
    table = render_table(spec, results, equal)
    crossover = crossover_analyses(spec, results) if "crossover" in spec.plots else []
    for c in crossover:
        named = len(crossover) > 1  # name the runs when several first stages each have a pair
        a, b = ("BPE", "BPE-patch") if not named else (f"BPE ({c['a']})", f"BPE-patch ({c['b']})")
        table += "\n" + "\n".join(describe(c, a, b)) + "\n"
    (out / "table.md").write_text(table)
    rows = group_rows(results)
    plots = write_plots(spec, rows, crossover, out)
    report = {
        "format": RESULTS_FORMAT,  # a rerun tells its own results.json from a user's file (out_folder.py)
        "experiment": spec.name,
        "spec": spec.to_dict(),
        "runs": results,
        "rows": [{k: v for k, v in r.items() if k != "curve"} | {"mean_curve": r["curve"]} for r in rows],
        "equal_compute": equal,
        "crossover": crossover,
        "table": table,
        "plots": [str(out / p) for p in plots],
    }
    (out / "results.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report
