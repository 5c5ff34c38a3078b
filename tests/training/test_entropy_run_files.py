"""An entropy run keeps the entropy model it was trained with (issue 20): `model.patching.entropy_model` was stored as given
(relative to the directory `hbpe train` ran in), and a run or its export evaluated from another directory silently
used whatever had that name there. Now the run and every export hold a fingerprinted copy, checked on load."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.schemas.train_config import FLAT_PATCHING_KEYS
from hbpe.training.checkpoint.export import export_model
from hbpe.training.checkpoint.export_format import write_export
from hbpe.training.checkpoint.load import load_model
from hbpe.training.checkpoint.names import MODEL_FILE
from hbpe.training.inference.evaluate import evaluate
from tests.conftest import TINY_RUN_BATCHES, copy_run

ENTROPY = "entmodel"  # the byte-level model's save folder, named relative to the working directory


def _train(overrides: list[str]) -> None:
    from hbpe.training.train.config_io import load_config
    from hbpe.training.train.trainer import train

    common = ["console=false", "eval_interval=2ba", "save_interval=2ba", "eval_subset_num_batches=1"]
    train(load_config("tiny", [*common, *overrides]))


@pytest.fixture(scope="module")
def entropy_run(sample_shards, tmp_path_factory) -> tuple[Path, Path, float]:
    """(work dir holding `entmodel`, the entropy run trained there with model.patching.entropy_model=entmodel, its BPB)."""
    train_dir, eval_dir = sample_shards
    root = tmp_path_factory.mktemp("entropy-files")
    work = root / "work"
    work.mkdir()
    data = [f"data.train={train_dir}", f"data.eval={eval_dir}"]
    with contextlib.chdir(work):
        _train([*data, f"save_folder={ENTROPY}", "model.io=bytes", "max_duration=4ba"])
        run = root / "run"
        entropy = [f"model.patching.entropy_model={ENTROPY}", "model.patching.entropy_target_bytes=3"]
        _train([*data, f"save_folder={run}", "model.io=entropy", *entropy, "max_duration=2ba"])
        bpb = evaluate(str(run), str(eval_dir), max_batches=1)["bpb"]
    return work, run, bpb


@pytest.fixture(scope="module")
def decoy(entropy_run, tmp_path_factory) -> Path:
    """Another directory with another byte-level model under the same name `entmodel`."""
    work, _, _ = entropy_run
    model, tok, _ = load_model(str(work / ENTROPY))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    other = tmp_path_factory.mktemp("elsewhere")
    write_export(model, tok, str(other / ENTROPY), source={"test": "decoy"})
    return other


def _bpb(checkpoint: Path, data: Path) -> float:
    r = CliRunner().invoke(main, ["eval", "--checkpoint", str(checkpoint), "--data", str(data), "--max-batches", "1"])
    assert r.exit_code == 0, r.output
    return float(r.stdout.split()[1])  # stdout: the result; the progress line is on stderr


def test_an_entropy_run_and_its_export_give_the_same_bpb_from_another_directory(
    entropy_run, decoy, sample_shards, tmp_path, monkeypatch
):
    """Before: BPB 14.34 instead of 10.08 with another `entmodel` in the working directory, rc 0."""
    work, run, bpb = entropy_run
    export_model(str(run), str(tmp_path / "export"))
    monkeypatch.chdir(decoy)
    assert _bpb(run, sample_shards[1]) == pytest.approx(bpb, abs=5e-5)  # `hbpe eval` prints 4 decimals
    assert _bpb(tmp_path / "export", sample_shards[1]) == pytest.approx(bpb, abs=5e-5)
    assert evaluate(str(run), str(sample_shards[1]), max_batches=1)["bpb"] == bpb
    meta = json.loads((run / "hbpe_run.json").read_text())["model"]["patching"]
    assert meta["entropy_model"] == str((work / ENTROPY).resolve())  # stored resolved
    assert len(meta["entropy_model_sha256"]) == 64
    assert (run / "entropy_model" / MODEL_FILE).is_file()  # the run's own copy
    info = json.loads((tmp_path / "export" / MODEL_FILE).read_text())
    assert info["model"]["patching"]["entropy_model_sha256"] == meta["entropy_model_sha256"]
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == [
        "entropy_model",
        MODEL_FILE,
        "model.safetensors",
        "tokenizer",
    ]
    (work / ENTROPY).rename(tmp_path / "moved")  # the original is gone: the run and the export need only their copy
    try:
        assert evaluate(str(tmp_path / "export"), str(sample_shards[1]), max_batches=1)["bpb"] == bpb
        assert evaluate(str(run), str(sample_shards[1]), max_batches=1)["bpb"] == bpb
        export_model(str(tmp_path / "export"), str(tmp_path / "export"), overwrite=True)  # an export of an export
        assert evaluate(str(tmp_path / "export"), str(sample_shards[1]), max_batches=1)["bpb"] == bpb
    finally:
        (tmp_path / "moved").rename(work / ENTROPY)


def test_a_replaced_or_missing_copy_is_refused_naming_the_runs_entropy_model(entropy_run, decoy, tmp_path):
    work, run, _ = entropy_run
    copy = copy_run(run, tmp_path / "run")
    shutil.rmtree(copy / "entropy_model")
    shutil.copytree(decoy / ENTROPY, copy / "entropy_model")
    with pytest.raises(ArtifactError, match=r"entropy_model is not the entropy model .*hbpe_run.json was trained with"):
        load_model(str(copy))
    shutil.rmtree(copy / "entropy_model")
    where = str((work / ENTROPY).resolve())
    with pytest.raises(
        ArtifactError,
        match=rf"hbpe_run.json: the run's entropy model \(model.patching.entropy_model={where}\) was copied into "
        rf"{copy / 'entropy_model'} when it was trained, and .* is missing; restore entropy_model/ from a copy",
    ):
        load_model(str(copy))


def _as_older_hbpe(run: Path, dest: Path) -> Path:
    """The run as an hbpe before this fix wrote it: the path as given, no fingerprint, no copy (and the patching
    settings as flat model keys, as hbpe wrote them then)."""
    copy = copy_run(run, dest)
    shutil.rmtree(copy / "entropy_model", ignore_errors=True)
    meta = json.loads((copy / "hbpe_run.json").read_text())
    patching = meta["model"].pop("patching")
    meta["model"].update({flat: patching[key] for flat, key in FLAT_PATCHING_KEYS.items()})
    meta["model"]["entropy_model"] = ENTROPY
    meta["model"].pop("entropy_model_sha256", None)
    (copy / "hbpe_run.json").write_text(json.dumps(meta))
    return copy


def test_an_older_runs_missing_entropy_model_is_named_with_the_path_looked_for(
    entropy_run, sample_shards, tmp_path, monkeypatch, caplog
):
    """Before: `error: checkpoint entmodel does not exist`, which names neither the run's setting nor a fix."""
    work, run, bpb = entropy_run
    old = _as_older_hbpe(run, tmp_path / "old")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    r = CliRunner().invoke(main, ["eval", "--checkpoint", str(old), "--data", str(sample_shards[1])])
    assert r.exit_code != 0 and r.output.startswith("error: "), r.output
    assert (
        f"{old / 'hbpe_run.json'}: the run's model.patching.entropy_model=entmodel (its entropy model) is not at "
        in r.output
    )
    assert f"{empty / ENTROPY}; the run was trained by an older hbpe" in r.output
    assert "run from the directory it was trained in, or set model.patching.entropy_model in" in r.output
    monkeypatch.chdir(work)  # where it was trained: it still loads, with a warning that nothing checks it
    with caplog.at_level(logging.WARNING):
        assert evaluate(str(old), str(sample_shards[1]), max_batches=1)["bpb"] == bpb
    assert "the run's model.patching.entropy_model=entmodel is read from" in caplog.text and "unchecked" in caplog.text


