"""Every `hbpe train` writes metrics.jsonl (training/train/metrics_file.py), a resumed run appends to it, and
`hbpe plot` draws its curves: the values are the ones the run reported."""

from __future__ import annotations

import itertools
import json

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.training.train.metrics_file import read_metrics
from hbpe.training.train.trainer import build_run
from tests.helpers import train_cfg


def _train(sample_shards, folder, batches: int, *extra: str) -> dict:
    train_dir, eval_dir = sample_shards
    args = ["train", "tiny", f"data.train={train_dir}", f"data.eval={eval_dir}", f"save_folder={folder}"]
    args += [f"max_duration={batches}ba", "eval_interval=2ba", "save_interval=2ba", "eval_subset_num_batches=2"]
    args += ["global_batch_size=4"]
    r = CliRunner().invoke(main, [*args, "console=false", *extra, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _loader_target_bytes(sample_shards, folder, batches: int) -> list[int]:
    """Each of the first `batches` training batches' target bytes (the text they predict), from the loader of a
    run built as _train builds them, never trained."""
    run = build_run(train_cfg(sample_shards, folder, "global_batch_size=4", f"max_duration={batches}ba"))
    try:
        out = []
        for batch in run.trainer.state.train_dataloader:
            out.append(int(batch["target_bytes"].sum()))
            if len(out) == batches:
                return out
        raise AssertionError(f"the loader ended after {len(out)} batches")
    finally:
        run.close()


@pytest.fixture(scope="module")
def metrics_run(sample_shards, tmp_path_factory):
    """A 4-batch run (evaluated at 2 and 4), then resumed to 6 batches: the lines of both sessions (batches of 4)."""
    folder = tmp_path_factory.mktemp("metrics") / "run"
    first = _train(sample_shards, folder, 4)
    lines_first = (folder / "metrics.jsonl").read_text().splitlines()
    second = _train(sample_shards, folder, 6, "autoresume=true", "optim.allow_new_duration=true")  # a longer cosine
    return folder, first, second, lines_first


def test_metrics_file_holds_every_batch_and_eval_as_reported(metrics_run, sample_shards):
    folder, first, second, lines_first = metrics_run
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records[: len(lines_first)]] == [json.loads(x)["kind"] for x in lines_first]
    # the resumed session appends after a start line at its checkpoint; nothing of the first is lost
    starts = [r for r in records if r["kind"] == "start"]
    assert [s["batch"] for s in starts] == [0, 4]
    assert records.index(starts[1]) == len(lines_first)
    data = read_metrics(str(folder / "metrics.jsonl"))
    assert [r["batch"] for r in data["train"]] == [1, 2, 3, 4, 5, 6]
    assert [r["batch"] for r in data["eval"]] == [2, 4, 6]
    for r in data["train"]:
        assert r["samples"] == 4 * r["batch"]  # global batch 4
        assert r["loss/train/total"] > 0 and r["metrics/train/BitsPerByte"] > 0 and "lr-AdamW/group0" in r
    bytes_seen = [r["bytes"] for r in data["train"]]
    assert all(b > a > 0 for a, b in zip(bytes_seen, bytes_seen[1:]))  # counted on across the resumption
    # exactly the target bytes of the batches trained, as the run's loader yields them (a fresh run of the same
    # data, seed and batch: the resumed session goes on through the same sample order)
    per_batch = _loader_target_bytes(sample_shards, folder.parent / "again", 6)
    assert bytes_seen == list(itertools.accumulate(per_batch))
    # the numbers `hbpe train --json` reported: the final eval of each session
    assert data["eval"][1]["metrics/eval/BitsPerByte"] == pytest.approx(first["eval"]["BitsPerByte"], rel=1e-6)
    assert data["eval"][2]["metrics/eval/BitsPerByte"] == pytest.approx(second["eval"]["BitsPerByte"], rel=1e-6)
    assert data["eval"][2]["metrics/eval/LossPerSymbol"] == pytest.approx(second["eval"]["LossPerSymbol"], rel=1e-6)
    assert "throughput/bytes_per_sec" in data["train"][-1]  # hbpe's meter, from the second batch on


def test_plot_writes_the_curves(metrics_run, tmp_path):
    folder, _, second, _ = metrics_run
    out = tmp_path / "c.png"
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(folder), "--out", str(out), "--x", "bytes", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert (summary["train_points"], summary["eval_points"], summary["last_batch"]) == (6, 3, 6)
    assert summary["final_eval_bpb"] == pytest.approx(second["eval"]["BitsPerByte"], rel=1e-6)
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(folder)])  # default: curves.png in the run
    assert r.exit_code == 0 and (folder / "curves.png").stat().st_size > 10_000
    assert r.stdout.startswith(f"wrote {folder / 'curves.png'}: 6 train and 3 eval points to batch 6")


def test_plot_errors(tmp_path):
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(tmp_path)])
    assert r.exit_code == 2 and f"error: {tmp_path}: no metrics.jsonl there" in r.output
    r = CliRunner().invoke(main, ["plot", "--checkpoint", "s3://bucket/runs/x"])
    assert r.exit_code == 2 and "keeps its metrics.jsonl on the machine that trained it, under runs/RUN_NAME/" in (
        r.output
    )
