"""`hbpe export`: a self-contained safetensors model directory that eval and generate load like a checkpoint.

Tied weights must come back tied (one parameter), with every value and every logit equal.
"""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest
import torch
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.schemas.train_config import model_config
from hbpe.training.checkpoint.export_format import load_exported, tied_weights, write_export
from hbpe.training.checkpoint.load import load_model
from hbpe.training.checkpoint.names import MODEL_FILE, WEIGHTS_FILE
from hbpe.training.model.build import build_model
from hbpe.training.model.patch_lm import VocabSpec


def _batch(tok, text: str) -> dict[str, torch.Tensor]:
    tokens = torch.from_numpy(tok.encode(text).astype("int64"))[None]  # (1, T)
    patches = torch.from_numpy(tok.patches(tok.encode(text)).astype("int64"))[None]  # (1, T, S)
    return {"tokens": tokens, "patches": patches}


TEXT = "Mr. Speaker, the state of our Union is strong, and growing stronger every year."


def _same_weights(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "model"
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(tiny_run), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["tied"] == {"io.decoder.embed.weight": "io.encoder.embed.weight"}
    return out


def test_hierarchical_export_round_trips_tied_and_equal(tiny_run, exported, sample_shards):
    from safetensors import safe_open

    from hbpe.training.inference.evaluate import evaluate
    from hbpe.training.inference.generate import generate

    assert sorted(p.name for p in exported.iterdir()) == [MODEL_FILE, WEIGHTS_FILE, "tokenizer"]
    with safe_open(str(exported / WEIGHTS_FILE), "pt") as f:
        keys = set(f.keys())
    assert "io.encoder.embed.weight" in keys and "io.decoder.embed.weight" not in keys  # stored once
    original, tok, _ = load_model(str(tiny_run))
    model, tok2, info = load_model(str(exported))
    assert tok2.fingerprint == tok.fingerprint and info["format"] == "hbpe-model"
    assert model.io.encoder.embed.weight is model.io.decoder.embed.weight  # one parameter again, not two copies
    _same_weights(original, model)
    batch = _batch(tok, TEXT)
    with torch.no_grad():
        (a, ta), (b, tb) = original(batch), model(batch)
    assert a.abs().max() > 1.0 and torch.equal(a, b) and torch.equal(ta, tb)
    ev = [evaluate(str(p), str(sample_shards[1]), max_batches=2) for p in (tiny_run, exported)]
    assert ev[0]["bpb"] == ev[1]["bpb"] > 0
    g = [generate(m, tok, "Fellow-Citizens", max_bytes=60).text for m in (original, model)]
    assert g[0] == g[1] and len(g[0]) > len("Fellow-Citizens")


def test_generate_and_eval_commands_read_an_export(exported, sample_shards):
    r = CliRunner().invoke(main, ["generate", "--checkpoint", str(exported), "--prompt", "Fellow", "--max-bytes", "20"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("Fellow")
    r = CliRunner().invoke(
        main, ["eval", "--checkpoint", str(exported), "--data", str(sample_shards[1]), "--max-batches", "1", "--json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["bpb"] > 0


@pytest.mark.parametrize("tie", [True, False])
def test_bpe_baseline_head_round_trips_tied(gpt2_tokenizer, tmp_path, tie):
    """The BPE baseline ties its head to the embedding (as the paper); untied, both matrices are stored."""
    torch.manual_seed(0)
    cfg = model_config("tiny", io="bpe", tie_embeddings=tie)
    model = build_model(cfg, VocabSpec.from_tokenizer(gpt2_tokenizer)).eval()
    with torch.no_grad():
        for p in model.parameters():  # scaled weights: logits far from uniform
            p.mul_(5.0)
    expected = {"io.head.weight": "io.embed.weight"} if tie else {}
    assert tied_weights(model) == expected
    write_export(model, gpt2_tokenizer, str(tmp_path / "bpe"), source={"test": True})
    loaded, _, info = load_exported(tmp_path / "bpe")
    assert info["tied"] == expected
    assert (loaded.io.head.weight is loaded.io.embed.weight) == tie
    _same_weights(model, loaded)
    batch = _batch(gpt2_tokenizer, TEXT)
    with torch.no_grad():
        (a, _), (b, _) = model(batch), loaded(batch)
    assert a.std() > 1.0 and torch.equal(a, b)


def test_export_folder_rules(exported, tiny_run, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds files hbpe export did not write \(notes.txt\); choose an empty"):
        write_export(*load_model(str(tiny_run))[:2], str(foreign), source={})
    copy = shutil.copytree(exported, tmp_path / "again")
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(tiny_run), "--out", str(copy)])
    assert r.exit_code == 2 and "already holds an export; pass --overwrite to replace it" in r.output
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(tiny_run), "--out", str(copy), "--overwrite"])
    assert r.exit_code == 0 and "tied: io.decoder.embed.weight = io.encoder.embed.weight" in r.output
    assert (foreign / "notes.txt").read_text() == "mine"


def test_an_export_takes_the_modes_the_umask_gives(tiny_run, tmp_path):
    """Folders 0o777 & ~umask and files 0o666 & ~umask, as mkdir and open give: tokenizer/ was 0o700 (mkdtemp's,
    renamed into place, in `hbpe export` and `hbpe demo`), so a shared export was unreadable to the other users."""
    model, tok = load_model(str(tiny_run))[:2]
    umask = os.umask(0o002)
    try:
        write_export(model, tok, str(tmp_path / "model"), source={})
    finally:
        os.umask(umask)
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*")}
    assert modes == {
        "model": 0o775,
        "model/tokenizer": 0o775,
        "model/tokenizer/first_stage.tiktoken": 0o664,
        "model/tokenizer/hbpe_tokenizer.json": 0o664,
        "model/tokenizer/hbpe_tokenizer_tables.bin": 0o664,
        "model/tokenizer/hbpe_tokenizer_tables.json": 0o664,
        "model/model.safetensors": 0o664,
        "model/hbpe_model.json": 0o664,
    }


def _edited(exported, tmp_path, name: str):
    copy = shutil.copytree(exported, tmp_path / name)
    return copy, json.loads((copy / MODEL_FILE).read_text())


def test_a_modified_export_is_refused(exported, tmp_path):
    copy, info = _edited(exported, tmp_path, "untied")
    info["tied"] = {}
    (copy / MODEL_FILE).write_text(json.dumps(info))
    with pytest.raises(ArtifactError, match=r"weights do not fit the model in hbpe_model.json \(missing \['io.decoder"):
        load_model(str(copy))
    copy, info = _edited(exported, tmp_path, "v2")
    info["version"] = 2
    (copy / MODEL_FILE).write_text(json.dumps(info))
    with pytest.raises(ArtifactError, match=r"has version 2; this hbpe reads version 1"):
        load_model(str(copy))
    copy, info = _edited(exported, tmp_path, "truncated")
    data = (copy / WEIGHTS_FILE).read_bytes()
    (copy / WEIGHTS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=r"model.safetensors does not match the sha256 recorded in hbpe_model.json"):
        load_model(str(copy))
    del info["weights_sha256"]  # as an older export: safetensors itself finds the damage
    (copy / MODEL_FILE).write_text(json.dumps(info))
    with pytest.raises(ArtifactError, match=r"model.safetensors is missing or corrupt"):
        load_model(str(copy))
    copy, info = _edited(exported, tmp_path, "wider")
    info["model"]["local_dim"] = 128
    (copy / MODEL_FILE).write_text(json.dumps(info))
    with pytest.raises(ArtifactError, match=r"weights do not fit the model in hbpe_model.json \(.*size mismatch"):
        load_model(str(copy))