def test_a_run_and_an_export_in_a_bucket_read_their_own_entropy_model(
    entropy_run, decoy, sample_shards, s3_server, monkeypatch, tmp_path
):
    from hbpe.pipeline import storage

    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    _, run, bpb = entropy_run
    bucket = s3_server.new_bucket()
    out = f"{bucket}/exports/entropy"
    export_model(str(run), out)
    assert storage.read_if_exists(f"{out}/entropy_model/{MODEL_FILE}") is not None
    storage.upload_dir(str(copy_run(run, tmp_path / "run")), f"{bucket}/run")  # as `hbpe train` uploads it
    monkeypatch.chdir(decoy)
    assert evaluate(out, str(sample_shards[1]), max_batches=1)["bpb"] == bpb
    assert evaluate(f"{bucket}/run/ep0-ba2-rank0.pt", str(sample_shards[1]), max_batches=1)["bpb"] == bpb


def test_autoresume_accepts_a_run_file_written_before_the_fingerprint_field(tiny_run, sample_shards, tmp_path):
    """A field added to the model config (model.patching.entropy_model_sha256) must not make older runs unresumable."""
    from hbpe.training.checkpoint.run_files import read_run_files
    from hbpe.training.checkpoint.save_folder import check_resume_matches
    from hbpe.training.train.config_io import load_config

    run = copy_run(tiny_run, tmp_path / "run")
    meta = json.loads((run / "hbpe_run.json").read_text())
    meta["model"]["patching"].pop("entropy_model_sha256")
    (run / "hbpe_run.json").write_text(json.dumps(meta))
    data = [f"data.train={sample_shards[0]}", f"data.eval={sample_shards[1]}"]
    cfg = load_config("tiny", [*data, f"save_folder={run}", "autoresume=true", f"max_duration={TINY_RUN_BATCHES}ba"])
    check_resume_matches(cfg, read_run_files(str(run / "latest-rank0.pt"))[1])


def test_a_pinned_fingerprint_refuses_another_entropy_model(entropy_run, decoy, sample_shards):
    from hbpe.pipeline.tokenizer import artifact
    from hbpe.training.train.calibration import resolve_entropy_threshold
    from hbpe.training.train.config_io import load_config

    work, run, _ = entropy_run
    sha = json.loads((run / "hbpe_run.json").read_text())["model"]["patching"]["entropy_model_sha256"]
    tok = artifact.load(run / "tokenizer")
    common = [
        f"data.train={sample_shards[0]}",
        "data.eval=null",
        "model.io=entropy",
        "model.patching.entropy_threshold=2.0",
    ]
    pinned = f"model.patching.entropy_model_sha256={sha}"
    cfg, _ = resolve_entropy_threshold(
        load_config("tiny", [*common, f"model.patching.entropy_model={work / ENTROPY}", pinned]), tok
    )
    assert cfg.model.patching.entropy_model_sha256 == sha
    with pytest.raises(
        ConfigError, match=rf"has the fingerprint [0-9a-f]{{64}}, not the model.patching.entropy_model_sha256={sha}"
    ):
        resolve_entropy_threshold(
            load_config("tiny", [*common, f"model.patching.entropy_model={decoy / ENTROPY}", pinned]), tok
        )
