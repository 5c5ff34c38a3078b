"""Loading a checkpoint never runs code from it, and a broken one gives one clear error line."""

from __future__ import annotations

import dataclasses
import io
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.errors import ArtifactError
from hbpe.training.checkpoint.load import load_model
from hbpe.training.checkpoint.safe_load import composer_checkpoint_validator, ensure_safe_checkpoint, safe_torch_load
from tests.conftest import TINY_RUN_BATCHES, copy_run


class _Payload:
    """Unpickling this calls open(marker, "w"): the file appears only if the loader ran the file's code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture(scope="module")
def run_dir(tiny_run, tmp_path_factory) -> Path:
    """A real `hbpe train` save folder (a copy of the shared tiny run: these tests add files to it)."""
    folder = copy_run(tiny_run, tmp_path_factory.mktemp("ckpt") / "run")
    assert (folder / "latest-rank0.pt").is_symlink()
    return folder


@pytest.fixture
def payload_ckpt(run_dir, tmp_path) -> tuple[Path, Path]:
    """(checkpoint, marker): the real checkpoint plus one object whose unpickling creates `marker`."""
    marker = tmp_path / "payload-ran"
    obj = torch.load(run_dir / "latest-rank0.pt", map_location="cpu", weights_only=False)  # our own file
    obj["state"]["integrations"] = {"x": _Payload(marker)}
    path = run_dir / f"evil-{tmp_path.name}.pt"  # beside hbpe_run.json, so load_model gets as far as torch.load
    torch.save(obj, path)
    return path, marker


def _broken(run_dir: Path, kind: str) -> Path:
    good = (run_dir / "latest-rank0.pt").read_bytes()
    data = {"empty": b"", "random": np.random.default_rng(0).bytes(4096), "truncated": good[: len(good) // 2]}[kind]
    path = run_dir / f"{kind}.pt"
    path.write_bytes(data)
    return path


BROKEN = {
    "empty": r"checkpoint .*empty\.pt is empty; use a checkpoint written by `hbpe train`",
    "random": r"random\.pt is not a PyTorch zip archive \(4096 bytes: truncated, or not a checkpoint\)",
    "truncated": r"truncated\.pt is not a PyTorch zip archive \(\d+ bytes: truncated, or not a checkpoint\)",
}


def test_real_checkpoint_passes_and_loads(run_dir):
    ensure_safe_checkpoint(run_dir / "latest-rank0.pt")  # Composer's symlink, as autoresume finds it
    ensure_safe_checkpoint(str(next(run_dir.glob("ep0-ba*-rank0.pt"))))
    assert composer_checkpoint_validator(str(run_dir / "latest-rank0.pt")) is True
    obj = safe_torch_load(run_dir / "latest-rank0.pt")
    assert obj["state"]["timestamp"]["Timestamp"]["batch"] == TINY_RUN_BATCHES and isinstance(
        obj["rng"][0]["numpy"][1], np.ndarray
    )
    model, tok, meta = load_model(str(run_dir))
    assert not model.training and tok.max_patch_size == meta["max_patch_size"] == 10


def test_payload_is_refused_and_never_runs(payload_ckpt):
    path, marker = payload_ckpt
    with pytest.raises(ArtifactError, match=r"evil-.*\.pt refused: it holds [\w.]*open, which a checkpoint written"):
        load_model(str(path))
    with pytest.raises(ArtifactError, match=r"refused: .*whose unpickling could run code; use a checkpoint written"):
        ensure_safe_checkpoint(path)
    assert not marker.exists()


def test_payload_is_refused_in_composers_own_loader(payload_ckpt, monkeypatch):
    """Composer's load (`load_path`, autoresume) asks CHECKPOINT_VALIDATION_FUNCTION before its unsafe torch.load."""
    from composer.utils.checkpoint import safe_torch_load as composer_load

    path, marker = payload_ckpt
    monkeypatch.setenv(
        "CHECKPOINT_VALIDATION_FUNCTION", "hbpe.training.checkpoint.safe_load.composer_checkpoint_validator"
    )
    with pytest.raises(ArtifactError, match="refused"):
        composer_load(str(path))
    assert not marker.exists()
    monkeypatch.delenv("CHECKPOINT_VALIDATION_FUNCTION")
    composer_load(str(path))  # without the hook, Composer runs the payload: the danger the hook removes
    assert marker.exists()


