"""Findings of the training-side review: a refused start leaves nothing behind, autoresume and
save_overwrite keep a run folder consistent, shards are never a save folder, and internal errors
a user can cause are one `error:` line."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.errors import ConfigError, HbpeError
from hbpe.training.checkpoint.save_folder import clear_previous_run
from hbpe.training.train.config_io import load_config
from hbpe.training.train.trainer import build_run, train
from tests.helpers import cli_fails as _fails
from tests.helpers import train_cfg as _cfg

SHORT = ("max_duration=2ba", "eval_interval=2ba", "save_interval=2ba", "console=false")


def test_a_refused_start_writes_no_run_files(sample_shards, tmp_path):
    folder = tmp_path / "run"
    bad_ckpt = tmp_path / "not-a-checkpoint.pt"
    bad_ckpt.write_bytes(b"not a pickle")
    refusals = [
        ("fsdp={version: 3}", ConfigError, r"fsdp\.version=3: must be 1 \(FSDP1, GPUs only\) or 2"),
        ("fsdp={version: x}", ConfigError, r"fsdp\.version='x': must be 1"),
        ("fsdp={version: 2, foo: 1}", ConfigError, r"fsdp \(version 2\) does not take \['foo'\]"),
        ("fsdp={sharding_strategy: FULL_SHARD}", ConfigError, "FSDP1 needs GPUs"),
        (f"load_path={bad_ckpt}", HbpeError, str(bad_ckpt)),
    ]
    for override, error, match in refusals:
        with pytest.raises(error, match=match):
            build_run(_cfg(sample_shards, folder, *SHORT, override))
        assert not (folder / "hbpe_run.json").exists() and not (folder / "tokenizer").exists(), override
    # the mistake fixed, the same folder is taken (not "already holds a run")
    assert train(_cfg(sample_shards, folder, *SHORT, "eval_subset_num_batches=1"))["batches"] == 2


def test_autoresume_refuses_another_model_and_a_finished_run(sample_shards, tmp_path):
    folder = tmp_path / "run"
    train(_cfg(sample_shards, folder, *SHORT, "autoresume=true", "eval_subset_num_batches=1"))
    run_file = (folder / "hbpe_run.json").read_bytes()
    with pytest.raises(
        ConfigError, match=r"holds a run with another model or tokenizer \(model\.latent_layers 2 -> 3\)"
    ):
        build_run(_cfg(sample_shards, folder, *SHORT, "autoresume=true", "model.latent_layers=3"))
    with pytest.raises(ConfigError, match=r"model\.max_patches 4096 -> 64; model\.pooling mean -> eop"):
        build_run(_cfg(sample_shards, folder, *SHORT, "autoresume=true", "model.pooling=eop", "model.max_patches=64"))
    with pytest.raises(ConfigError, match=r"is already trained to 2ba \(max_duration=2ba\); raise max_duration above"):
        build_run(_cfg(sample_shards, folder, *SHORT, "autoresume=true"))
    assert (folder / "hbpe_run.json").read_bytes() == run_file  # the old run stays evaluable
    from hbpe.training.inference.evaluate import evaluate

    assert evaluate(str(folder), str(sample_shards[1]), max_batches=1)["bpb"] > 0


def test_shards_are_never_a_save_folder(sample_shards, tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(sample_shards[0], shards)  # a copy: a regression must not damage the session's shards
    before = {p.relative_to(shards): p.read_bytes() for p in shards.rglob("*") if p.is_file()}
    train_dir, eval_dir = str(shards), str(sample_shards[1])
    cases = [
        (shards, r"save_folder .* is the shard directory data\.train="),
        (shards / "run", r"save_folder .* lies inside the shard directory data\.train="),
        (tmp_path, r"save_folder .* contains the shard directory data\.train="),
    ]
    for folder, match in cases:
        cfg = load_config("tiny", [f"data.train={train_dir}", f"data.eval={eval_dir}", f"save_folder={folder}"])
        with pytest.raises(ConfigError, match=match):
            build_run(cfg)
    other = tmp_path / "copied"
    other.mkdir()
    (other / "manifest.json").write_text("{}")
    cfg = load_config("tiny", [f"data.train={sample_shards[0]}", "data.eval=null", f"save_folder={other}"])
    with pytest.raises(ConfigError, match=r"holds a shard directory's files \(manifest\.json\)"):
        build_run(cfg)
    after = {p.relative_to(shards): p.read_bytes() for p in shards.rglob("*") if p.is_file()}
    assert after == before


def test_fewer_samples_than_a_global_batch_is_refused(sample_shards, tmp_path):
    from hbpe.training.data.loader import read_manifest

    n = read_manifest(str(sample_shards[0])).counts.samples
    with pytest.raises(
        ConfigError, match=rf"has {n} samples, fewer than global_batch_size={n + 1} \(per device: {n + 1}"
    ):
        build_run(_cfg(sample_shards, tmp_path / "run", *SHORT, f"global_batch_size={n + 1}"))
    assert not (tmp_path / "run" / "hbpe_run.json").exists()


def test_save_overwrite_removes_the_old_runs_checkpoints_only(sample_shards, tmp_path):
    folder = tmp_path / "run"
    first = ("max_duration=4ba", "eval_interval=4ba", "save_interval=2ba", "console=false", "eval_subset_num_batches=1")
    train(_cfg(sample_shards, folder, *first))
    assert (folder / "ep0-ba4-rank0.pt").exists()
    (folder / "notes.txt").write_text("mine")
    r = train(_cfg(sample_shards, folder, *SHORT, "save_overwrite=true", "eval_subset_num_batches=1"))
    assert r["batches"] == 2
    assert not (folder / "ep0-ba4-rank0.pt").exists()  # the old run's last checkpoint would be read as this run's
    assert (folder / "ep0-ba2-rank0.pt").exists() and (folder / "latest-rank0.pt").resolve().name == "ep0-ba2-rank0.pt"
    assert (folder / "notes.txt").read_text() == "mine" and (folder / "hbpe_run.json").exists()


def test_clear_previous_run_takes_composers_names_and_nothing_else(tmp_path):
    for name in ("ep0-ba60-rank0.pt", "ep1-ba7-rank1.pt", "hbpe_run.json", "ep0-ba60-rank0.pt.bak", "train.log"):
        (tmp_path / name).write_text("x")
    (tmp_path / "latest-rank0.pt").symlink_to("ep0-ba60-rank0.pt")
    (tmp_path / "ep0-ba8").mkdir()
    (tmp_path / "ep0-ba8" / ".metadata").write_text("x")
    (tmp_path / "ep0-ba9").mkdir()  # no .metadata: not a sharded checkpoint, someone else's folder
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "hbpe_tokenizer.json").write_text("{}")
    removed = clear_previous_run(str(tmp_path))
    assert removed == [
        "ep0-ba60-rank0.pt",
        "ep0-ba8",
        "ep1-ba7-rank1.pt",
        "hbpe_run.json",
        "latest-rank0.pt",
        "tokenizer",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep0-ba60-rank0.pt.bak", "ep0-ba9", "train.log"]


@pytest.mark.parametrize(
    "override,message",
    [
        ("seed=-1", "seed=-1: must be in 0..4294967295; e.g. seed=17"),
        ("seed=99999999999", "seed=99999999999: must be in 0..4294967295"),
        ("data.shuffle_seed=-1", "data.shuffle_seed=-1: must be in 0..4294967295"),
        ("max_duration=12sp", "optim.warmup=10ba and max_duration=12sp use different units (ba, sp)"),
        ("max_duration=2000tok", "set optim.warmup in tok (e.g. optim.warmup=0tok, or a fraction of the run"),
        ("max_duration=1iter", "optim.warmup=10ba and max_duration=1iter use different units"),
        ("data.train=ftp://host/x", "data.train=ftp://host/x: unsupported URI scheme ftp://; use a local path or one"),
    ],
)
def test_config_mistakes_that_were_internal_errors(override, message):
    overrides = ["data.train=somewhere", override] if not override.startswith("data.train") else [override]
    _fails(CliRunner().invoke(main, ["train", "tiny", *overrides]), 2, message)


def _warmup_cosine(t: float, warmup: float, total: float, *, lr: float = 3e-3, alpha_f: float = 0.1) -> float:
    """The tiny config's schedule at time t (any one unit): linear warmup from 0, then cosine down to alpha_f * lr."""
    if t < warmup:
        return lr * t / warmup
    return lr * (alpha_f + (1 - alpha_f) * 0.5 * (1 + math.cos(math.pi * (t - warmup) / (total - warmup))))


