"""Corrupt or wrong shard data never trains or evaluates silently.

Before these checks, streaming's download thread failed on a damaged shard, logged the
traceback and ended the epoch early: training and eval ran on 35-42 of 152 batches and
reported nothing. Every test damages a copy of `sample_shards`, never the fixture.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.pipeline.shards.reader import load_shard_tokenizer
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ArtifactError
from hbpe.training.data.loader import Collator, PatchSource, build_dataloader, check_shards
from hbpe.training.train.config_io import load_config
from tests.conftest import IN_MEMORY_BEAM
from tests.helpers import DAMAGE, SHARD, damage


def loader(shards, cache, **kw):
    tok = load_shard_tokenizer(str(shards))
    return build_dataloader(str(shards), tok, batch_size=8, cache_dir=str(cache), shuffle=False, shuffle_seed=0, **kw)


# ---- damaged shards: refused before streaming reads anything ----------------------------------


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_build_dataloader_refuses_damaged_shards_up_front(train_copy, tmp_path, kind):
    damage(train_copy, kind)
    cache = tmp_path / "cache"
    with pytest.raises(ArtifactError, match=f"{SHARD}: {DAMAGE[kind]}.*reconvert.*nothing was read"):
        loader(train_copy, cache)
    assert not cache.exists() or not any(cache.iterdir())  # streaming never started


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_train_refuses_damaged_shards_and_saves_nothing(sample_shards, train_copy, tmp_path, kind):
    damage(train_copy, kind)
    folder = tmp_path / "run"
    args = [f"data.train={train_copy}", f"data.eval={sample_shards[1]}", f"save_folder={folder}", "max_duration=2ba"]
    from hbpe.training.train.trainer import build_run

    with pytest.raises(ArtifactError, match=f"{SHARD}: {DAMAGE[kind]}"):
        build_run(load_config("tiny", args))
    r = CliRunner().invoke(main, ["train", "tiny", *args, "console=false"])
    assert r.exit_code == 2 and r.output.startswith("error:") and "Traceback" not in r.output, r.output
    assert f"{SHARD}: {DAMAGE[kind]}" in r.output
    assert not folder.exists() or not [p for p in folder.rglob("*") if p.suffix == ".pt" or p.name == "hbpe_run.json"]


def test_train_refuses_damaged_eval_shards(sample_shards, eval_copy, tmp_path):
    damage(eval_copy, "flip", "shard.00000.mds.zstd")
    cfg = load_config(
        "tiny", [f"data.train={sample_shards[0]}", f"data.eval={eval_copy}", f"save_folder={tmp_path / 'run'}"]
    )
    from hbpe.training.train.trainer import build_run

    with pytest.raises(ArtifactError, match="eval: shard file is damaged: shard.00000.mds.zstd: xxh64"):
        build_run(cfg)


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_shard_damaged_while_streaming_raises_instead_of_ending_the_epoch(train_copy, tmp_path, kind):
    """What remote shards get (no up-front read): streaming's hash check, surfaced as an ArtifactError."""
    good = sum(1 for _ in loader(train_copy, tmp_path / "c0"))
    assert good == 152
    dl = loader(train_copy, tmp_path / "c1")  # passes the up-front check
    damage(train_copy, kind)  # e.g. a remote shard replaced after the run started
    seen = 0
    with pytest.raises(ArtifactError, match=f"{SHARD} failed while streaming.*reconvert"):
        for _ in dl:
            seen += 1
    assert seen < good


def test_stale_or_damaged_stream_cache_is_refused(sample_shards, train_copy, tmp_path):
    cache = tmp_path / "cache"
    next(iter(loader(train_copy, cache)))  # fills the cache with shard 0, decompressed
    assert (cache / "shard.00000.mds").is_file()
    loader(train_copy, cache)  # the same shards: the cache is reused
    with pytest.raises(ArtifactError, match="holds shards of another conversion.*delete .*cache"):
        loader(sample_shards[1], cache)  # another run's data.train with the same run_name
    raw = cache / "shard.00000.mds"
    data = bytearray(raw.read_bytes())
    data[len(data) // 2] ^= 1
    raw.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="cached copy of shard.00000.mds.zstd is damaged.*xxh64.*delete"):
        loader(train_copy, cache)


