"""k along training (hbpe/experiments/k_along.py): the readout on curves whose k is known, and end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.experiments import k_along
from hbpe.experiments.crossover import factor_points
from hbpe.schemas.errors import ConfigError
from tests.conftest import split_sample

DOC_OF_BLOCK = [0, 0, 1, 2, 2, 3]  # six eval blocks over four documents
BLOCK_BYTES = [400, 420, 380, 450, 410, 390]
DOC_HARDNESS = [0.9, 1.0, 1.1, 1.05]  # each document's BPB relative to the curve's (shared by both runs)
SPEC = {"global_batch_size": 8, "seq_len": 128, "batches": 1000}
PARAMS_B = 10_000


def bpe_bpb(x: float) -> float:
    """BPE's curve: linear in log10 bytes, so crossover.reach's log-linear interpolation between points is exact."""
    return 6.0 - 0.5 * math.log10(x)


def curve(batches: list[int], bytes_per_batch: float, k_of_x) -> list[dict]:
    """Curve points of a run that reaches BPE's BPB at k(x) times its bytes (k_of_x None: BPE itself)."""
    out = []
    for b in batches:
        x = b * bytes_per_batch
        bpb = bpe_bpb(x if k_of_x is None else k_of_x(x) * x)
        nll = [bpb * DOC_HARDNESS[d] * n * math.log(2) for d, n in zip(DOC_OF_BLOCK, BLOCK_BYTES)]
        out.append({"batch": b, "train_bytes": x, "bpb": bpb, "eval_batch_nll": nll,
                    "eval_batch_bytes": list(BLOCK_BYTES)})  # fmt: skip
    return out


def experiment(k_of_x, *, seeds=(17,), extra_runs=(), early=()) -> dict:
    batches = list(range(25, 1001, 25))  # 40 points
    runs = []
    for s in seeds:
        for name, k in (("bpe-x0.5", None), ("bpe-patch-x0.5", k_of_x)):
            points = curve(sorted({*batches, *early}) if k is None else batches, 4000.0, k)  # early: BPE's alone
            runs.append({"name": name, "seed": s, "lr": 0.003, "first_stage": "v4096", "fingerprint": name,
                         "params": {"total": PARAMS_B if k else 15_000}, "curve": points})  # fmt: skip
    runs += list(extra_runs)
    blocks = [[i * 8, 8, d, n] for i, (d, n) in enumerate(zip(DOC_OF_BLOCK, BLOCK_BYTES))]
    return {"spec": SPEC, "runs": runs, "eval_set": {"v4096": {"blocks": blocks, "bytes": sum(BLOCK_BYTES)}}}


def assert_same_k(got: list, want: list) -> None:
    """k point by point: unmeasured (None) at the same points, equal where measured."""
    assert [g is None for g in got] == [w is None for w in want]
    assert [g for g in got if g is not None] == pytest.approx([w for w in want if w is not None], rel=1e-6)


def test_a_constant_data_factor_is_read_as_constant_and_structural():
    a = k_along.analyse([experiment(lambda x: 0.12)])
    ks = [p["k"] for p in a["points"] if p["k"] is not None]
    assert len(ks) >= 30 and ks == pytest.approx([0.12] * len(ks), rel=1e-9)
    assert a["at_tokens_per_param"]["40"]["k"] == pytest.approx(0.12, rel=1e-9)
    assert a["slope"]["value"] == pytest.approx(0.0, abs=1e-9)
    # every document draw moves both runs' BPB by one factor: k's interval is a point
    lo, hi = a["at_tokens_per_param"]["40"]["k_ci95"]
    assert lo == pytest.approx(0.12, rel=1e-6) and hi == pytest.approx(0.12, rel=1e-6)
    assert a["verdict"]["reading"] == "supports a structural penalty at this size"
    # at 5 tokens per parameter (batch 49) BPE reached BPE-patch's BPB at batch 6, before its first point (25)
    assert a["at_tokens_per_param"]["5"]["k"] is None
    early = k_along.analyse([experiment(lambda x: 0.12, early=(2, 4, 8, 16))])  # what early_eval_points add
    assert early["at_tokens_per_param"]["5"]["k"] == pytest.approx(0.12, rel=1e-9)
    assert [p["gap"] for p in early["points"]] == pytest.approx([p["gap"] for p in a["points"]], rel=1e-12)


