"""Real Composer training on CPU: the loss falls, autoresume is exact, FSDP2 runs on 2 processes."""

from __future__ import annotations

import json
import os

import pytest
import torch
from composer import Callback, Event

from hbpe.training.train.trainer import build_run, train
from tests.helpers import train_cfg


def test_tiny_model_loss_falls(sample_shards, tmp_path):
    from composer.loggers import InMemoryLogger

    mem = InMemoryLogger()
    # 30 batches of 4 (measured: first-5 mean 6.10, last-5 3.80, a fall of 2.31; 40 of 8 fell 2.78), 2 eval batches
    cfg = train_cfg(
        sample_shards,
        tmp_path / "run",
        "max_duration=30ba",
        "eval_interval=30ba",
        "save_interval=30ba",
        "global_batch_size=4",
        "eval_subset_num_batches=2",
    )
    run = build_run(cfg, loggers=[mem])
    run.trainer.fit()
    losses = [float(v) for _, v in mem.data["loss/train/total"]]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > 5.0 and last < first - 1.5, (first, last)
    bpb = float(run.trainer.state.eval_metrics["eval"]["BitsPerByte"].compute())
    assert 0.5 < bpb < 6.0
    run.close()
    assert (tmp_path / "run" / "latest-rank0.pt").exists() and (tmp_path / "run" / "hbpe_run.json").exists()


class _StopAt(Callback):
    def __init__(self, batches: int) -> None:
        self.batches = batches

    def run_event(self, event, state, logger):
        if event == Event.BATCH_START and int(state.timestamp.batch) == self.batches:
            raise KeyboardInterrupt(f"simulated preemption after {self.batches} batches")


def _weights(folder):
    state = torch.load(os.path.join(folder, "latest-rank0.pt"), map_location="cpu", weights_only=False)["state"]
    return state["model"], state["timestamp"]


def test_autoresume_equals_uninterrupted(sample_shards, tmp_path):
    # 2 eval batches, not the 27 of the held-out set: evaluation touches neither weights nor timestamps
    common = ("max_duration=8ba", "eval_interval=8ba", "save_interval=4ba", "autoresume=true", "run_name=resume-test")
    common += ("eval_subset_num_batches=2",)
    train(train_cfg(sample_shards, tmp_path / "full", *common))

    cfg = train_cfg(sample_shards, tmp_path / "cut", *common)
    run = build_run(cfg, callbacks=[_StopAt(5)])
    with pytest.raises(KeyboardInterrupt):
        run.trainer.fit()
    run.close()
    assert (tmp_path / "cut" / "ep0-ba4-rank0.pt").exists() and not (tmp_path / "cut" / "ep0-ba8-rank0.pt").exists()
    resumed = train(cfg)  # autoresume picks up ep0-ba4 and finishes
    assert (resumed["resumed_at_batch"], resumed["batches"]) == (4, 8)
    from hbpe.cli.train import render_train

    assert render_train(resumed).startswith("resumed at batch 4, trained to batch 8 in ")
    # the first session's log is kept beside the resumed session's (Composer's FileLogger truncates)
    first_log, second_log = (tmp_path / "cut" / "train.log.1").read_text(), (tmp_path / "cut" / "train.log").read_text()
    assert "[batch=1]" in first_log and "[batch=1]" not in second_log and "[batch=8]" in second_log

    full_w, full_ts = _weights(tmp_path / "full")
    cut_w, cut_ts = _weights(tmp_path / "cut")
    assert full_ts["Timestamp"]["batch"] == cut_ts["Timestamp"]["batch"] == 8
    assert full_w.keys() == cut_w.keys()
    for k in full_w:
        torch.testing.assert_close(cut_w[k], full_w[k], rtol=0, atol=0, msg=k)


def test_reuse_shards_with_another_patch_size_and_the_bpe_baseline(sample_shards, tmp_path):
    r = train(
        train_cfg(
            sample_shards,
            tmp_path / "s6",
            "max_duration=3ba",
            "eval_interval=3ba",
            "save_interval=3ba",
            "eval_subset_num_batches=2",  # a held-out BPB is all that is asked of it, not all 27 batches
            "data.max_patch_size=6",
            "data.mode=minimal",
        )
    )
    assert r["max_patch_size"] == 6 and r["vocab_size"] > 470  # S=6 needs more merges than S=10
    derived = r["derived_tokenizer"]  # the retrained second stage is in the run's info, not silent
    assert {k: derived[k] for k in ("from_max_patch_size", "from_mode", "max_patch_size", "mode")} == {
        "from_max_patch_size": 10,
        "from_mode": "full",
        "max_patch_size": 6,
        "mode": "minimal",
    }
    assert derived["vocab_size"] == r["vocab_size"] == 259 + derived["merges"]  # bytes, EOP, PAD, EOD, merges
    run_file = json.loads((tmp_path / "s6" / "hbpe_run.json").read_text())
    assert run_file["derived_tokenizer"]["max_patch_size"] == 6  # and in the run folder, beside the checkpoints
    assert r["eval"]["BitsPerByte"] > 0
    from hbpe.training.inference.evaluate import evaluate

    ev = evaluate(str(tmp_path / "s6"), str(sample_shards[1]), max_batches=2)
    assert ev["max_patch_size"] == 6 and ev["symbols_per_patch"] > 4.5  # minimal mode: long patches
    b = train(
        train_cfg(
            sample_shards,
            tmp_path / "bpe",
            "max_duration=3ba",
            "eval_interval=3ba",
            "save_interval=3ba",
            "eval_subset_num_batches=2",
            "model.io=bpe",
        )
    )
    assert b["eval"]["BitsPerByte"] > 0 and b["params"] > 50257 * 64