@pytest.mark.parametrize(
    "basename", ["../escape.mds.zstd", "/abs/path/shard.00000.mds.zstd", "sub/shard.00000.mds.zstd"]
)
def test_build_dataloader_refuses_index_names_outside_the_directory(train_copy, tmp_path, basename):
    index = json.loads((train_copy / "index.json").read_text())
    index["shards"][0]["raw_data"]["basename"] = basename  # where streaming would write in its cache
    (train_copy / "index.json").write_text(json.dumps(index))
    cache = tmp_path / "cache"
    with pytest.raises(ArtifactError, match="is not a plain file name inside the shard directory"):
        loader(train_copy, cache)
    assert not cache.exists() and not (tmp_path / "escape.mds").exists()


def test_index_disagreeing_with_the_manifest_is_refused(train_copy, tmp_path):
    index = json.loads((train_copy / "index.json").read_text())
    index["shards"][3]["samples"] += 1  # streaming would read a sample past the end of the shard
    (train_copy / "index.json").write_text(json.dumps(index))
    with pytest.raises(ArtifactError, match=r"index.json \(4 shards, 1223 samples\) does not match manifest.json"):
        loader(train_copy, tmp_path / "cache")


def test_check_shards_reports_what_it_read(train_copy, tmp_path):
    r = check_shards(str(train_copy), str(tmp_path / "cache"))
    assert (r.shard_files, r.cached_files, r.validate_hash) == (4, 0, "xxh64")
    assert r.bytes == sum(p.stat().st_size for p in train_copy.glob("shard.*")) and r.seconds < 1.0
    sized = check_shards(str(train_copy), str(tmp_path / "cache"), hashes=False)
    assert sized.bytes == 0
    damage(train_copy, "flip")
    check_shards(str(train_copy), str(tmp_path / "cache"), hashes=False)  # sizes only: a flipped byte passes
    with pytest.raises(ArtifactError, match="xxh64 does not match"):
        check_shards(str(train_copy), str(tmp_path / "cache"))


# ---- ids outside the vocabularies -------------------------------------------------------------


def _samples(tok, n=2, seq_len=16):
    tokens = tok.encode("Fellow-Citizens of the Senate and of the House of Representatives: " * 4)[: n * seq_len]
    tokens = tokens.reshape(n, seq_len).copy()
    return [{"tokens": t, "patches": tok.patches(t)} for t in tokens]


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("tokens", 50257, "column `tokens` holds id 50257, outside -2..50256"),  # would read the PAD row
        ("tokens", 50258, "column `tokens` holds id 50258"),  # would read the EOD row
        ("tokens", -3, "column `tokens` holds id -3, outside -2..50256"),  # would wrap to the last token
        ("patches", 470, "column `patches` holds symbol 470, outside the tokenizer's V'=470"),
    ],
)
@pytest.mark.parametrize("derive", [False, True])
def test_collator_refuses_ids_outside_the_vocabulary(gpt2_tokenizer, column, value, message, derive):
    tok = gpt2_tokenizer
    samples = _samples(tok)
    ok = Collator(tok, PatchSource(derive=derive), where="shards/")(samples)
    assert ok["patches"].shape == (2, 16, 10)
    samples[1][column][5] = value
    if column == "patches" and derive:
        Collator(tok, PatchSource(derive=True))(samples)  # derived patches never read the stored ones
        return
    with pytest.raises(ArtifactError, match=f"shards/: {message}.*hbpe shards verify --data shards/"):
        Collator(tok, PatchSource(derive=derive), where="shards/")(samples)