def test_a_rising_data_factor_gives_its_slope_and_reads_as_under_training():
    # k = 0.4 (x / 4e6) ** 0.25: log10 k on log10 x has slope 0.25 exactly
    a = k_along.analyse([experiment(lambda x: 0.4 * (x / 4e6) ** 0.25)])
    assert a["slope"]["value"] == pytest.approx(0.25, rel=1e-6)
    # 40 tokens per parameter = 40 * 10,000 / 1,024 batches = 390.6 batches = 1.5625e6 bytes
    x40 = 40 * PARAMS_B / (8 * 128) * 4000.0
    assert a["at_tokens_per_param"]["40"]["k"] == pytest.approx(0.4 * (x40 / 4e6) ** 0.25, rel=1e-3)
    assert a["at_tokens_per_param"]["40"]["k"] >= k_along.UNDER_TRAINING_K40  # 0.316
    assert a["verdict"]["trend"] == "rising" and a["verdict"]["reading"] == "supports under-training"


def test_k_matches_crossover_factor_points_and_the_gap_is_per_batch():
    exp = experiment(lambda x: 0.2 * (x / 4e6) ** -0.1)
    a = k_along.analyse([exp])
    ra, rb = exp["runs"]
    want = factor_points(ra["curve"], rb["curve"], "train_bytes")
    assert_same_k([p["k"] for p in a["points"]], [w["k"] for w in want])
    gaps = [q["bpb"] - p["bpb"] for p, q in zip(ra["curve"], rb["curve"])]
    # the points' BPB is recomputed from the per-block sums: the documents' hardness weights it by bytes
    weight = sum(h * n for d, n in zip(DOC_OF_BLOCK, BLOCK_BYTES) for h in [DOC_HARDNESS[d]]) / sum(BLOCK_BYTES)
    assert [p["gap"] for p in a["points"]] == pytest.approx([g * weight for g in gaps], rel=1e-9)
    assert a["slope"]["value"] == pytest.approx(-0.1, rel=1e-6)
    assert a["verdict"]["trend"] == "falling"  # and k(40) = 0.22: above the structural level, so neither reading
    assert a["verdict"]["reading"] == "neither reading's criteria are met"


def test_seeds_give_a_t_interval_and_the_rate_check_compares_at_the_last_common_batch():
    other = {"name": "bpe-patch-x0.5-lr0.01", "seed": 17, "lr": 0.01, "first_stage": "v4096", "fingerprint": "o",
             "params": {"total": PARAMS_B}, "curve": curve(list(range(25, 401, 25)), 4000.0, lambda x: 0.15)}  # fmt: skip
    exps = [experiment(lambda x: 0.1 * (x / 4e6) ** 0.05, seeds=(17,), extra_runs=[other]),
            experiment(lambda x: 0.1 * (x / 4e6) ** 0.15, seeds=(18,))]  # fmt: skip
    a = k_along.analyse(exps)
    assert a["seeds"] == [17, 18]
    assert a["slope"]["per_seed"] == pytest.approx([0.05, 0.15], rel=1e-6)
    # t over two seeds: mean 0.10, sd 0.0707, half-width 12.706 * 0.0707 / sqrt(2) = 0.6353
    lo, hi = a["slope"]["ci95_seeds"]
    assert (lo, hi) == pytest.approx((0.10 - 0.63530, 0.10 + 0.63530), abs=1e-4)
    (check,) = a["rate_check"]
    assert check["batch"] == 400 and check["main"] == "bpe-patch-x0.5"
    assert check["diff"] < 0  # k = 0.15 beats k = 0.1 * (1.6e6 / 4e6) ** 0.05 = 0.0955 at batch 400


