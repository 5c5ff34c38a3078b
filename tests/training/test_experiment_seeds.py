"""Seeds, the constant schedule and the crossover analysis, end to end on the crossover-mini preset narrowed
(issue 18, sections 1, 2 and 4). Before: an experiment trained each row once with one seed and one sample order,
its curves sat inside a cosine schedule, and its FLOPs assumed an 8,192-byte context."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.experiments.presets import load_spec
from hbpe.schemas.errors import ConfigError
from tests.conftest import split_sample

NARROW = [
    "batches=5",
    "eval_points=5",  # 5 curve points: the fit skips the first 20% of training (batch 1), keeps 4
    "eval_batches=1",
    "final_eval_batches=2",
    "global_batch_size=2",
    "warmup=1",
    "seeds=2",
    "model.latent_layers=1",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "first_stages={v4096: {vocab_size: 600, pattern: gpt2}}",  # a first stage the 20-document sample can fill
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    train, held = split_sample(tmp_path_factory.mktemp("xo-corpus"))
    out = tmp_path_factory.mktemp("xo") / "out"
    args = ["experiment", "crossover-mini", *NARROW, "--out", str(out), "--train-input", str(train)]
    res = CliRunner().invoke(main, [*args, "--eval-input", str(held), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), out


def test_each_row_is_trained_once_per_seed_with_its_own_init_and_sample_order(report):
    rep, out = report
    runs = {(r["name"], r["seed"]): r for r in rep["runs"]}
    assert sorted(runs) == [("bpe", 17), ("bpe", 18), ("bpe-patch", 17), ("bpe-patch", 18)]
    for (name, seed), r in runs.items():
        assert (out / "runs" / name / f"seed-{seed}" / "result.json").is_file()
        assert r["schedule"] == "constant" and len(r["curve"]) == 5
    assert runs["bpe", 17]["bpb"] != runs["bpe", 18]["bpb"]
    assert runs["bpe-patch", 17]["bpb"] != runs["bpe-patch", 18]["bpb"]
    # another seed reads other samples (streaming's shuffle_seed follows it) ...
    first = {k: r["curve"][0]["train_bytes"] for k, r in runs.items()}
    assert first["bpe", 17] != first["bpe", 18]
    # ... and the runs of one seed the same ones: an equal byte budget within a seed
    assert [p["train_bytes"] for p in runs["bpe", 17]["curve"]] == [
        p["train_bytes"] for p in runs["bpe-patch", 17]["curve"]
    ]
    # the rows: mean +- std over the seeds, in results.json and the table
    rows = {r["name"]: r for r in rep["rows"]}
    bpb = rows["bpe"]["bpb"]
    assert bpb["n"] == 2 and bpb["values"] == [runs["bpe", 17]["bpb"], runs["bpe", 18]["bpb"]]
    assert bpb["mean"] == pytest.approx((bpb["values"][0] + bpb["values"][1]) / 2) and bpb["std"] > 0
    table = (out / "table.md").read_text()
    assert f"| {bpb['mean']:.4f} ± {bpb['std']:.4f} |" in table
    assert "2 seeds (17, 18), mean ± std" in table and "constant learning rate" in table
    assert (out / "curve.png").stat().st_size > 1000


def test_spent_compute_is_counted_per_point_and_compared(report):
    rep, out = report
    for r in rep["runs"]:
        pts = r["curve"]
        assert 0 < pts[0]["train_flops_executed"] < pts[-1]["train_flops_executed"] <= r["train_flops_executed"]
        per_byte = r["train_flops_paper"] / r["train_bytes"]
        assert [p["train_flops_paper"] for p in pts] == pytest.approx([p["train_bytes"] * per_byte for p in pts])
        assert r["context_bytes"] == pytest.approx(r["train_bytes"] / (5 * 2))  # bytes per sample as trained
    for key in ("train_flops_paper", "train_flops_executed"):
        eq = rep["equal_compute"][key]
        assert eq["train_flops"] == min(r["curve"][-1][key] for r in rep["runs"])
        assert set(eq["bpb"]) == {"bpe", "bpe-patch"}
    table = (out / "table.md").read_text()
    assert "GFLOPs fwd (paper's convention, 8,192 B)" in table and "training TFLOPs (executed)" in table


def test_the_gap_is_fitted_against_bytes_and_compute(report):
    rep, out = report
    (xo,) = rep["crossover"]
    assert (xo["a"], xo["b"], xo["seeds"]) == ("bpe", "bpe-patch", [17, 18])
    assert xo["bytes"]["curve"] and xo["paper"]["curve"]
    # packed local models: BPE-patch's executed compute now overlaps BPE's (padded, its 5 batches executed more
    # than all 5 of BPE's and there was nothing to fit on), so the executed axis is fitted like the others
    assert xo["executed"]["fit"] is not None and xo["executed"]["curve"]
    b = xo["bytes"]
    assert b["fit_from_batch"] == 1 and b["points_used"] == [4, 4] and "over 2 seeds" in b["fit"]["interval_over"]
    # the slope and its interval by hand from the runs' own curves: each seed's least-squares line through
    # BPB(BPE-patch) - BPB(BPE) against log10 bytes (a seed's two runs read the same bytes) past batch 1, then
    # the seeds' mean slope +- t(1 df) x its standard error (t from a printed table: a t of 2 df is 3x narrower)
    runs = {(r["name"], r["seed"]): r["curve"] for r in rep["runs"]}
    slopes = []
    for seed in (17, 18):
        pts = [(p, q) for p, q in zip(runs["bpe", seed], runs["bpe-patch", seed], strict=True) if p["batch"] > 1]
        assert all(p["train_bytes"] == q["train_bytes"] for p, q in pts)
        x = [math.log10(p["train_bytes"]) for p, _ in pts]
        slopes.append(float(np.polyfit(x, [q["bpb"] - p["bpb"] for p, q in pts], 1)[0]))
    half = 12.706 * abs(slopes[0] - slopes[1]) / 2  # std (ddof 1) of two values / sqrt(2): half their distance
    assert b["slope"] == pytest.approx(sum(slopes) / 2, rel=1e-6, abs=1e-12)
    assert b["slope_ci95"] == pytest.approx([b["slope"] - half, b["slope"] + half], rel=1e-6, abs=1e-12)
    assert "Gap Delta = BPB(BPE-patch" in (out / "table.md").read_text()
    assert (out / "crossover.png").stat().st_size > 1000


def test_the_crossover_plot_needs_a_pair():
    with pytest.raises(ConfigError, match="experiment plots=.*a BPE run .* and a BPE-patch run"):
        load_spec("crossover-mini", ["runs=[{name: a, first_stage: v4096, model: {io: bpe}}]"])
    with pytest.raises(ConfigError, match="experiment schedule='linear': expected one of cosine, constant"):
        load_spec("crossover-mini", ["schedule=linear"])
    with pytest.raises(ConfigError, match="experiment seeds=0: expected an integer"):
        load_spec("crossover-mini", ["seeds=0"])


def test_table3_medium_trains_the_papers_15b_tokens():
    """Before: 13,500 batches of 256 x 2,048 tokens, 7.1B tokens, where the paper's medium models saw 15B."""
    spec = load_spec("table3-medium", train_corpus=("corpus.jsonl",))
    tokens = spec.batches * spec.global_batch_size * spec.seq_len
    assert 15.0e9 <= tokens < 15.001e9
    assert spec.batches // spec.eval_points == 501  # a curve point every ~500 batches, as table1-small
    small = load_spec("table1-small", train_corpus=("corpus.jsonl",))
    assert small.batches * small.global_batch_size * small.seq_len == 13_500 * 524_288  # Table 1's 13.5K steps


