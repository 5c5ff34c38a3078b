"""An experiment's report: results.json, table.md (the paper's Table 1 form) and PNG plots.

BPB is compared at equal training bytes (the final held-out BPB: every run of a seed saw the
same samples) and at equal spent compute, both ways experiments/compute.py counts it (the
paper's formula at the run's own context, and the FLOPs a step executes): each curve
interpolated at the most compute every run reached. The paper's 8,192-byte GFLOPs stay in a
column of their own, labelled as its convention, for comparison with its Table 1 only.

With several seeds a row is the mean ± standard deviation over them, its curve a band
(min to max), and a row whose BPB is within 2 pooled standard deviations of the best row's is
marked "within noise" (experiments/seeds.py). Every BPB is measured on the experiment's eval set
(eval_noise.py), and the table says which part of it each column reads: the final BPB the whole
set, the curves (BPB at equal compute) its first `eval_batches` blocks; the eval-sampling column
is the bootstrap over the set's documents. Throughput is the median over training batches (and
over seeds): shared cores stall some batches, which a mean rate would carry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hbpe.experiments.crossover import analyse_pair, describe
from hbpe.experiments.eval_noise import gap_noise, row_noise, subset
from hbpe.experiments.labels import row_label_suffix
from hbpe.experiments.ladder import best_against_best, ladder_lines, ladder_points, lr_lines, lr_sweep, tuned_gaps
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


PER_BATCH = ("eval_batch_nll", "eval_batch_bytes")  # per-run sums, kept in runs, not in rows


def group_rows(results: list[dict[str, Any]], eval_sets: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per run name (in run order) over its seeds: the first seed's measurements, BPB as a spread
    and its eval-sampling noise (None without the eval set's per-batch sums)."""
    names = list(dict.fromkeys(r["name"] for r in results))
    rows = []
    for name in names:
        rs = [r for r in results if r["name"] == name]
        rows.append(
            {
                **{k: v for k, v in rs[0].items() if k not in ("curve", "seed", "fingerprint", *PER_BATCH)},
                "seeds": [r.get("seed") for r in rs],
                "bpb": spread([r["bpb"] for r in rs]),
                "bpb_eval_noise": row_noise(rs, eval_sets or {}),
                "train_flops_paper": float(np.mean([r["train_flops_paper"] for r in rs])),
                "train_flops_executed": float(np.mean([r["train_flops_executed"] for r in rs])),
                "train_bytes_per_sec": float(np.median([_rate(r) for r in rs])),
                "curve": mean_curve([r["curve"] for r in rs]),
            }
        )
    return rows


def _rate(run: dict[str, Any]) -> float:
    """A run's training throughput: the median over its batches (a result written before it: the mean rate)."""
    median = run.get("train_bytes_per_sec_median")
    return float(median if median is not None else run["train_bytes_per_sec"])


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


def eval_set_text(spec: ExperimentSpec, eval_sets: dict[str, Any]) -> str:
    """Which held-out text each number reads: the eval set, and the part of it the curve points read."""
    parts = []
    for key, e in eval_sets.items():
        h = e["held_out"]
        name = f" ({key})" if len(eval_sets) > 1 else ""
        text = (f"eval set{name}: {e['samples']} held-out samples ({e['bytes'] / 1e3:.1f} KB) in {len(e['blocks'])} "
                f"blocks of consecutive samples spread over the whole held-out split ({e['documents']} of its "
                f"{h['documents']} documents, {h['bytes'] / 1e6:.2f} MB)")  # fmt: skip
        if spec.eval_batches < len(e["blocks"]):
            c = subset(e, spec.eval_batches)
            text += (f"; curve points read its first {c['blocks']} blocks ({c['samples']} samples, "
                     f"{c['bytes'] / 1e3:.1f} KB, {c['documents']} documents, spread over the split too)")  # fmt: skip
        else:
            text += "; curve points read the same set"
        parts.append(text)
    return "; ".join(parts) if parts else f"BPB on {spec.final_eval_batches} held-out batches"


