"""The crossover fit (issue 18, section 4) on synthetic curves with a known slope and crossover."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hbpe.experiments.crossover import analyse_pair, factor_points, fieller, fit_gap, gap_points, t975

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


# Student's t at 0.975 from a printed table (not crossover.py's): the intervals below are computed by hand from them
T975_TABLE = {1: 12.706, 2: 4.303, 4: 2.776, 14: 2.145}


def _gap_by_hand(bpe: list[dict], patch: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(log10 bytes, BPB_patch - BPB_bpe) at the points past the first 20% of training (both curves share their
    points: the same bytes at each batch)."""
    kept = [(math.log10(p["train_bytes"]), p["bpb"] - q["bpb"]) for q, p in zip(bpe, patch) if p["batch"] > 400]
    x, y = np.array(kept).T
    return x, y


def _slope_by_hand(bpe: list[dict], patch: list[dict]) -> float:
    return float(np.polyfit(*_gap_by_hand(bpe, patch), 1)[0])


def test_seeds_give_the_interval_and_it_covers_the_truth():
    rng = np.random.default_rng(0)
    seeds, slopes = [], []
    for _ in range(5):
        slope = -0.2 + rng.normal(0, 0.02)  # each seed's own trend
        bpe = _curve(lambda x: 1.5, noise=0.005, rng=rng)
        patch = _curve(lambda x, s=slope: 1.8 + s * (x - 6.0), noise=0.005, rng=rng)
        seeds.append(gap_points(bpe, patch, "train_bytes"))
        slopes.append(_slope_by_hand(bpe, patch))
    fit = fit_gap(seeds, batches=BATCHES)
    assert "over 5 seeds (t, 4 df)" in fit["fit"]["interval_over"]
    lo, hi = fit["slope_ci95"]
    assert lo < -0.2 < hi < 0
    # the interval by hand: the seeds' mean slope +- t(4 df) x their standard error (a t of 5 df is 7% narrower)
    mean, se = np.mean(slopes), np.std(slopes, ddof=1) / math.sqrt(5)
    assert fit["slope"] == pytest.approx(mean, rel=1e-9)
    assert [lo, hi] == pytest.approx([mean - T975_TABLE[4] * se, mean + T975_TABLE[4] * se], rel=1e-9)
    clo, chi = fit["crossover_ci95_log10"]
    assert clo < fit["crossover_log10"] < chi and clo < 7.5 < chi
    assert fit["verdict"] == "closes"


def test_one_seed_gives_the_interval_of_its_points():
    """With one seed the slope's standard error is least squares' own, with t of points - 2 degrees of freedom."""
    rng = np.random.default_rng(3)
    bpe = _curve(lambda x: 1.5, noise=0.01, rng=rng)
    patch = _curve(lambda x: 1.8 - 0.2 * (x - 6.0), noise=0.01, rng=rng)
    fit = fit_gap([gap_points(bpe, patch, "train_bytes")], batches=BATCHES)
    x, y = _gap_by_hand(bpe, patch)
    slope, intercept = np.polyfit(x, y, 1)
    residuals = y - (intercept + slope * x)
    se = math.sqrt((residuals**2).sum() / (len(x) - 2) / ((x - x.mean()) ** 2).sum())
    assert len(x) == 16 and "over 16 points of one seed (t, 14 df" in fit["fit"]["interval_over"]
    assert fit["slope_ci95"] == pytest.approx([slope - T975_TABLE[14] * se, slope + T975_TABLE[14] * se], rel=1e-9)


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