def test_points_without_per_block_sums_and_other_eval_sets_are_refused():
    exp = experiment(lambda x: 0.12)
    del exp["runs"][1]["curve"][3]["eval_batch_nll"]
    with pytest.raises(ConfigError, match="per-block NLL"):
        k_along.analyse([exp])
    a, b = experiment(lambda x: 0.12), experiment(lambda x: 0.12, seeds=(18,))
    b["eval_set"]["v4096"]["blocks"][0][2] = 9
    with pytest.raises(ConfigError, match="one eval set"):
        k_along.analyse([a, b])
    with pytest.raises(ConfigError, match="no seed has both"):
        k_along.analyse([experiment(lambda x: 0.12)], b_name="bpe-patch-x1")


NARROW = ["batches=8", "eval_points=4", "eval_batches=3", "final_eval_batches=3", "global_batch_size=2",
          "model.latent_layers=1", "model.encoder_layers=1", "model.decoder_layers=1"]  # fmt: skip


def test_k_along_training_end_to_end_runs_apart_then_read_together(tmp_path):
    """The shipped preset, narrowed: each run trained in its own folder (--only), then the readout of both."""
    train, held = split_sample(tmp_path / "corpus")
    outs = []
    for run in ("bpe-x0.5", "bpe-patch-x0.5"):
        out = tmp_path / run
        args = ["experiment", "k-along-training", *NARROW, "--only", run, "--out", str(out),
                "--train-input", str(train), "--eval-input", str(held), "--json"]  # fmt: skip
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
        (r,) = json.loads(res.stdout)["runs"]
        assert r["name"] == run and len(r["curve"]) == 4
        for p in r["curve"]:  # every point keeps its per-block sums, and they make its BPB
            assert len(p["eval_batch_nll"]) == len(p["eval_batch_bytes"]) == 3
            assert sum(p["eval_batch_nll"]) / sum(p["eval_batch_bytes"]) / math.log(2) == pytest.approx(
                p["bpb"], rel=1e-5
            )
        outs.append(out)
    res = CliRunner().invoke(main, ["experiment", "k-along", *map(str, outs), "--out", str(tmp_path / "k"), "--json"])
    assert res.exit_code == 0, res.output
    analysis = json.loads(res.stdout)
    assert analysis["seeds"] == [17] and len(analysis["points"]) == 4
    runs = [json.loads((o / "results.json").read_text())["runs"][0] for o in outs]
    want = factor_points(runs[0]["curve"], runs[1]["curve"], "train_bytes")
    assert_same_k([p["k"] for p in analysis["points"]], [w["k"] for w in want])
    assert [p["gap"] for p in analysis["points"]] == pytest.approx(
        [q["bpb"] - p["bpb"] for p, q in zip(runs[0]["curve"], runs[1]["curve"])], abs=1e-5
    )
    for name in ("k_along.md", "k_along.json", "k_along.png"):
        assert (tmp_path / "k" / name).stat().st_size > 100
    # a link left where a temporary file goes is replaced, never written through
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / "k" / "k_along.md.partial").symlink_to(victim)
    res = CliRunner().invoke(main, ["experiment", "k-along", *map(str, outs), "--out", str(tmp_path / "k")])
    assert res.exit_code == 0, res.output
    assert victim.read_text() == "keep" and not (tmp_path / "k" / "k_along.md.partial").exists()
    res = CliRunner().invoke(main, ["experiment", "k-along-training", "--only", "bpe-x9", "--out", str(tmp_path / "x")])
    assert res.exit_code != 0 and "not a run of k-along-training" in res.output


def test_interp_log_and_point_sums_by_hand():
    x, y = np.array([1.0, 10.0, 100.0]), np.array([0.1, 0.2, np.nan])
    assert k_along.interp_log(x, y, 10**0.5) == pytest.approx(10 ** (math.log10(0.1) + 0.5 * math.log10(2)))
    assert k_along.interp_log(x, y, 10.0) == pytest.approx(0.2)
    assert k_along.interp_log(x, y, 50.0) is None and k_along.interp_log(x, y, 0.5) is None


