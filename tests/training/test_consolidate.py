"""Sharded FSDP2 checkpoints (2 processes over gloo, the sharded state dict): eval and generate read them
directly, `hbpe checkpoint consolidate` turns one into a single `.pt`, and nothing in them is unpickled unsafely."""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.training.checkpoint.consolidate import consolidate_checkpoint
from hbpe.training.checkpoint.load import load_model
from hbpe.training.checkpoint.safe_load import dcp_metadata, safe_torch_load
from hbpe.training.checkpoint.sharded import read_sharded_model
from tests.conftest import copy_run


def test_sharded_weights_equal_torchs_own_consolidation(sharded_run, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = (sharded_run.folder / "latest-rank0.pt").resolve()
    md = dcp_metadata(ckpt)
    chunks = md.state_dict_metadata["state.model.model.latent.blocks.0.attn.qkv.weight"].chunks
    assert len(chunks) == 2  # the tensor really is split across the two ranks
    ours = read_sharded_model(ckpt)
    dcp_to_torch_save(ckpt, tmp_path / "ref.pt")  # torch's reference reader (unsafe unpickling: our own file)
    ref = torch.load(tmp_path / "ref.pt", weights_only=False)["state"]["model"]
    assert ours.keys() == {k.removeprefix("model.") for k in ref}
    for k, v in ours.items():
        assert torch.equal(v, ref[f"model.{k}"]), k
    model, _, _ = load_model(str(sharded_run.folder))  # the save folder: latest-rank0.pt -> the folder
    assert model.io.encoder.embed.weight is model.io.decoder.embed.weight
    assert torch.equal(model.latent.blocks[0].attn.qkv.weight, ref["model.latent.blocks.0.attn.qkv.weight"])


def test_eval_generate_consolidate_and_export_all_read_a_sharded_run(sharded_run, sample_shards, tmp_path):
    run = copy_run(sharded_run.folder, tmp_path / "run")
    eval_dir = str(sample_shards[1])

    def bpb(path) -> float:
        r = CliRunner().invoke(
            main, ["eval", "--checkpoint", str(path), "--data", eval_dir, "--max-batches", "2", "--json"]
        )
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["bpb"]

    direct = bpb(run)
    r = CliRunner().invoke(main, ["checkpoint", "consolidate", "--checkpoint", str(run), "--json"])
    assert r.exit_code == 0, r.output
    out = Path(json.loads(r.stdout)["out"])
    assert out == run / "ep0-ba2-consolidated.pt" and out.is_file()
    assert set(safe_torch_load(out)["state"]) == {"model"}  # loads weights-only: nothing but tensors
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(run), "--out", str(tmp_path / "exported")])
    assert r.exit_code == 0, r.output
    assert direct > 0 and bpb(out) == direct and bpb(tmp_path / "exported") == direct
    r = CliRunner().invoke(main, ["generate", "--checkpoint", str(run), "--prompt", "We the", "--max-bytes", "12"])
    assert r.exit_code == 0 and r.stdout.startswith("We the"), r.output


def test_consolidate_refusals(sharded_run, tiny_run, tmp_path):
    run = copy_run(sharded_run.folder, tmp_path / "run")
    consolidate_checkpoint(str(run))
    with pytest.raises(ConfigError, match=r"ep0-ba2-consolidated.pt exists; pass --overwrite"):
        consolidate_checkpoint(str(run))
    assert consolidate_checkpoint(str(run / "ep0-ba2"), overwrite=True)["tensors"] == 36
    with pytest.raises(ConfigError, match=r"must stay inside its run folder .*use `hbpe export` for a self-contained"):
        consolidate_checkpoint(str(run), str(tmp_path / "elsewhere.pt"))
    with pytest.raises(ConfigError, match=r"is already a monolithic checkpoint \(one file\): nothing to consolidate"):
        consolidate_checkpoint(str(tiny_run))


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_crafted_sharded_checkpoint_is_refused_unopened(sharded_run, tmp_path):
    run = copy_run(sharded_run.folder, tmp_path / "run")
    ckpt = run / "ep0-ba2"
    with (ckpt / ".metadata").open("rb") as f:
        md = pickle.load(f)  # our own file
    marker = tmp_path / "payload-ran"
    md.planner_data["x"] = _Payload(marker)
    with (ckpt / ".metadata").open("wb") as f:
        pickle.dump(md, f)
    with pytest.raises(ArtifactError, match=r"\.metadata refused: it holds [\w.]*open"):
        load_model(str(run))
    assert not marker.exists()

    del md.planner_data["x"]
    index = next(i for i in md.storage_data if i.fqn == "state.model.model.latent.norm.weight")
    md.storage_data[index] = dataclasses.replace(md.storage_data[index], relative_path="../../outside.distcp")
    with (ckpt / ".metadata").open("wb") as f:
        pickle.dump(md, f)
    with pytest.raises(ArtifactError, match=r"data file '../../outside.distcp' is outside the folder"):
        load_model(str(run))

    shutil.copy(sharded_run.folder / "ep0-ba2" / ".metadata", ckpt / ".metadata")
    (ckpt / "__1_0.distcp").write_bytes(b"")
    with pytest.raises(ArtifactError, match=r"sharded checkpoint .*ep0-ba2 is damaged"):
        load_model(str(run))