def test_collator_keeps_the_markers(gpt2_tokenizer):
    tok = gpt2_tokenizer
    samples = _samples(tok)
    samples[0]["tokens"][3:5] = [-1, -2]
    samples[0]["patches"] = tok.patches(samples[0]["tokens"])
    out = Collator(tok, PatchSource(derive=False))(samples)
    assert out["tokens"][0, 3:5].tolist() == [-1, -2]
    assert int(out["target_bytes"][0]) == int(np.take(tok.token_nbytes, samples[0]["tokens"][1:]).sum())


# ---- eval ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tiny_run, sample_shards):
    """The shared tiny run (a real Composer checkpoint); these tests only read it."""
    from hbpe.training.inference.evaluate import evaluate

    assert evaluate(str(tiny_run), str(sample_shards[1]), max_batches=2)["bpb"] > 0  # the undamaged shards evaluate
    return tiny_run


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_eval_refuses_damaged_shards(checkpoint, eval_copy, kind):
    from hbpe.training.inference.evaluate import evaluate

    damage(eval_copy, kind, "shard.00000.mds.zstd")
    problem = {"flip": "xxh64 does not match", "truncate": r"\d+ bytes, index.json records \d+", "missing": "missing"}
    with pytest.raises(ArtifactError, match=f"eval: shard file is damaged: shard.00000.mds.zstd: {problem[kind]}"):
        evaluate(str(checkpoint), str(eval_copy))
    r = CliRunner().invoke(main, ["eval", "--checkpoint", str(checkpoint), "--data", str(eval_copy)])
    assert r.exit_code == 2 and r.output.startswith("error:") and "Traceback" not in r.output
    assert "BPB" not in r.output


def test_eval_over_zero_bytes_is_an_error(checkpoint, gpt2_tokenizer_dir, tmp_path):
    """Documents of one token, 2 patches per sample: every predicted patch is an EOD, covering no text."""
    from hbpe.pipeline.beam.convert import run_convert
    from hbpe.training.inference.evaluate import evaluate

    src = tmp_path / "one-token-docs.jsonl"
    src.write_text("".join(json.dumps({"text": w}) + "\n" for w in ["the", "of", "and", "to", "a", "in"]))
    out = tmp_path / "shards"
    cfg = ConvertConfig(inputs=(str(src),), output=str(out), tokenizer=str(gpt2_tokenizer_dir), seq_len=2)
    m = run_convert(cfg, IN_MEMORY_BEAM, progress=False)
    assert (m["counts"]["samples"], m["counts"]["bytes"]) == (6, 13)  # text exists, yet no sample predicts any
    with pytest.raises(ArtifactError, match="evaluated samples cover 0 bytes of text.*bits per byte is undefined"):
        evaluate(str(checkpoint), str(out))


def test_training_refuses_a_shard_tokenizer_copy_that_does_not_match_the_manifest(sample_shards, tmp_path):
    from hbpe.pipeline.tokenizer import artifact

    d = tmp_path / "train"
    shutil.copytree(sample_shards[0], d)
    other = artifact.with_patch_size(load_shard_tokenizer(str(sample_shards[0])), max_patch_size=6, mode="full")
    artifact.save(other, d / "tokenizer", overwrite=True)
    with pytest.raises(ArtifactError, match="tokenizer does not match the manifest"):
        load_shard_tokenizer(str(d))


_BUILD_LOADER = """
import sys
from hbpe.pipeline.shards.reader import load_shard_tokenizer
from hbpe.training.data.loader import build_dataloader
shards, cache = sys.argv[1], sys.argv[2]
dl = build_dataloader(shards, load_shard_tokenizer(shards), batch_size=2, cache_dir=cache, shuffle=False, shuffle_seed=0)
print(len(next(iter(dl))["tokens"]))
"""


def test_loaders_built_at_once_by_several_processes_do_not_collide(sample_shards, tmp_path):
    """streaming's shared-memory prefix race (mosaicml/streaming#884): processes that start together."""
    import subprocess
    import sys

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BUILD_LOADER, str(sample_shards[0]), str(tmp_path / f"cache{i}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-500:] for _, err in results]
    assert [out.split()[-1] for out, _ in results] == ["2"] * 4