def test_every_run_reads_one_eval_set_spread_over_the_held_out_split(report):
    """Issue 29: the final BPB read the first 40 batches of an unshuffled held-out split (its first documents) and
    the curve points its first 4; now one fixed set of blocks spread over the whole split, declared in results.json."""
    rep, out = report
    (e,) = rep["eval_set"].values()  # one first stage
    assert e["samples"] == 2 * 2 and len(e["blocks"]) == 2  # final_eval_batches=2 blocks of global_batch_size=2
    assert e["blocks"][0][0] > 0 and e["blocks"][1][0] > e["held_out"]["samples"] / 2  # not the split's start
    assert e["bytes"] == sum(b[3] for b in e["blocks"]) > 0 and e["documents"] == 2 <= e["held_out"]["documents"]
    for r in rep["runs"]:
        nll, nbytes = r["eval_batch_nll"], r["eval_batch_bytes"]
        assert len(nll) == len(e["blocks"])  # one eval batch per block
        assert sum(nll) / sum(nbytes) / math.log(2) == pytest.approx(r["bpb"], rel=1e-9)
        assert nbytes == rep["runs"][0]["eval_batch_bytes"]  # the same samples for every run and seed
        assert r["train_bytes_per_sec_median"] > 0
    rows = {r["name"]: r for r in rep["rows"]}
    noise = rows["bpe"]["bpb_eval_noise"]
    assert noise["documents"] == 2 and noise["sd"] > 0 and noise["ci95"][0] < rows["bpe"]["bpb"]["mean"]
    assert rep["crossover"][0]["final_gap_eval_noise"]["documents"] == 2
    table = (out / "table.md").read_text()
    assert f"Eval set: 4 held-out samples ({e['bytes'] / 1e3:.1f} KB) in 2 blocks" in table
    assert "curve points read its first 1 blocks (2 samples" in table  # eval_batches=1
    assert f"| {noise['sd']:.4f} (2) |" in table and "Eval sampling (the final evaluations" in table


def test_the_document_bootstrap_pairs_the_runs():
    from hbpe.experiments.eval_noise import bootstrap

    rng = np.random.default_rng(3)
    nbytes = rng.integers(1000, 5000, size=12).astype(float)
    a = (nbytes * rng.uniform(0.8, 1.2, size=12), nbytes)  # documents of unequal difficulty: the BPB varies
    shift = 0.3 * math.log(2)  # b is a + 0.3 bits on every byte of every document
    b = (a[0] + shift * nbytes, nbytes)
    row = bootstrap([a])
    assert row["sd"] > 0.01 and row["documents"] == 12
    assert bootstrap([a], minus=[a])["sd"] == 0
    gap = bootstrap([b], minus=[a])
    assert gap["sd"] < 1e-9 and gap["ci95"] == pytest.approx([0.3, 0.3])  # what both share cancels
    assert bootstrap([a]) == row  # a fixed generator: the same report from the same results
