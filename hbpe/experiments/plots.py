"""An experiment's PNG plots: training curves (bands over seeds), vocabulary, S, and the BPE / BPE-patch gap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hbpe.experiments.labels import row_label_suffix
from hbpe.experiments.spec import ExperimentSpec


def write_plots(
    spec: ExperimentSpec,
    rows: list[dict[str, Any]],
    crossover: list[dict[str, Any]],
    out: Path,
    *,
    ladder: dict[str, Any] | None = None,
    sweep: dict[str, Any] | None = None,
) -> list[str]:
    """The plots `spec.plots` asks for, from the report's rows (seed-mean curves with bpb_min/bpb_max), its
    crossover analyses, ladder points and lr sweep (experiments/ladder.py)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a training machine
    import matplotlib.pyplot as plt

    written = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110, metadata={"Software": None})  # no version stamp: same bytes on rerun
        plt.close(fig)
        written.append(name)

    label = {r["name"]: r["scheme"] + row_label_suffix(r, rows) for r in rows}
    if "curve" in spec.plots:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        xs = (("train_bytes", 1e6, "training text (MB)"),
              ("train_flops_paper", 1e12, "training TFLOPs (paper count, own context)"),
              ("train_flops_executed", 1e12, "training TFLOPs (executed)"))  # fmt: skip
        for r in rows:
            c = r["curve"]
            for ax, (key, scale, _) in zip(axes, xs, strict=True):
                x = [p[key] / scale for p in c]
                line = ax.plot(x, [p["bpb"] for p in c], marker="o", markersize=3, label=label[r["name"]])[0]
                if len(r["seeds"]) > 1:  # the seeds' spread
                    lo, hi = [p["bpb_min"] for p in c], [p["bpb_max"] for p in c]
                    ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        for i, (ax, (_, _, xlabel)) in enumerate(zip(axes, xs, strict=True)):
            ax.set(xlabel=xlabel, ylabel="held-out bits per byte")
            if i:
                ax.set_xscale("log")
        seeds = f", {len(rows[0]['seeds'])} seeds (band: min-max)" if len(rows[0]["seeds"]) > 1 else ""
        axes[0].set_title(f"{spec.name}: BPB vs bytes ({spec.schedule} LR{seeds})", fontsize=9)
        axes[0].legend(fontsize=8)
        save(fig, "curve.png")
    if "vocab" in spec.plots:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for io, name in (("bpe", "BPE"), ("hierarchical", "BPE-patch")):
            rs = sorted((r for r in rows if r["io"] == io), key=lambda r: r["first_stage_vocab"])
            v = [r["first_stage_vocab"] for r in rs]
            axes[0].errorbar(v, [r["bpb"]["mean"] for r in rs], yerr=[r["bpb"]["std"] or 0 for r in rs], marker="o",
                             label=name, capsize=3)  # fmt: skip
            line = axes[1].plot(
                v, [r["train_flops_executed"] / 1e12 for r in rs], marker="o", label=f"{name} (executed)"
            )
            axes[1].plot(v, [r["train_flops_paper"] / 1e12 for r in rs], marker="s", linestyle="--",
                         color=line[0].get_color(), label=f"{name} (paper count, own context)")  # fmt: skip
        for ax, y in zip(axes, ("held-out bits per byte", "training TFLOPs spent"), strict=True):
            ax.set(xlabel="first-stage vocabulary", ylabel=y)
            ax.set_xscale("log")
            ax.legend(fontsize=8)
        save(fig, "vocab.png")
    if "s" in spec.plots:
        rs = sorted((r for r in rows if r["io"] == "hierarchical"), key=lambda r: r["max_patch_size"])
        fig, ax = plt.subplots(figsize=(5.5, 4))
        ax.errorbar([r["max_patch_size"] for r in rs], [r["bpb"]["mean"] for r in rs],
                    yerr=[r["bpb"]["std"] or 0 for r in rs], marker="o", capsize=3)  # fmt: skip
        ax.set(xlabel="S (symbols per patch)", ylabel="held-out bits per byte", title=f"{spec.name}: BPB vs S")
        save(fig, "s.png")
    if "crossover" in spec.plots and crossover:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        for c in crossover:
            for ax, name, xlabel in ((axes[0], "bytes", "log10 training bytes"),
                                     (axes[1], "executed", "log10 training FLOPs (executed)")):  # fmt: skip
                _gap_panel(ax, c[name], f"{c['b']} - {c['a']}", xlabel)
        axes[0].set_title(f"{spec.name}: gap BPB(BPE-patch) - BPB(BPE), at equal bytes", fontsize=9)
        axes[1].set_title("... at equal executed compute", fontsize=9)
        save(fig, "crossover.png")
    if "ladder" in spec.plots and ladder and ladder["pairs"]:
        fig = _ladder_figure(plt, spec, ladder["pairs"])
        save(fig, "ladder.png")
    if "lr" in spec.plots and sweep:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for io, v in sweep.items():
            ax.errorbar(v["lrs"], [b["mean"] for b in v["bpb"]], yerr=[b["std"] or 0 for b in v["bpb"]], marker="o",
                        capsize=3, label=f"{io} (best {v['best']:g})")  # fmt: skip
        ax.set(xlabel="learning rate", ylabel="held-out bits per byte", title=f"{spec.name}: BPB vs lr", xscale="log")
        ax.legend(fontsize=8)
        save(fig, "lr.png")
    return written


