"""An export is checked before it is built or believed (issue 20): bounded sizes, a tokenizer of the model's
shape, a sha256 of its weights, finite BPB, and a bucket export that an interrupted upload left incomplete."""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import struct
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import hbpe
from hbpe.cli import main
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.schemas.train_config import MODEL_SIZE_LIMITS, model_config
from hbpe.training.checkpoint.export import export_model
from hbpe.training.checkpoint.export_format import write_export
from hbpe.training.checkpoint.load import load_model
from hbpe.training.checkpoint.names import MODEL_FILE, WEIGHTS_FILE
from tests.helpers import cli_fails, make_special, scaled_model


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export-integrity") / "model"
    export_model(str(tiny_run), str(out))
    return out


def _copy(exported: Path, tmp_path: Path, name: str) -> tuple[Path, dict]:
    copy = Path(shutil.copytree(exported, tmp_path / name))
    return copy, json.loads((copy / MODEL_FILE).read_text())


def _eval(checkpoint: Path, data: Path) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["eval", "--checkpoint", str(checkpoint), "--data", str(data), "--max-batches", "1"])
    return r.exit_code, r.output


@pytest.mark.parametrize("field", ["latent_dim", "local_ffn", "latent_layers", "decoder_layers", "latent_heads"])
def test_a_huge_size_in_hbpe_model_json_is_refused_before_anything_is_allocated(exported, tmp_path, field):
    copy, info = _copy(exported, tmp_path, field)
    info["model"][field] = 10**9  # latent_dim=10**9 asked for 256 GB
    (copy / MODEL_FILE).write_text(json.dumps(info))
    limit = MODEL_SIZE_LIMITS[field]
    with pytest.raises(
        ArtifactError,
        match=rf"model config does not fit this hbpe \(model\.{field}=1000000000: must "
        rf"be at most {limit}",
    ):
        load_model(str(copy))


def test_sizes_within_every_bound_but_not_the_weights_file_are_refused_before_building(exported, tmp_path):
    copy, info = _copy(exported, tmp_path, "wide")
    info["model"].update(latent_dim=16384, latent_ffn=65536, latent_heads=64)  # 4 GB of weights, in bounds
    (copy / MODEL_FILE).write_text(json.dumps(info))
    with pytest.raises(ArtifactError, match=r"weights do not fit the model in hbpe_model.json \(.*latent.*\[16384"):
        load_model(str(copy))


def test_config_bounds_name_the_limit():
    with pytest.raises(ConfigError, match=r"model\.latent_dim=1000000000: must be at most 65536; e\.g\."):
        model_config("tiny", latent_dim=10**9)
    with pytest.raises(ConfigError, match=r"model\.patching\.max_bytes=100000: must be at most 1024"):
        model_config("tiny", patch_max_bytes=100_000)
    assert model_config("medium").latent_dim == 1024  # the shipped sizes are far inside


@pytest.mark.parametrize("field,value", [("vocab_size", 10**9), ("max_patch_size", 10**6), ("n_vocab", 10**10)])
def test_tokenizer_sizes_in_hbpe_model_json_must_be_the_tokenizers(exported, tmp_path, field, value):
    """The tokenizer bounds V' and S (its artifact's limits); the model's sizes must equal its tokenizer's."""
    copy, info = _copy(exported, tmp_path, field)
    info[field] = value
    (copy / MODEL_FILE).write_text(json.dumps(info))
    with pytest.raises(
        ArtifactError,
        match=rf"the tokenizer has {field}=\d+, the model in .*hbpe_model.json was built for {field}={value}; the",
    ):
        load_model(str(copy))


def test_a_tokenizer_of_another_shape_is_refused_even_with_its_fingerprint(exported, tmp_path):
    """A swapped S=6 tokenizer whose fingerprint was copied into hbpe_model.json gave an internal IndexError."""
    from hbpe.pipeline.tokenizer import artifact

    copy, info = _copy(exported, tmp_path, "s6")
    tok = artifact.load(copy / "tokenizer")
    s6 = artifact.with_patch_size(tok, max_patch_size=6, mode="minimal")
    shutil.rmtree(copy / "tokenizer")
    artifact.save(s6, copy / "tokenizer")
    info["tokenizer_fingerprint"] = s6.fingerprint
    (copy / MODEL_FILE).write_text(json.dumps(info))
    with pytest.raises(
        ArtifactError,
        match=r"tokenizer does not fit .*: the tokenizer has vocab_size=\d+, max_patch_size=6, the model in "
        r".*hbpe_model.json was built for vocab_size=470, max_patch_size=10; the folder was modified",
    ):
        load_model(str(copy))