def test_remote_paths_and_plain_folders_are_refused(tmp_path):
    with pytest.raises(ArtifactError, match=r"s3://b/c\.pt: remote checkpoints are not verified before loading"):
        ensure_safe_checkpoint("s3://b/c.pt")
    with pytest.raises(ArtifactError, match=r"is a directory without \.metadata: not a checkpoint"):
        ensure_safe_checkpoint(tmp_path)


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_broken_checkpoint_is_one_clear_error(run_dir, kind):
    path = _broken(run_dir, kind)
    with pytest.raises(ArtifactError, match=BROKEN[kind]):
        load_model(str(path))
    with pytest.raises(ArtifactError, match=BROKEN[kind]):
        ensure_safe_checkpoint(path)


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_broken_checkpoint_in_the_cli(run_dir, sample_shards, kind):
    path = _broken(run_dir, kind)
    r = CliRunner().invoke(main, ["eval", "--checkpoint", str(path), "--data", str(sample_shards[1])])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: checkpoint ") and len(r.output.strip().splitlines()) == 1, r.output
    assert "Traceback" not in r.output and "Aborted" not in r.output


def test_weights_of_another_shape_are_one_clear_error(run_dir, tmp_path):
    obj = safe_torch_load(run_dir / "latest-rank0.pt")
    key = next(k for k, v in obj["state"]["model"].items() if v.ndim == 2)
    obj["state"]["model"][key] = torch.zeros(3, 3)
    path = run_dir / f"reshaped-{tmp_path.name}.pt"
    torch.save(obj, path)
    with pytest.raises(ArtifactError, match=r"weights do not fit the model in hbpe_run.json \(.*size mismatch"):
        load_model(str(path))


def test_a_checkpoint_with_non_finite_weights_is_refused(run_dir, tmp_path):
    """A diverged run writes NaN into its checkpoints; generating from one printed NUL bytes with rc 0."""
    obj = safe_torch_load(run_dir / "latest-rank0.pt")
    obj["state"]["model"]["model.latent.norm.weight"][3] = float("nan")
    path = run_dir / f"diverged-{tmp_path.name}.pt"
    torch.save(obj, path)
    with pytest.raises(
        ArtifactError,
        match=rf"^{path}: weight latent\.norm\.weight holds 1 non-finite values \(NaN or inf\) of \d+: the training "
        r"run diverged .*; load an earlier checkpoint of the run",
    ):
        load_model(str(path))


# ---- sharded FSDP checkpoints (FSDP2's default): `.metadata` is a plain pickle, non-tensor items are torch.save blobs


def _copy_sharded(run: Path, tmp_path: Path) -> tuple[Path, object]:
    ckpt = shutil.copytree((run / "latest-rank0.pt").resolve(), tmp_path / "ep0-ba2")
    with (ckpt / ".metadata").open("rb") as f:
        return ckpt, pickle.load(f)  # our own file


def _dcp_load_batch(ckpt: Path) -> object:
    """Read one non-tensor item the way Composer resumes a sharded checkpoint (its reader, torch's planner)."""
    import torch.distributed.checkpoint as dcp
    from composer.utils.checkpoint import FileSystemReaderWithValidation
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    sd = {"state": {"timestamp": {"Timestamp": {"batch": -1}}}}
    reader = FileSystemReaderWithValidation(str(ckpt))
    dcp.load(sd, storage_reader=reader, planner=DefaultLoadPlanner(allow_partial_load=True), no_dist=True)
    return sd["state"]["timestamp"]["Timestamp"]["batch"]


def test_sharded_checkpoint_passes(sharded_run, monkeypatch):
    latest = sharded_run.folder / "latest-rank0.pt"  # a symlink to the checkpoint folder, as autoresume finds it
    ensure_safe_checkpoint(latest)
    assert composer_checkpoint_validator(latest / ".metadata")
    assert composer_checkpoint_validator(latest / "__0_0.distcp", [(0, 10)])
    monkeypatch.setenv(
        "CHECKPOINT_VALIDATION_FUNCTION", "hbpe.training.checkpoint.safe_load.composer_checkpoint_validator"
    )
    assert _dcp_load_batch(latest.resolve()) == 2
    model, _, _ = load_model(
        str(sharded_run.folder)
    )  # read directly (training/checkpoint/consolidate.py), through the same checks
    assert model.io.encoder.embed.weight is model.io.decoder.embed.weight


