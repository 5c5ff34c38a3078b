"""`hbpe plot RUN`: a run's training and eval curves (loss and bits per byte) from its metrics.jsonl, as a PNG."""

from __future__ import annotations

import os
from typing import Any

from hbpe.pipeline import storage
from hbpe.schemas.errors import ConfigError
from hbpe.training.train.metrics_file import METRICS_FILE, read_metrics

X_AXES = {"batches": ("batch", "trained batches"), "bytes": ("bytes", "trained text bytes (all ranks)")}
TRAIN_LOSS, TRAIN_BPB, EVAL_LOSS, EVAL_BPB = (
    "loss/train/total",
    "metrics/train/BitsPerByte",
    "metrics/eval/LossPerSymbol",
    "metrics/eval/BitsPerByte",
)
IMAGE_FORMATS = ("png", "svg", "pdf")  # what --out may name: matplotlib writes each without extra packages
DEFAULT_NAME = "curves.png"


def metrics_path(run: str) -> str:
    """RUN (a save folder, or a metrics.jsonl) -> the metrics file; ConfigError naming what to pass otherwise."""
    if storage.is_remote(run):
        raise ConfigError(
            f"{run}: a run saved to a bucket keeps its {METRICS_FILE} on the machine that trained it, under "
            f"runs/RUN_NAME/ (beside train.log); pass that folder, e.g. hbpe plot runs/RUN_NAME"
        )
    path = run if os.path.isfile(run) else os.path.join(run, METRICS_FILE)
    if not os.path.isfile(path):
        raise ConfigError(
            f"{run}: no {METRICS_FILE} there; pass a save folder of `hbpe train` (runs trained before hbpe "
            f"wrote {METRICS_FILE} have only train.log and TensorBoard files)"
        )
    return path


def output_path(out: str | None, metrics: str) -> tuple[str, str]:
    """(where the plot goes, its format): `out`, its DEFAULT_NAME when it is a folder, by default DEFAULT_NAME beside
    the metrics file. ConfigError for a name that is no image format (a run's hbpe_run.json, checkpoints, log and
    metrics are none) or a link, through which a run's file could be overwritten."""
    given = out is not None
    out = os.path.join(os.path.dirname(metrics), DEFAULT_NAME) if out is None else out
    _refuse_a_folder_that_is_not_there(out)
    if os.path.isdir(out):
        out = os.path.join(out, DEFAULT_NAME)
    what = f"--out {out}" if given else out
    if os.path.isdir(out):  # FOLDER/curves.png is itself a folder
        raise ConfigError(
            f"{what} is a folder: move it away or pass an image file path such as "
            f"{os.path.join(os.path.dirname(out), 'plot.png')}"
        )
    suffix = os.path.splitext(out)[1]
    if suffix.lower().lstrip(".") not in IMAGE_FORMATS:
        raise ConfigError(
            f"{what}: {suffix or 'no suffix'} is not an image format hbpe plot writes; choose a file ending in "
            f"{', '.join('.' + f for f in IMAGE_FORMATS[:-1])} or .{IMAGE_FORMATS[-1]} (or a folder, for its {DEFAULT_NAME})"
        )
    real = os.path.realpath(out)
    if os.path.islink(out) or real == os.path.realpath(metrics):
        why = f"is a link to {real}" if os.path.islink(out) else "is the metrics file to plot"
        raise ConfigError(
            f"{what} {why}: hbpe plot writes neither through a link nor over its input, so as not to overwrite a "
            "run's files; pass another --out"
        )
    return out, suffix.lower().lstrip(".")


def _refuse_a_folder_that_is_not_there(out: str) -> None:
    """An --out ending in a separator names a folder: say so, rather than that it has no image suffix."""
    if not out.endswith((os.sep, "/")) or os.path.isdir(out):
        return
    bare = out.rstrip("/" + os.sep)
    if os.path.exists(bare):
        raise ConfigError(
            f"--out {out} names a folder, but {bare} is a file: pass an image file path such as "
            f"{os.path.join(os.path.dirname(bare), 'plot.png')}, or a folder for its {DEFAULT_NAME}"
        )
    raise ConfigError(
        f"--out {out} names a folder that does not exist: pass an image file path such as "
        f"{os.path.join(out, 'plot.png')} (its folder is made), or an existing folder for its {DEFAULT_NAME}"
    )


def skipped_text(skipped: dict[str, int], *, where: str = "") -> str:
    """'183 lines of WHERE (value out of range: 183)' for the `skipped` of `read_metrics`."""
    of = f" of {where}" if where else ""
    return f"{sum(skipped.values())} lines{of} ({', '.join(f'{why}: {n}' for why, n in skipped.items())})"


def plot_run(run: str, *, out: str | None = None, x: str = "batches") -> dict[str, Any]:
    """Draw loss (train loss per symbol, eval loss per symbol) and BPB (train, eval) against `x` -> a summary.

    `out` (a .png, .svg or .pdf, or a folder) defaults to `curves.png` beside the metrics file. Damaged lines of
    the metrics file are skipped and counted in the summary's `skipped_lines` ({why: lines}).
    """
    if x not in X_AXES:
        raise ConfigError(f"x={x!r}: choose one of {', '.join(X_AXES)}; e.g. --x bytes")
    path = metrics_path(run)
    out, fmt = output_path(out, path)
    data = read_metrics(path)
    if not data["train"] and not data["eval"]:
        if data["skipped"]:
            raise ConfigError(
                f"{path} holds no usable train or eval line: skipped {skipped_text(data['skipped'])}, so it is "
                "damaged or not a metrics.jsonl of hbpe train; pass the run's own (a save folder keeps it beside train.log)"
            )
        raise ConfigError(f"{path} holds no train or eval lines yet; plot it once the run has trained a batch")
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    key, label = X_AXES[x]
    fig, (ax_loss, ax_bpb) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, series, title in (
        (ax_loss, ((TRAIN_LOSS, "train", data["train"]), (EVAL_LOSS, "eval", data["eval"])), "loss per symbol (nats)"),
        (ax_bpb, ((TRAIN_BPB, "train", data["train"]), (EVAL_BPB, "eval", data["eval"])), "bits per byte"),
    ):
        for metric, name, recs in series:
            pts = [(r[key], r[metric]) for r in recs if metric in r and key in r]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, "o-" if name == "eval" else "-", label=name, markersize=4)
        ax.set_xlabel(label)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.suptitle(os.path.basename(os.path.dirname(os.path.abspath(path))) or path)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, format=fmt, dpi=100)
    plt.close(fig)
    last_eval = data["eval"][-1] if data["eval"] else {}
    return {
        "metrics": path,
        "out": out,
        "x": x,
        "train_points": len(data["train"]),
        "eval_points": len(data["eval"]),
        "last_batch": max((r["batch"] for r in data["train"] + data["eval"]), default=0),
        "final_eval_bpb": last_eval.get(EVAL_BPB),
        "skipped_lines": data["skipped"],
    }