def _ladder_figure(plt, spec: ExperimentSpec, pairs: list[dict[str, Any]]):
    """Gap and data factor k against BPE-patch's parameters (final, one point per pair) and against tokens per
    parameter (each pair's curve)."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    params = [p["params_b"] / 1e6 for p in pairs]
    axes[0][0].errorbar(params, [p["gap"] for p in pairs], yerr=[p["gap_std"] or 0 for p in pairs], marker="o",
                        capsize=3)  # fmt: skip
    ks = [(x, p) for x, p in zip(params, pairs, strict=True) if p["k"] is not None]
    if ks:
        lo = [p["k"] - (p["k_ci95"] or [p["k"]])[0] for _, p in ks]
        hi = [(p["k_ci95"] or [0, p["k"]])[1] - p["k"] for _, p in ks]
        axes[1][0].errorbar([x for x, _ in ks], [p["k"] for _, p in ks], yerr=[lo, hi], marker="o", capsize=3)
    for p in pairs:
        label = f"{p['b']} − {p['a']}"
        c = p["gap_curve"]
        axes[0][1].plot([q["tokens_per_param"] for q in c], [q["delta"] for q in c], marker=".", label=label)
        k = p["k_curve"]
        axes[1][1].plot([q["tokens_per_param"] for q in k], [q["k"] for q in k], marker=".", label=label)
    for ax in axes[0]:
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_ylabel("BPB gap, BPE-patch − BPE (> 0: BPE ahead)")
    measured = bool(ks) or any(p["k_curve"] for p in pairs)
    for ax in axes[1]:
        ax.axhline(1, color="black", linewidth=0.8)
        ax.set(ylabel="data factor k (< 1: BPE needs less data)")
        if measured:
            ax.set_yscale("log")
        else:  # every BPE-patch BPB outside BPE's curve: k is only bounded (results.json)
            ax.text(0.5, 0.5, "k not measured: outside BPE's curve", ha="center", transform=ax.transAxes)
    log_x = [axes[0][0], axes[0][1]] + ([axes[1][0], axes[1][1]] if measured else [])  # an empty axis has no log
    for ax in (axes[0][0], axes[1][0]):
        ax.set(xlabel="BPE-patch parameters (M)")
    for ax in (axes[0][1], axes[1][1]):
        ax.set(xlabel="tokens trained per BPE-patch parameter")
    for ax in log_x:
        ax.set_xscale("log")
    axes[0][1].legend(fontsize=7)
    axes[0][0].set_title(f"{spec.name}: final gap (at equal bytes) vs size", fontsize=9)
    axes[0][1].set_title("gap along training", fontsize=9)
    return fig


def _gap_panel(ax, a: dict[str, Any], label: str, xlabel: str) -> None:
    """The seed-mean gap with its min-max band, the fitted line over the fit's range, extended to the crossover."""
    import numpy as np

    c = a["curve"]
    x = [p["x"] for p in c]
    line = ax.plot(x, [p["delta"] for p in c], marker="o", markersize=3, label=label)[0]
    ax.fill_between(x, [p["delta_min"] for p in c], [p["delta_max"] for p in c], color=line.get_color(), alpha=0.2,
                    linewidth=0)  # fmt: skip
    ax.axhline(0, color="black", linewidth=0.8)
    fit = a.get("fit")
    if fit is not None and x:
        end = a["crossover_log10"] if a["crossover_log10"] is not None else x[-1] + 1
        end = min(max(end, x[-1]), x[-1] + 4)  # at most 4 decades beyond the data
        start = a["fit_x_range"][0]  # the first point past both runs' own cut
        u = np.linspace(start, end, 50)
        ax.plot(u, fit["m"] + fit["b"] * (u - fit["x0"]), linestyle="--", color=line.get_color(),
                label=f"fit: {a['slope']:+.3f} per decade [{a['slope_ci95'][0]:+.3f}, {a['slope_ci95'][1]:+.3f}]")  # fmt: skip
        ax.axvspan(start, x[-1], color="grey", alpha=0.08)
        if a["crossover_log10"] is not None and a["crossover_log10"] <= end:
            ax.axvline(a["crossover_log10"], color=line.get_color(), linestyle=":", linewidth=1)
    ax.set(xlabel=xlabel, ylabel="BPB gap (> 0: BPE ahead)")
    ax.legend(fontsize=7)