def _flip(path: Path, *, at: float, mask: int) -> None:
    """XOR `mask` into the high byte of the float32 at fraction `at` of the safetensors data section."""
    data = bytearray(path.read_bytes())
    start = 8 + struct.unpack("<Q", data[:8])[0]
    i = start + ((int((len(data) - start) * at)) // 4) * 4 + 3  # little-endian: byte 3 holds sign + exponent
    data[i] ^= mask
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("mask", [0x7F, 0x80], ids=["exponent", "sign"])
def test_flipped_bits_in_the_weights_are_a_checksum_error_in_hbpe_eval(exported, tmp_path, sample_shards, mask):
    """Exponent flips gave `BPB nan` with rc 0, sign flips a silently wrong BPB."""
    copy, info = _copy(exported, tmp_path, "flipped")
    for at in (0.1, 0.3, 0.5, 0.7, 0.9):
        _flip(copy / WEIGHTS_FILE, at=at, mask=mask)
    rc, out = _eval(copy, sample_shards[1])
    assert rc != 0 and out.startswith("error: ") and len(out.strip().splitlines()) == 1, out
    assert len(info["weights_sha256"]) == 64
    assert f"{copy / WEIGHTS_FILE} does not match the sha256 recorded in hbpe_model.json" in out
    assert "re-export the model" in out


@pytest.mark.parametrize("kind", ["fifo", "link-to-dev-zero"])
def test_special_files_are_not_regular_files_not_missing_ones(exported, tmp_path, kind):
    """A FIFO or a link to /dev/zero as model.safetensors, or /dev/zero as the checkpoint, was "is missing" / "does
    not exist"."""
    copy, _ = _copy(exported, tmp_path, kind)
    make_special(copy / WEIGHTS_FILE, kind)
    what = "a FIFO" if kind == "fifo" else "a character device"
    with pytest.raises(
        ArtifactError, match=rf"^{copy / WEIGHTS_FILE} is not a regular file \({what}\); re-export the model"
    ):
        load_model(str(copy))
    with pytest.raises(
        ArtifactError, match=r"^checkpoint /dev/zero is not a regular file \(a character device\); pass a checkpoint"
    ):
        hbpe.load_model("/dev/zero", device="cpu")


def test_an_older_export_without_a_checksum_loads_with_a_warning(exported, tmp_path, caplog):
    copy, info = _copy(exported, tmp_path, "old")
    del info["weights_sha256"]
    (copy / MODEL_FILE).write_text(json.dumps(info))
    with caplog.at_level(logging.WARNING):
        model, _, _ = load_model(str(copy))
    assert "records no sha256 of model.safetensors (written by an older hbpe)" in caplog.text
    assert torch.equal(model.latent.norm.weight, load_model(str(exported))[0].latent.norm.weight)


def test_a_nan_bpb_is_an_error_not_a_result(tiny_run, tmp_path, sample_shards):
    """Finite weights so large that the outputs overflow (with a valid checksum: a diverged run) give no BPB."""
    model, tok, _ = load_model(str(tiny_run))
    with torch.no_grad():
        model.io.decoder.head.weight.fill_(3e38)
    write_export(model, tok, str(tmp_path / "diverged"), source={"test": True})
    rc, out = _eval(tmp_path / "diverged", sample_shards[1])
    last = out.strip().splitlines()[-1]  # after eval's progress line: the BPB is known once every batch is read
    assert rc != 0 and last.startswith("error: "), out
    assert re.search(r"bits per byte is (nan|inf): the model's outputs are not finite", last), out


def _diverged_export(tok, out: Path, name: str, value: float) -> Path:
    """An export of a small hierarchical model whose tensor `name` is filled with `value`, its sha256 recorded as a
    diverged run's export records it."""
    model = scaled_model("hierarchical", tok, seed=0)
    with torch.no_grad():
        model.get_parameter(name).fill_(value)
    write_export(model, tok, str(out), source={"test": True})
    return out


GENERATE = ["generate", "--prompt", "Fellow-Citizens", "--max-bytes", "20"]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_weights_are_refused_at_load(gpt2_tokenizer, sample_shards, tmp_path, value):
    """Before: `hbpe eval` refused (BPB nan), `hbpe generate` printed 20 NUL bytes with rc 0, or crashed with
    `internal error: RuntimeError: probability tensor contains inf/nan` at --temperature 0.8."""
    export = _diverged_export(gpt2_tokenizer, tmp_path / "diverged", "latent.norm.weight", value)
    message = (
        f"{export / WEIGHTS_FILE}: weight latent.norm.weight holds 64 non-finite values (NaN or inf) of 64: the "
        "training run diverged"
    )
    with pytest.raises(ArtifactError, match=re.escape(message) + r".*; load an earlier checkpoint of the run"):
        load_model(str(export))
    for args in (
        [*GENERATE, "--checkpoint", str(export)],
        [*GENERATE, "--checkpoint", str(export), "--temperature", "0.8"],
        ["eval", "--checkpoint", str(export), "--data", str(sample_shards[1]), "--max-batches", "1"],
    ):
        cli_fails(CliRunner().invoke(main, args), 2, message)


LOGITS_NOT_FINITE = "the model's logits for the next symbol{} are not finite (NaN or inf): its weights are damaged"


@pytest.mark.parametrize(
    "options,scaled",
    [([], ""), (["--no-cache"], ""), (["--temperature", "0.8"], " (divided by temperature 0.8)"),
     (["--temperature", "0.8", "--no-cache", "--top-k", "5"], " (divided by temperature 0.8)")],
    ids=["greedy", "greedy-uncached", "sampled", "sampled-uncached"],
)  # fmt: skip
def test_finite_weights_whose_logits_overflow_are_one_error_in_generate(gpt2_tokenizer, tmp_path, options, scaled):
    """Finite weights pass the load check; logits they overflow to NaN or inf are refused where a symbol is chosen."""
    export = _diverged_export(gpt2_tokenizer, tmp_path / "huge", "io.decoder.head.weight", 3e38)
    r = CliRunner().invoke(main, [*GENERATE, "--checkpoint", str(export), "--prompt", "We the People", *options])
    cli_fails(r, 2, LOGITS_NOT_FINITE.format(scaled))
    assert "generate from an earlier checkpoint of the run" in r.output


def test_a_diverged_experiment_run_is_an_error_not_a_row(tmp_path):
    from tests.conftest import split_sample

    train, held = split_sample(tmp_path / "corpus")
    narrow = ["batches=4", "eval_points=1", "eval_batches=1", "final_eval_batches=1", "global_batch_size=4"]
    narrow += ["model.latent_layers=1", "model.encoder_layers=1", "model.decoder_layers=1", f"lr={10.0**30:f}"]
    out = tmp_path / "exp"
    args = ["experiment", "table1-mini", *narrow, "--out", str(out), "--train-input", str(train)]
    r = CliRunner().invoke(main, [*args, "--eval-input", str(held)])
    assert r.exit_code != 0, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith(f"error: experiment table1-mini, run bytes (in {out / 'runs' / 'bytes'}): bits per byte is")
    assert re.search(r"is (nan|inf): the model's outputs are not finite, .*; run it again with a lower lr", last)
    assert not (out / "runs" / "bytes" / "result.json").exists()


def test_an_interrupted_bucket_export_is_replaced_with_overwrite(s3_server, monkeypatch, exported, tiny_run):
    """An upload cut before hbpe_model.json: `--overwrite` refused it as "incomplete export", so it stayed stuck."""
    from hbpe.pipeline import storage

    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    out = f"{s3_server.new_bucket()}/exports/tiny"
    storage.upload_file(str(exported / WEIGHTS_FILE), f"{out}/{WEIGHTS_FILE}")
    storage.upload_dir(str(exported / "tokenizer"), f"{out}/tokenizer")
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(tiny_run), "--out", out])
    assert r.exit_code == 2 and f"--out {out} holds an incomplete export (no hbpe_model.json" in r.output, r.output
    assert "pass --overwrite to replace it" in r.output
    r = CliRunner().invoke(main, ["export", "--checkpoint", str(tiny_run), "--out", out, "--overwrite"])
    assert r.exit_code == 0, r.output
    assert (
        json.loads(storage.read_bytes(f"{out}/{MODEL_FILE}"))["weights_sha256"]
        == json.loads((exported / MODEL_FILE).read_text())["weights_sha256"]
    )
    assert load_model(out)[0].latent.norm.weight.shape == (64,)


def test_an_incomplete_local_export_is_replaced_with_overwrite(exported, tiny_run, tmp_path):
    copy, _ = _copy(exported, tmp_path, "partial")
    (copy / MODEL_FILE).unlink()
    with pytest.raises(ConfigError, match=r"holds an incomplete export \(no hbpe_model.json.*pass --overwrite"):
        export_model(str(tiny_run), str(copy))
    export_model(str(tiny_run), str(copy), overwrite=True)
    assert (copy / MODEL_FILE).is_file()
    (copy / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds files hbpe export did not write \(notes.txt\)"):
        export_model(str(tiny_run), str(copy), overwrite=True)
