"""Seeds: each run of an experiment trained N times, and the noise that shows.

Seed i of N is `seed + i` for both the model's initialisation (`seed`) and streaming's sample
order (`data.shuffle_seed`): every run of one seed reads the same samples, so rows stay at an
equal byte budget within a seed, and the spread over seeds is the noise of init and order
together. With one seed a run's folder is OUT/runs/NAME (the layout of single-seed presets);
with several, OUT/runs/NAME/seed-K.

A difference between two rows is "within noise" when |mean_a - mean_b| < 2 x pooled standard
deviation, sqrt((sd_a^2 + sd_b^2) / 2): about the 95% level for a difference of two
normal means with equal spread.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

NOISE_SDS = 2.0  # a difference under this many pooled standard deviations is called noise


def seed_values(seed: int, seeds: int) -> list[int]:
    """The seeds of an experiment: seed, seed + 1, ..., seed + seeds - 1.

    >>> seed_values(17, 3)
    [17, 18, 19]
    """
    return [seed + i for i in range(seeds)]


def run_folder(out: Path, name: str, seed: int, seeds: int) -> Path:
    """OUT/runs/NAME with one seed; OUT/runs/NAME/seed-K with several."""
    return out / "runs" / name if seeds == 1 else out / "runs" / name / f"seed-{seed}"


def spread(values: list[float]) -> dict[str, Any]:
    """{mean, std, min, max, n, values}; std is the sample standard deviation (None for one value).

    >>> spread([1.0, 3.0])["std"]
    1.4142135623730951
    """
    v = np.asarray(values, dtype=float)
    std = float(v.std(ddof=1)) if len(v) > 1 else None
    return {"mean": float(v.mean()), "std": std, "min": float(v.min()), "max": float(v.max()), "n": len(v),
            "values": [float(x) for x in v]}  # fmt: skip


def pooled_std(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    if a["std"] is None or b["std"] is None:
        return None
    return math.sqrt((a["std"] ** 2 + b["std"] ** 2) / 2)


def within_noise(a: dict[str, Any], b: dict[str, Any]) -> bool | None:
    """Whether two `spread`s differ by less than NOISE_SDS pooled standard deviations (None: one seed, unknown)."""
    sd = pooled_std(a, b)
    return None if sd is None else abs(a["mean"] - b["mean"]) < NOISE_SDS * sd


def show(s: dict[str, Any], digits: int = 4) -> str:
    """'1.2345 ± 0.0123' (or the value alone for one seed)."""
    return f"{s['mean']:.{digits}f}" if s["std"] is None else f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def mean_curve(curves: list[list[dict[str, float]]]) -> list[dict[str, float]]:
    """The seeds' curves point by point (the same batches): every key's mean, and BPB's min, max and std.

    Points are matched by index: every seed evaluates at the same batches; their training bytes
    differ a little (another sample order), so x is their mean too.
    """
    n = min((len(c) for c in curves), default=0)
    out = []
    for j in range(n):
        pts = [c[j] for c in curves]
        keys = set.intersection(*(set(p) for p in pts))
        point = {k: float(np.mean([p[k] for p in pts])) for k in sorted(keys)}
        bpb = [p["bpb"] for p in pts]
        point.update(bpb_min=float(min(bpb)), bpb_max=float(max(bpb)),
                     bpb_std=float(np.std(bpb, ddof=1)) if len(bpb) > 1 else 0.0)  # fmt: skip
        out.append(point)
    return out