def test_early_evaluations_add_curve_points_and_leave_training_unchanged(tmp_path):
    """early_eval_points is left out of a run's fingerprint because evaluating does not change training: held here."""
    train, held = split_sample(tmp_path / "corpus")
    narrow = [*NARROW, "warmup=1", "eval_points=2"]
    finals = {}
    for early in (0, 3):
        args = ["experiment", "k-along-training", *narrow, f"early_eval_points={early}", "--only", "bpe-patch-x0.5",
                "--out", str(tmp_path / f"e{early}"), "--train-input", str(train), "--eval-input", str(held), "--json"]  # fmt: skip
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
        (r,) = json.loads(res.stdout)["runs"]
        finals[early] = r
    assert [p["batch"] for p in finals[0]["curve"]] == [4, 8]
    assert [p["batch"] for p in finals[3]["curve"]] == [1, 2, 3, 4, 8]  # geomspace(1, 4, 4) without 4
    assert finals[3]["curve"][3:] == finals[0]["curve"]  # the same points at 4 and 8, to the bit
    assert finals[3]["bpb"] == finals[0]["bpb"] and finals[3]["fingerprint"] == finals[0]["fingerprint"]


def test_seeds_are_averaged_at_the_batches_every_seed_evaluated():
    """A seed run with early evaluation points holds more points than one run without: matched by batch."""
    law = lambda x: 0.2 * (x / 4e6) ** -0.1  # noqa: E731  (a k that moves: the gap and k differ point to point)
    plain = experiment(law, seeds=(17,))
    early = experiment(law, seeds=(18,))
    extra = curve([5, 10, 15], 4000.0, law)  # BPE-patch's early points, before batch 25
    early["runs"][1]["curve"] = extra + early["runs"][1]["curve"]
    early["runs"][0]["curve"] = curve([1, 2, 5, 10, 15], 4000.0, None) + early["runs"][0]["curve"]
    a = k_along.analyse([plain, early])
    alone = k_along.analyse([plain])
    assert [p["batch"] for p in a["points"]] == [p["batch"] for p in alone["points"]]
    assert [p["gap"] for p in a["points"]] == pytest.approx([p["gap"] for p in alone["points"]], rel=1e-12)
    assert_same_k([p["k"] for p in a["points"]], [p["k"] for p in alone["points"]])


def test_the_k_line_says_where_parity_would_come_or_that_it_would_not():
    from hbpe.experiments.crossover import fit_factor

    def points(law, seed_noise=0.0):
        xs = np.arange(6.0, 7.01, 0.05)  # log10 bytes
        return [{"batch": 100 * (i + 1), "x": float(x), "k": float(law(x) * (1 + seed_noise * (-1) ** i))}
                for i, x in enumerate(xs)]  # fmt: skip

    # log10 k = -1 + 0.5 (x - 6): k = 1 at log10 x = 8, whatever the seeds' small disagreement
    rising = fit_factor([points(lambda x: 10 ** (-1 + 0.5 * (x - 6)), e) for e in (0.01, -0.01)], batches=2100)
    assert rising["slope"] == pytest.approx(0.5, rel=1e-2) and rising["parity_log10"] == pytest.approx(8.0, abs=0.05)
    assert rising["reading"] == "k rises toward 1"
    lo, hi = rising["parity_ci95_log10"]
    assert lo < 8.0 < (hi if hi is not None else math.inf)
    # a constant k: the gap of two shifted curves shrinks, but k's line never reaches 1
    flat = fit_factor([points(lambda x: 0.12, e) for e in (0.02, -0.02)], batches=2100)
    assert flat["parity_log10"] is None and flat["reading"].startswith("k flat")
    falling = fit_factor([points(lambda x: 10 ** (-1 - 0.3 * (x - 6)))] * 2, batches=2100)
    assert falling["slope"] == pytest.approx(-0.3) and falling["reading"].startswith("k falls")
    assert fit_factor([points(lambda x: 0.1)[:2]], batches=2100)["fit"] is None  # too few points