def test_deriving_another_patch_size_is_said_not_silent(sample_shards, tmp_path, caplog):
    import logging

    from hbpe.training.train.calibration import resolve_tokenizer

    with caplog.at_level(logging.INFO, logger="hbpe.training.train.trainer"):
        tok, derived = resolve_tokenizer(train_cfg(sample_shards, tmp_path / "a"))
        assert derived is None and tok.max_patch_size == 10 and not caplog.records  # the shards' own, as it is
        same, derived = resolve_tokenizer(train_cfg(sample_shards, tmp_path / "b", "data.max_patch_size=10"))
        assert derived is None and same.fingerprint == tok.fingerprint and not caplog.records
        s8, derived = resolve_tokenizer(train_cfg(sample_shards, tmp_path / "c", "data.max_patch_size=8"))
    assert s8.max_patch_size == 8 and s8.mode == "full"
    assert derived == {
        "from_max_patch_size": 10,
        "from_mode": "full",
        "max_patch_size": 8,
        "mode": "full",
        "merges": len(s8.merges),
        "vocab_size": s8.vocab_size,
        "seconds": derived["seconds"],
    }
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert f"derived tokenizer: S=10 full -> S=8 full ({len(s8.merges)} second-stage merges, V'={s8.vocab_size}" in (
        record.getMessage()
    )


def test_a_data_tokenizer_of_another_patch_size_is_the_one_decision_of_s_and_is_said(sample_shards, tmp_path, caplog):
    """S is decided once: a data.tokenizer with another S than the shards' re-patches them as data.max_patch_size
    does, so it is reported the same way (it was silent: derived None while the loader cut other patches)."""
    import logging

    from hbpe.pipeline.shards.reader import load_shard_tokenizer
    from hbpe.pipeline.tokenizer import artifact
    from hbpe.training.train.calibration import resolve_tokenizer

    shards_tok = load_shard_tokenizer(sample_shards[0])
    s8 = artifact.with_patch_size(shards_tok, max_patch_size=8, mode="full")
    artifact.save(shards_tok, tmp_path / "own")
    artifact.save(s8, tmp_path / "s8")
    with caplog.at_level(logging.INFO, logger="hbpe.training.train"):
        own, derived = resolve_tokenizer(train_cfg(sample_shards, tmp_path / "a", f"data.tokenizer={tmp_path / 'own'}"))
        assert derived is None and own.fingerprint == shards_tok.fingerprint and not caplog.records  # a copy
        tok, derived = resolve_tokenizer(train_cfg(sample_shards, tmp_path / "b", f"data.tokenizer={tmp_path / 's8'}"))
    assert tok.fingerprint == s8.fingerprint and tok.max_patch_size == 8
    assert derived == {
        "from_max_patch_size": 10,  # the shards', not data.tokenizer's
        "from_mode": "full",
        "max_patch_size": 8,
        "mode": "full",
        "merges": len(s8.merges),
        "vocab_size": s8.vocab_size,
        "seconds": 0.0,  # nothing retrained: data.tokenizer is used as it is
    }
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert (
        f"from data.tokenizer={tmp_path / 's8'}; the patches of {sample_shards[0]} are cut again" in record.getMessage()
    )


def test_a_run_that_stopped_before_its_first_checkpoint_does_not_block_a_rerun(sample_shards, tmp_path, caplog):
    """Run files without a checkpoint (the run failed at its first batch) hold nothing to resume or keep."""
    from hbpe.schemas.errors import ConfigError
    from hbpe.training.checkpoint.save_folder import check_save_folder

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "hbpe_run.json").write_text("{}")
    with caplog.at_level("WARNING", logger="hbpe"):
        check_save_folder(train_cfg(sample_shards, folder))
    assert "no checkpoint: replacing that run's files" in caplog.text
    (folder / "ep0-ba2").mkdir()  # a sharded checkpoint's folder counts as a checkpoint too
    with pytest.raises(ConfigError, match=r"already holds a run \(ep0-ba2, hbpe_run.json\)"):
        check_save_folder(train_cfg(sample_shards, folder))


def test_a_save_folder_holding_a_run_is_refused_unless_resumed_or_replaced(sample_shards, tmp_path):
    from hbpe.schemas.errors import ConfigError

    short = ("max_duration=2ba", "eval_interval=2ba", "save_interval=2ba", "eval_subset_num_batches=1")
    first = train(train_cfg(sample_shards, tmp_path / "run", *short))
    with pytest.raises(ConfigError, match=r"already holds a run .*autoresume=true.*save_overwrite=true"):
        build_run(train_cfg(sample_shards, tmp_path / "run", *short))
    again = train(train_cfg(sample_shards, tmp_path / "run", *short, "save_overwrite=true"))
    assert again["batches"] == first["batches"] == 2
    with pytest.raises(ConfigError, match="contradict"):
        build_run(train_cfg(sample_shards, tmp_path / "run", *short, "save_overwrite=true", "autoresume=true"))
