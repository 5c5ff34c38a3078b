"""`hbpe checkpoint consolidate --overwrite` replaces only an earlier consolidated file, and an export is said to be
one file already (issue 20): `--out RUN/hbpe_run.json --overwrite` replaced the run's own file with a zip, and
`--checkpoint EXPORT_DIR` answered with a message that suggested passing an export directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.pipeline import storage
from hbpe.training.checkpoint.export import export_model
from hbpe.training.checkpoint.load import load_model
from hbpe.training.checkpoint.safe_load import safe_torch_load
from tests.conftest import copy_run


def _add_sharded(run: Path) -> Path:
    """The run's weights as a torch.distributed.checkpoint folder (the layout FSDP2 saves), in the run folder."""
    import torch.distributed.checkpoint as dcp

    model, _, _ = load_model(str(run))
    weights = {f"model.{k}": v.clone() for k, v in model.state_dict().items()}
    dcp.save({"state": {"model": weights}}, checkpoint_id=str(run / "ep0-ba4"), no_dist=True)
    return run / "ep0-ba4"


@pytest.fixture
def sharded(tiny_run, tmp_path) -> tuple[Path, Path]:
    run = copy_run(tiny_run, tmp_path / "run")
    return run, _add_sharded(run)


def _consolidate(*args: str):
    return CliRunner().invoke(main, ["checkpoint", "consolidate", *args])


@pytest.mark.parametrize(
    "name", ["hbpe_run.json", "tokenizer/hbpe_tokenizer.json", "ep0-ba20-rank0.pt", "latest-rank0.pt"]
)
def test_overwrite_never_replaces_the_runs_own_files(sharded, name):
    run, ckpt = sharded
    target = run / name
    before = target.read_bytes()
    r = _consolidate("--checkpoint", str(ckpt), "--out", str(target), "--overwrite")
    assert r.exit_code == 2, r.output
    assert r.output == (
        f"error: --out {target} exists and is not a consolidated checkpoint (hbpe checkpoint consolidate writes "
        "those): --overwrite replaces only an earlier one; choose another --out, or omit it for the default name\n"
    )
    assert target.read_bytes() == before
    assert load_model(str(run))[0] is not None  # the run still loads


def test_overwrite_replaces_an_earlier_consolidated_file(sharded):
    run, ckpt = sharded
    for out in (None, run / "mine.pt"):
        given = [] if out is None else ["--out", str(out)]
        assert _consolidate("--checkpoint", str(ckpt), *given).exit_code == 0
        r = _consolidate("--checkpoint", str(ckpt), *given, "--overwrite")
        assert r.exit_code == 0, r.output
        written = out or run / "ep0-ba4-consolidated.pt"
        assert safe_torch_load(written)["consolidated_from"] == "ep0-ba4"


def test_consolidating_an_export_says_it_is_one_file_already(tiny_run, tmp_path):
    export_model(str(tiny_run), str(tmp_path / "export"))
    r = _consolidate("--checkpoint", str(tmp_path / "export"))
    assert r.exit_code == 2
    assert r.output == (
        f"error: {tmp_path / 'export'} is an `hbpe export` directory: its weights are already a single file "
        "(model.safetensors), so there is nothing to consolidate; eval, generate and export read it as it is\n"
    )


def test_in_a_bucket_too(tiny_run, tmp_path, s3_server, monkeypatch):
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    run = copy_run(tiny_run, tmp_path / "run")
    ckpt = _add_sharded(run)
    remote = f"{s3_server.new_bucket()}/run"
    for name in ("hbpe_run.json", "ep0-ba20-rank0.pt"):
        storage.upload_file(str(run / name), f"{remote}/{name}")
    storage.upload_dir(str(run / "tokenizer"), f"{remote}/tokenizer")
    storage.upload_dir(str(ckpt), f"{remote}/ep0-ba4")
    r = _consolidate("--checkpoint", f"{remote}/ep0-ba4", "--out", f"{remote}/hbpe_run.json", "--overwrite")
    assert r.exit_code == 2 and f"--out {remote}/hbpe_run.json exists and is not a consolidated checkpoint" in r.output
    assert storage.read_bytes(f"{remote}/hbpe_run.json") == (run / "hbpe_run.json").read_bytes()
    assert _consolidate("--checkpoint", f"{remote}/ep0-ba4").exit_code == 0
    r = _consolidate("--checkpoint", f"{remote}/ep0-ba4", "--overwrite")
    assert r.exit_code == 0, r.output
    export = f"{remote}-export"
    export_model(str(run), export)
    r = _consolidate("--checkpoint", export)
    assert r.exit_code == 2 and f"error: {export} is an `hbpe export` directory: its weights are already" in r.output