WARMUP_UNITS = {
    # the default warmup=10ba in a run measured in epochs: 2 epochs of 4 samples are 4 batches of 2, all in warmup
    "epochs": (["max_duration=2ep", "data.epoch_size=4"], 4, lambda batches, samples: _warmup_cosine(batches, 10, 4)),
    # a fraction of the run: Composer takes it in max_duration's unit, whole samples: int(0.1 * 12) = 1
    "fraction": (["max_duration=12sp", "optim.warmup=0.1dur"], 6, lambda batches, samples: _warmup_cosine(samples, 1, 12)),
    "samples": (["max_duration=12sp", "optim.warmup=2sp"], 6, lambda batches, samples: _warmup_cosine(samples, 2, 12)),
}  # fmt: skip


@pytest.mark.parametrize("extra,batches,schedule", WARMUP_UNITS.values(), ids=WARMUP_UNITS.keys())
def test_warmup_units_that_composer_takes_are_kept(sample_shards, tmp_path, extra, batches, schedule):
    """Each config trains for its duration with the learning rate its warmup unit gives, batch by batch (the
    metrics file's lr of batch b is the one its step used: after b - 1 batches, 2 samples each)."""
    from hbpe.training.train.metrics_file import read_metrics

    folder = tmp_path / "run"
    base = ("data.eval=null", "global_batch_size=2", "save_interval=100ba", "console=false")
    assert train(_cfg(sample_shards, folder, *base, *extra))["batches"] == batches
    lrs = [r["lr-AdamW/group0"] for r in read_metrics(str(folder / "metrics.jsonl"))["train"]]
    assert lrs == pytest.approx([schedule(b, 2 * b) for b in range(batches)], rel=1e-9, abs=1e-12)