def render_table(
    spec: ExperimentSpec,
    results: list[dict[str, Any]],
    equal: dict[str, dict[str, Any]],
    eval_sets: dict[str, Any] | None = None,
) -> str:
    rows = group_rows(results, eval_sets)
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
        f"for every run of a seed); schedule: {schedule}; {seeds}. {_upper(eval_set_text(spec, eval_sets or {}))}. "
        "BPB is the final evaluation on the whole eval set, ± the seeds' std; 'eval sampling' is the sd of the "
        "row's mean BPB over a bootstrap of the eval set's documents (another draw of held-out text); BPB at equal "
        "compute is interpolated on the training curves. Training compute is forward + backward as spent: the "
        "paper's formula at each run's own context, and the FLOPs the step executes (SwiGLU's three matrices; "
        "a patch model's local layers on every position they compute: its real symbols when model.local_layout is "
        "packed, the default, all S with PAD when padded). The 8,192-byte column is the paper's convention, for comparison with its "
        "Table 1 only. Throughput: the median over training batches and seeds.",
        "",
        "| model | params | fertility | bytes/patch | GFLOPs fwd (paper's convention, 8,192 B) | training TFLOPs "
        "(paper count, own context) | training TFLOPs (executed) | BPB (eval set) | eval sampling (sd, documents) "
        "| vs best | BPB at equal compute (paper count; curve points) | BPB at equal compute (executed; curve "
        "points) | train KB/s (median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = noise_notes(rows)
    for r in rows:
        eq = [equal[k]["bpb"].get(r["name"]) for k in COMPUTE]
        lines.append(
            f"| {r['scheme']}{row_label_suffix(r, rows)} | {r['params']['total'] / 1e6:.2f}M | {r['fertility']:.2f} | "
            f"{r['bytes_per_patch']:.2f} | {r['gflops']['total']:.2f} | {r['train_flops_paper'] / 1e12:#.3g} | "
            f"{r['train_flops_executed'] / 1e12:#.3g} | {show(r['bpb'])} | {_noise(r['bpb_eval_noise'])} | "
            f"{notes[r['name']]} | "
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


def _noise(n: dict[str, Any] | None) -> str:
    return "–" if n is None else f"{n['sd']:.4f} ({n['documents']})"


def _upper(text: str) -> str:
    return text[:1].upper() + text[1:]


LATENT_KEYS = ("latent_layers", "latent_dim", "latent_ffn", "latent_heads")


def crossover_pairs(results: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(BPE run, BPE-patch run) names: a BPE-patch run pairs with the one BPE run of its first stage and latent
    sizes (a ladder's widths pair by width; several BPE-patch runs, an S ladder's, share one BPE run)."""

    def key(r: dict[str, Any]) -> tuple:
        return (r["first_stage"], *(r["model"].get(k) for k in LATENT_KEYS))

    pairs = []
    for k in dict.fromkeys(key(r) for r in results):
        group = [r for r in results if key(r) == k]
        bpe = list(dict.fromkeys(r["name"] for r in group if r["io"] == "bpe"))
        hier = list(dict.fromkeys(r["name"] for r in group if r["io"] == "hierarchical"))
        if len(bpe) == 1:
            pairs += [(bpe[0], h) for h in hier]
    return pairs


def crossover_analyses(
    spec: ExperimentSpec, results: list[dict[str, Any]], eval_sets: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    out = []
    for a, b in crossover_pairs(results):
        ra, rb = [r for r in results if r["name"] == a], [r for r in results if r["name"] == b]
        out.append(analyse_pair(ra, rb, batches=spec.batches, eval_noise=gap_noise(ra, rb, eval_sets or {})))
    return out


def write_report(
    spec: ExperimentSpec, results: list[dict[str, Any]], out: Path, eval_sets: dict[str, Any] | None = None
) -> dict[str, Any]:
    """results.json, table.md and the plots; `eval_sets`: each first stage's eval set (eval_noise.describe_eval_set)."""
    eval_sets = eval_sets or {}
    equal = {key: equal_compute(results, key) for key in COMPUTE}
    table = render_table(spec, results, equal, eval_sets)
    rows = group_rows(results, eval_sets)
    wanted = {"crossover", "ladder"} & set(spec.plots)
    crossover = crossover_analyses(spec, results, eval_sets) if wanted else []
    for c in crossover:
        named = len(crossover) > 1  # name the runs when several pairs are compared
        a, b = ("BPE", "BPE-patch") if not named else (f"BPE ({c['a']})", f"BPE-patch ({c['b']})")
        table += "\n" + "\n".join(describe(c, a, b)) + "\n"
    ladder = None
    if "ladder" in spec.plots:
        ladder = {
            "pairs": ladder_points(spec, crossover, rows),
            "best_against_best": best_against_best(results, rows, eval_sets),
        }
        table += "\n" + "\n".join(ladder_lines(ladder["pairs"], ladder["best_against_best"])) + "\n"
    sweep = lr_sweep(rows) if "lr" in spec.plots else None
    tuned = (
        tuned_gaps(results, rows, eval_sets) if sweep and any(v["width"] is not None for v in sweep.values()) else None
    )
    if sweep is not None:
        table += "\n" + "\n".join(lr_lines(sweep, tuned)) + "\n"
    (out / "table.md").write_text(table)
    plots = write_plots(spec, rows, crossover, out, ladder=ladder, sweep=sweep)
    report = {
        "format": RESULTS_FORMAT,  # a rerun tells its own results.json from a user's file (out_folder.py)
        "experiment": spec.name,
        "spec": spec.to_dict(),
        "runs": results,
        "rows": [{k: v for k, v in r.items() if k != "curve"} | {"mean_curve": r["curve"]} for r in rows],
        "eval_set": eval_sets,  # per first stage: the held-out samples every BPB reads (eval_noise.py)
        "equal_compute": equal,
        "crossover": crossover,
        "ladder": ladder,  # with plots: ladder (ladder.py)
        "lr_sweep": sweep,  # with plots: lr
        "tuned_by_width": tuned,  # an lr sweep over several widths: the best rate's BPE against BPE-patch's
        "table": table,
        "plots": [str(out / p) for p in plots],
    }
    (out / "results.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report
