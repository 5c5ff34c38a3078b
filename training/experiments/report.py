"""An experiment's report: results.json, table.md (the paper's Table 1 form) and PNG plots.

BPB is compared two ways, both from the training curves:
- at equal training bytes: the final held-out BPB (every run saw the same samples);
- at equal training FLOPs: each curve interpolated at the largest FLOPs every run reached
  (the runs with the cheapest forward pass have trained on fewer FLOPs by then).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from hbpe.training.experiments.spec import ExperimentSpec


def bpb_at(curve: list[dict[str, float]], key: str, x: float) -> float | None:
    """Held-out BPB interpolated at `x` training bytes or FLOPs (None outside the curve)."""
    xs = np.array([p[key] for p in curve], dtype=float)
    if len(xs) == 0 or x < xs[0] or x > xs[-1]:
        return None
    return float(np.interp(x, xs, [p["bpb"] for p in curve]))


def equal_flops(results: list[dict[str, Any]]) -> tuple[float | None, dict[str, float | None]]:
    """(the FLOPs every run reached, each run's BPB there)."""
    reached = [r["curve"][-1]["train_flops"] for r in results if r["curve"]]
    if not reached:
        return None, {}
    at = min(reached)
    return at, {r["name"]: bpb_at(r["curve"], "train_flops", at) for r in results}


def render_table(spec: ExperimentSpec, results: list[dict[str, Any]], flops_at: float | None, at_flops: dict) -> str:
    lines = [
        f"{spec.description}. {spec.batches} batches of {spec.global_batch_size} x {spec.seq_len}-token samples "
        f"per run (the same samples for every run); BPB on {spec.final_eval_batches} held-out batches; BPB at equal "
        f"FLOPs interpolated on the training curves, whose points use the first {spec.eval_batches} of them.",
        "",
        "| model | GFLOPs (8,192 B) | fertility | params | bytes/patch | BPB | BPB at equal FLOPs | train KB/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        eq = at_flops.get(r["name"])
        lines.append(
            f"| {r['scheme']}{_variant(r, results)} | {r['gflops']['total']:.2f} | {r['fertility']:.2f} | "
            f"{r['params']['total'] / 1e6:.2f}M | {r['bytes_per_patch']:.2f} | {r['bpb']:.4f} | "
            f"{'-' if eq is None else f'{eq:.4f}'} | {r['train_bytes_per_sec'] / 1e3:.1f} |"
        )
    if flops_at is not None:
        lines += ["", f"Equal FLOPs: {flops_at / 1e12:.2f} TFLOPs of training (forward + backward, the paper's count)."]
    return "\n".join(lines) + "\n"


def _variant(r: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """S or the first-stage vocabulary when the experiment varies them."""
    parts = []
    if len({x["max_patch_size"] for x in results if x["io"] == "hierarchical"}) > 1 and r["io"] == "hierarchical":
        parts.append(f"S={r['max_patch_size']}")
    if len({x["first_stage_vocab"] for x in results}) > 1:
        parts.append(f"V={r['first_stage_vocab']}")
    return f" ({', '.join(parts)})" if parts else ""


def write_plots(spec: ExperimentSpec, results: list[dict[str, Any]], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a training machine
    import matplotlib.pyplot as plt

    written = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110, metadata={"Software": None})  # no version stamp: same bytes on rerun
        plt.close(fig)
        written.append(name)

    label = {r["name"]: r["scheme"] + _variant(r, results) for r in results}
    if "curve" in spec.plots:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for r in results:
            xs = [p["train_bytes"] / 1e6 for p in r["curve"]]
            axes[0].plot(xs, [p["bpb"] for p in r["curve"]], marker="o", label=label[r["name"]])
            axes[1].plot([p["train_flops"] / 1e12 for p in r["curve"]], [p["bpb"] for p in r["curve"]], marker="o")
        axes[0].set(xlabel="training text (MB)", ylabel="held-out bits per byte", title=f"{spec.name}: BPB vs bytes")
        axes[1].set(xlabel="training TFLOPs (paper's count)", ylabel="held-out bits per byte", title="BPB vs FLOPs")
        axes[1].set_xscale("log")
        axes[0].legend(fontsize=8)
        save(fig, "curve.png")
    if "vocab" in spec.plots:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for io, name in (("bpe", "BPE"), ("hierarchical", "BPE-patch")):
            rs = sorted((r for r in results if r["io"] == io), key=lambda r: r["first_stage_vocab"])
            v = [r["first_stage_vocab"] for r in rs]
            axes[0].plot(v, [r["bpb"] for r in rs], marker="o", label=name)
            axes[1].plot(v, [r["gflops"]["total"] for r in rs], marker="o", label=name)
        for ax, y in zip(axes, ("held-out bits per byte", "forward GFLOPs on 8,192 bytes"), strict=True):
            ax.set(xlabel="first-stage vocabulary", ylabel=y)
            ax.set_xscale("log")
            ax.legend()
        save(fig, "vocab.png")
    if "s" in spec.plots:
        rs = sorted((r for r in results if r["io"] == "hierarchical"), key=lambda r: r["max_patch_size"])
        fig, ax = plt.subplots(figsize=(5.5, 4))
        ax.plot([r["max_patch_size"] for r in rs], [r["bpb"] for r in rs], marker="o")
        ax.set(xlabel="S (symbols per patch)", ylabel="held-out bits per byte", title=f"{spec.name}: BPB vs S")
        save(fig, "s.png")
    return written


def write_report(spec: ExperimentSpec, results: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    flops_at, at_flops = equal_flops(results)
    table = render_table(spec, results, flops_at, at_flops)
    (out / "table.md").write_text(table)
    plots = write_plots(spec, results, out)
    report = {
        "experiment": spec.name,
        "spec": spec.to_dict(),
        "runs": results,
        "equal_flops": {"train_flops": flops_at, "bpb": at_flops},
        "table": table,
        "plots": [str(out / p) for p in plots],
    }
    (out / "results.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report