def test_sharded_metadata_payload_is_refused(sharded_run, tmp_path):
    ckpt, md = _copy_sharded(sharded_run.folder, tmp_path)
    marker = tmp_path / "payload-ran"
    md.planner_data["x"] = _Payload(marker)
    with (ckpt / ".metadata").open("wb") as f:
        pickle.dump(md, f)
    with pytest.raises(ArtifactError, match=r"ep0-ba2/\.metadata refused: it holds [\w.]*open, which a checkpoint"):
        ensure_safe_checkpoint(ckpt)
    with pytest.raises(ArtifactError, match=r"\.metadata refused"):
        composer_checkpoint_validator(ckpt / ".metadata")
    assert not marker.exists()


def test_sharded_item_payload_is_refused_also_in_composers_reader(sharded_run, tmp_path, monkeypatch):
    """A non-tensor item replaced by a payload blob: torch's planner would torch.load it with weights_only=False."""
    from torch.distributed.checkpoint.api import CheckpointException

    ckpt, md = _copy_sharded(sharded_run.folder, tmp_path)
    marker = tmp_path / "payload-ran"
    blob = io.BytesIO()
    torch.save(_Payload(marker), blob)
    data = ckpt / "__0_0.distcp"
    offset = data.stat().st_size
    data.write_bytes(data.read_bytes() + blob.getvalue())
    (index,) = [i for i in md.storage_data if i.fqn == "state.timestamp.Timestamp.batch"]
    md.storage_data[index] = dataclasses.replace(md.storage_data[index], offset=offset, length=len(blob.getvalue()))
    with (ckpt / ".metadata").open("wb") as f:
        pickle.dump(md, f)

    item_refused = r"__0_0\.distcp: item state\.timestamp\.Timestamp\.batch refused: it holds [\w.]*open"
    with pytest.raises(ArtifactError, match=item_refused):
        ensure_safe_checkpoint(ckpt)
    monkeypatch.setenv(
        "CHECKPOINT_VALIDATION_FUNCTION", "hbpe.training.checkpoint.safe_load.composer_checkpoint_validator"
    )
    # torch.distributed.checkpoint wraps what its reader raises (per rank): our line arrives inside its exception
    with pytest.raises(CheckpointException, match=item_refused):
        _dcp_load_batch(ckpt)
    assert not marker.exists()
    monkeypatch.delenv("CHECKPOINT_VALIDATION_FUNCTION")
    opened = _dcp_load_batch(ckpt)  # without the hook the payload runs: the danger the hook removes
    assert marker.exists()
    opened.close()


def _bytes_item(md, fqn="state.timestamp.Timestamp.batch"):
    (index,) = [i for i in md.storage_data if i.fqn == fqn]
    return index


def _repoint(**changes):
    def edit(md):
        index = _bytes_item(md)
        md.storage_data[index] = dataclasses.replace(md.storage_data[index], **changes)
        return md

    return edit


SHARDED_BROKEN = {
    "truncated-metadata": (None, r"sharded checkpoint .*ep0-ba2/\.metadata is corrupt \(\w+Error"),
    "not-metadata": (lambda md: {"not": "metadata"}, r"\.metadata holds a dict, not checkpoint metadata"),
    "item-outside": (_repoint(relative_path="../x.distcp"), r"data file '\.\./x\.distcp' is outside the folder"),
    "item-transformed": (_repoint(transform_descriptors=["zstd"]), r"Timestamp\.batch is stored transformed"),
}


@pytest.mark.parametrize("case", sorted(SHARDED_BROKEN))
def test_broken_sharded_checkpoint_is_one_clear_error(sharded_run, tmp_path, case):
    edit, message = SHARDED_BROKEN[case]
    ckpt, md = _copy_sharded(sharded_run.folder, tmp_path)
    meta = ckpt / ".metadata"
    if edit is None:
        meta.write_bytes(meta.read_bytes()[:1000])
    else:
        with meta.open("wb") as f:
            pickle.dump(edit(md), f)
    with pytest.raises(ArtifactError, match=message):
        ensure_safe_checkpoint(ckpt)