def test_a_file_uri_is_a_local_path(sample_shards):
    cfg = load_config("tiny", [f"data.train=file://{sample_shards[0]}", f"data.eval=file://{sample_shards[1]}"])
    assert cfg.data.train == str(sample_shards[0]) and cfg.data.eval == str(sample_shards[1])


def test_generate_refuses_temperatures_and_seeds_it_cannot_use(tmp_path):
    from hbpe.training.inference.generate import check_generate_args

    for t in (1e-40, 1e308):
        with pytest.raises(ConfigError, match=r"temperature=.*: must be 0 \(greedy\) or in \[0\.0001, 10000\]"):
            check_generate_args("abc", max_bytes=10, temperature=t)
    check_generate_args("abc", max_bytes=10, temperature=0.0)
    with pytest.raises(ConfigError, match=r"seed=-1: must be an integer in 0\.\.9223372036854775807"):
        check_generate_args("abc", max_bytes=10, temperature=1.0, seed=-1)
    r = CliRunner().invoke(main, ["generate", "--checkpoint", str(tmp_path), "--prompt", "a", "--temperature", "1e-40"])
    _fails(r, 2, "temperature=1e-40: must be 0 (greedy) or in [0.0001, 10000]")
    r = CliRunner().invoke(main, ["generate", "--checkpoint", str(tmp_path), "--prompt", "a", "--seed", "9" * 20])
    assert r.exit_code == 2 and "Invalid value for '--seed'" in r.output and "Traceback" not in r.output


def test_launch_prints_one_line_per_failure(sample_shards, tmp_path, capsys, monkeypatch):
    from hbpe.training.train.launch import main as launch_main

    monkeypatch.delenv("HBPE_DEBUG", raising=False)
    train_dir, eval_dir = sample_shards
    base = ["tiny", f"data.train={train_dir}", f"data.eval={eval_dir}", *SHORT]
    with pytest.raises(SystemExit) as e:
        launch_main([*base, f"save_folder={tmp_path / 'a'}", "seed=-1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: seed=-1: must be in 0..4294967295; e.g. seed=17"]
    # a file where the log's folder goes (in the save folder, where the log goes): an OS error on a path the user
    # gave, one line, exit 2
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "afile").write_text("x")
    with pytest.raises(SystemExit) as e:
        launch_main([*base, f"save_folder={tmp_path / 'b'}", "log_file=afile/train.log"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {tmp_path / 'b' / 'afile'}: File exists (a file where a directory is needed?); pass another path"
    ]
    # a failure hbpe does not check for (Composer's own ValueError): the CLI's internal-error line, exit 1
    with pytest.raises(SystemExit) as e:
        launch_main([*base, f"save_folder={tmp_path / 'c'}", "fsdp={version: 2, state_dict_type: bogus}"])
    assert e.value.code == 1
    err = [
        ln for ln in capsys.readouterr().err.strip().splitlines() if "Warning" not in ln and "warnings.warn" not in ln
    ]
    assert err == [
        'error: internal error: ValueError: fsdp_state_dict_type must be one of [None, "full", "sharded"], but '
        "got bogus (rerun with HBPE_DEBUG=1 for the traceback; please report it)"
    ], err
    # a success under Composer's launcher run by hand (`composer -n N -m hbpe.training.train.launch`, README):
    # rank 0 prints the result on one `HBPE_RESULT {json}` line; under `hbpe train --nproc N` it goes to a file
    monkeypatch.delenv("HBPE_RESULT_FILE", raising=False)
    launch_main([*base, f"save_folder={tmp_path / 'd'}", "eval_subset_num_batches=1"])
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("HBPE_RESULT ")]
    assert json.loads(line.removeprefix("HBPE_RESULT "))["batches"] == 2
    result_file = tmp_path / "result.json"
    monkeypatch.setenv("HBPE_RESULT_FILE", str(result_file))
    launch_main([*base, f"save_folder={tmp_path / 'e'}", "eval_subset_num_batches=1"])
    assert "HBPE_RESULT" not in capsys.readouterr().out
    assert json.loads(result_file.read_text())["save_folder"] == str(tmp_path / "e")
