"""The crossover fit (issue 18, section 4) on synthetic curves with a known slope and crossover."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hbpe.experiments.crossover import analyse_pair, fieller, fit_gap, gap_points, t975

BATCHES = 2000
POINTS = [100 * (j + 1) for j in range(20)]  # 20 curve points
BYTES_PER_BATCH = 4500.0  # 9 MB over the run


def _curve(bpb_of_log10_bytes, *, cost_per_byte: float = 1.0, noise: float = 0.0, rng=None) -> list[dict]:
    out = []
    for b in POINTS:
        nbytes = b * BYTES_PER_BATCH
        bpb = bpb_of_log10_bytes(math.log10(nbytes)) + (rng.normal(0, noise) if noise else 0.0)
        out.append({"batch": b, "train_bytes": nbytes, "train_flops_paper": nbytes * cost_per_byte,
                    "train_flops_executed": nbytes * cost_per_byte, "bpb": bpb})  # fmt: skip
    return out


def test_a_straight_gap_gives_its_slope_and_crossover():
    # BPE flat at 1.5; BPE-patch 0.3 above at 10^6 bytes, closing by 0.2 per decade: crossing at 10^7.5 bytes
    bpe = _curve(lambda x: 1.5)
    patch = _curve(lambda x: 1.5 + 0.3 - 0.2 * (x - 6.0))
    pts = gap_points(bpe, patch, "train_bytes")
    assert len(pts) == 20 and pts[0]["delta"] == pytest.approx(0.3 - 0.2 * (math.log10(450_000) - 6))
    fit = fit_gap([pts], batches=BATCHES)
    assert fit["points_used"] == [16]  # batches 500..2000: after the first 20% (400 batches)
    assert fit["slope"] == pytest.approx(-0.2)
    assert fit["crossover_log10"] == pytest.approx(7.5)
    assert fit["verdict"] == "closes"


def test_seeds_give_the_interval_and_it_covers_the_truth():
    rng = np.random.default_rng(0)
    seeds = []
    for _ in range(5):
        slope = -0.2 + rng.normal(0, 0.02)  # each seed's own trend
        bpe = _curve(lambda x: 1.5, noise=0.005, rng=rng)
        patch = _curve(lambda x, s=slope: 1.8 + s * (x - 6.0), noise=0.005, rng=rng)
        seeds.append(gap_points(bpe, patch, "train_bytes"))
    fit = fit_gap(seeds, batches=BATCHES)
    assert "over 5 seeds (t, 4 df)" in fit["fit"]["interval_over"]
    lo, hi = fit["slope_ci95"]
    assert lo < -0.2 < hi < 0
    clo, chi = fit["crossover_ci95_log10"]
    assert clo < fit["crossover_log10"] < chi and clo < 7.5 < chi
    assert fit["verdict"] == "closes"


def test_a_flat_or_widening_gap_does_not_close():
    rng = np.random.default_rng(1)
    flat = [
        gap_points(_curve(lambda x: 1.5), _curve(lambda x: 1.8, noise=0.02, rng=rng), "train_bytes") for _ in range(3)
    ]
    fit = fit_gap(flat, batches=BATCHES)
    assert fit["slope_ci95"][0] < 0 < fit["slope_ci95"][1]
    assert fit["verdict"].startswith("does not close")
    assert fit["crossover_ci95_log10"][1] is None or fit["crossover_log10"] is None  # unbounded, or no crossing
    widening = gap_points(_curve(lambda x: 1.5), _curve(lambda x: 1.8 + 0.1 * (x - 6)), "train_bytes")
    fit = fit_gap([widening], batches=BATCHES)
    assert fit["crossover_log10"] is None and fit["verdict"] == "does not close: the gap widens"


def test_equal_compute_interpolates_the_cheaper_curve():
    # BPE-patch costs half per byte: at equal compute it has seen twice the bytes of BPE
    bpe = [{**p, "seed": 17} for p in _curve(lambda x: 1.5 - 0.1 * (x - 6))]
    patch = _curve(lambda x: 1.8 - 0.3 * (x - 6), cost_per_byte=0.5)
    result = analyse_pair(
        [{"name": "bpe", "seed": 17, "curve": bpe}],
        [{"name": "bpe-patch", "seed": 17, "curve": patch}],
        batches=BATCHES,
    )
    at_c = result["executed"]["curve"]
    # at BPE's compute C (BPE-patch's curve ends at half of BPE's): BPE read C bytes, BPE-patch 2C
    assert len(at_c) == 19  # BPE-patch's first point (at half BPE's first compute) lies before BPE's curve
    for p in at_c:
        x = p["x"]  # log10 C
        expect = (1.8 - 0.3 * (x + math.log10(2) - 6)) - (1.5 - 0.1 * (x - 6))
        assert p["delta"] == pytest.approx(expect, abs=0.01)  # BPE interpolated linearly between its points
    assert result["bytes"]["slope"] == pytest.approx(-0.2)


def test_fieller_and_t_quantiles():
    assert t975(1) == 12.706 and t975(30) == 2.042 and t975(1000) == pytest.approx(1.962, abs=1e-3)
    # a significant slope: a finite interval around -m/b
    lo, hi = fieller(m=0.3, b=-0.2, se_m=0.01, se_b=0.02, t=2.0)
    assert lo < 1.5 < hi
    # a slope whose interval holds 0: the far end is unbounded
    assert fieller(m=0.3, b=-0.02, se_m=0.01, se_b=0.02, t=2.0)[1] is None