def test_the_fit_cuts_each_curve_by_its_own_batches():
    """Issue 29: against compute the fit cut the batches of the curve that ends first (BPE), so BPE-patch, at 3x
    the FLOPs per byte, was fitted over its own first 7% to 20% of training: its steep start."""
    batch_of = {p: p for p in POINTS}

    def patch(cost_per_byte: float) -> list[dict]:
        out = []
        for p in _curve(lambda x: 1.8 - 0.1 * (x - 6)):
            steep = 1.0 * max(0.0, (400 - batch_of[p["batch"]]) / 400)  # falls steeply over its first 20%
            flops = p["train_bytes"] * cost_per_byte
            out.append({**p, "bpb": p["bpb"] + steep, "train_flops_executed": flops, "train_flops_paper": flops})
        return out

    bpe = _curve(lambda x: 1.5 - 0.1 * (x - 6))  # 1 FLOP per byte
    result = analyse_pair(
        [{"name": "bpe", "seed": 17, "curve": bpe}],
        [{"name": "bpe-patch", "seed": 17, "curve": patch(3.0)}],
        batches=BATCHES,
    )
    ex = result["executed"]
    # BPE's points at F FLOPs (batch F / 4500) meet BPE-patch at batch F / 13500: both past 400 from BPE's 1300 on
    assert ex["points_used"] == [8]
    # with BPE-patch 3x the cost, at equal compute it has read a third of the bytes: Delta = 0.3 + 0.1 log10 3,
    # flat (up to the interpolation, linear in FLOPs between points of a curve linear in their log)
    assert ex["slope"] == pytest.approx(0.0, abs=0.002)
    assert ex["gap_at_x0"] == pytest.approx(0.3 + 0.1 * math.log10(3), abs=0.002)
    assert result["bytes"]["points_used"] == [16]  # equal bytes: the same batches on both curves


def test_the_data_and_compute_factors_are_recovered_from_shifted_power_laws():
    """BPE-patch's curve is BPE's at a quarter of the bytes: BPB_b(B) = BPB_a(B / 4), so k = 1/4 everywhere BPE's
    curve reaches it; at 2.5x the FLOPs per byte the compute factor is 1 / (4 x 2.5) = 0.1."""

    def law(log10_bytes: float) -> float:
        return 1.2 + 40.0 * (10**log10_bytes) ** -0.3

    seeds = []
    for jitter in (0.98, 1.0, 1.02):  # seeds with a slightly different shift: the interval covers their spread
        bpe = _curve(law)
        patch = _curve(lambda x, j=jitter: law(x - math.log10(4 * j)), cost_per_byte=2.5)
        seeds.append(({"name": "bpe", "seed": len(seeds), "curve": bpe},
                      {"name": "bpe-patch", "seed": len(seeds), "curve": patch}))  # fmt: skip
    result = analyse_pair([a for a, _ in seeds], [b for _, b in seeds], batches=BATCHES)
    data = result["bytes"]["factor"]
    # BPE-patch's first 4 points lie above BPE's first point (BPE reached them before its first evaluation)
    assert [p["k"] is None for p in data["curve"]] == [True] * 4 + [False] * 16
    for p in data["curve"][4:]:
        assert p["k"] == pytest.approx(0.25, rel=0.02)  # linear in log bytes between BPE's points (2x apart at first)
        lo, hi = p["k_ci95"]
        assert lo < 0.25 < hi and hi / lo < 1.2
        # by hand: each seed's k is about 1 / (4 x its jitter); the interval is the geometric mean times / over
        # 10^(t(2 df) x the standard error of log10 k) (a t of 3 df would be 26% narrower in log)
        assert p["k_values"] == pytest.approx([1 / (4 * j) for j in (0.98, 1.0, 1.02)], rel=0.02)
        logs = np.log10(p["k_values"])
        half = T975_TABLE[2] * np.std(logs, ddof=1) / math.sqrt(3)
        assert p["k"] == pytest.approx(10 ** np.mean(logs), rel=1e-9)
        assert [lo, hi] == pytest.approx([10 ** (np.mean(logs) - half), 10 ** (np.mean(logs) + half)], rel=1e-9)
    assert data["at_end"]["k"] == pytest.approx(0.25, rel=0.01) and data["at_end"]["batch"] == 2000
    compute = result["executed"]["factor"]["at_end"]
    assert compute["k"] == pytest.approx(0.1, rel=0.01)
    # one seed, BPB below all of BPE's curve: no k, a lower bound (BPE's last bytes over BPE-patch's)
    better = _curve(lambda x: law(x) - 1.0)
    (p,) = [q for q in factor_points(_curve(law), better, "train_bytes") if q["batch"] == 2000]
    assert p["k"] is None and p["k_bound"] == [">=", pytest.approx(1.0)]
