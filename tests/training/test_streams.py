"""Several training streams mixed by weight (streaming's `Stream`), each checked as one shard directory is.

The two streams are the bundled sample's train and held-out shards (same tokenizer); every sample is
traced back to its stream by its tokens, so the counts are the mix streaming really drew.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest

from hbpe.pipeline.shards.reader import ShardDir, load_shard_tokenizer, read_manifest
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.training.data.loader import StreamingOptions, StreamSpec, build_dataloader, epoch_samples, stream_source
from hbpe.training.train.config_io import load_config
from hbpe.training.train.trainer import train


@pytest.fixture(scope="module")
def origin(sample_shards) -> dict[bytes, str]:
    """tokens of every sample -> the stream it is in."""
    return {
        s["tokens"].tobytes(): name for name, d in zip(("train", "eval"), sample_shards) for s in ShardDir(d).samples()
    }


def _draw(streams, *, seed=17, epoch_size=None) -> list[bytes]:
    """One epoch's samples in streaming's order (one process)."""
    tok = load_shard_tokenizer(streams[0].remote)
    options = StreamingOptions(epoch_size=epoch_size)
    dl = build_dataloader(streams, tok, batch_size=1, cache_dir=None, shuffle=True, shuffle_seed=seed, options=options)
    return [s["tokens"].tobytes() for s in dl.dataset]


def _streams(sample_shards, cache, **weights) -> list[StreamSpec]:
    (train, held), (w_train, w_held) = sample_shards, (weights["train"], weights["eval"])
    return [StreamSpec(str(train), str(cache / "a"), **w_train), StreamSpec(str(held), str(cache / "b"), **w_held)]


@pytest.mark.parametrize(
    "weights,epoch_size",
    [
        ({"train": {"proportion": 3.0}, "eval": {"proportion": 1.0}}, 40),  # relative: 3/4 and 1/4 of 40
        ({"train": {"repeat": 0.25}, "eval": {"choose": 7}}, None),  # absolute: a quarter of train, 7 of eval
    ],
)
def test_streams_mix_by_weight_in_a_fixed_order(sample_shards, origin, tmp_path, weights, epoch_size):
    streams = _streams(sample_shards, tmp_path / "1", **weights)
    drawn = _draw(streams, epoch_size=epoch_size)
    n_train = read_manifest(sample_shards[0]).counts.samples
    want = {"train": 30, "eval": 10} if epoch_size else {"train": int(0.25 * n_train), "eval": 7}
    assert Counter(origin[t] for t in drawn) == want
    assert epoch_samples(streams, epoch_size) == len(drawn) == sum(want.values())  # what check_samples counts
    # the same mix in the same order from fresh caches; another seed, another order
    assert _draw(_streams(sample_shards, tmp_path / "2", **weights), epoch_size=epoch_size) == drawn
    other = _draw(_streams(sample_shards, tmp_path / "3", **weights), seed=18, epoch_size=epoch_size)
    assert other != drawn and Counter(origin[t] for t in other) == want


def test_a_mix_shares_the_first_stage_and_seq_len(sample_shards):
    train, held = (str(p) for p in sample_shards)
    tok = load_shard_tokenizer(train)
    m = read_manifest(train)
    same = [StreamSpec(train, "/unused/a", manifest=m), StreamSpec(held, "/unused/b")]
    assert stream_source(same, tok).derive is True  # lean shards (the default): patches derived from tokens
    stored = [dataclasses.replace(read_manifest(s.remote), columns=["num_bytes", "patches", "tokens"]) for s in same]
    with_patches = [dataclasses.replace(s, manifest=m) for s, m in zip(same, stored, strict=True)]
    assert stream_source(with_patches, tok).derive is False  # both hold this tokenizer's patches: read them
    other_s = dataclasses.replace(m, tokenizer_fingerprint="f" * 64, max_patch_size=8)  # same first stage
    assert stream_source([same[1], StreamSpec(train, "/unused/a", manifest=other_s)], tok).derive is True
    other_bpe = dataclasses.replace(m, tokenizer_fingerprint="f" * 64, first_stage_fingerprint="e" * 64)
    with pytest.raises(ArtifactError, match=rf"^{train} was tokenized with another first-stage BPE \(fingerprint eeee"):
        stream_source([same[1], StreamSpec(train, "/unused/a", manifest=other_bpe)], tok)
    longer = dataclasses.replace(m, seq_len=256)
    with pytest.raises(ArtifactError, match=rf"{train} has samples of 256 patches and {held} of 128: .*--seq-len"):
        stream_source([same[1], StreamSpec(train, "/unused/a", manifest=longer)], tok)


def test_every_stream_is_checked_before_streaming_reads_it(sample_shards, train_copy, tmp_path):
    held = str(sample_shards[1])
    tok = load_shard_tokenizer(held)
    shard = next(p for p in sorted(train_copy.iterdir()) if p.name.startswith("shard."))
    shard.write_bytes(shard.read_bytes()[:-1] + bytes([shard.read_bytes()[-1] ^ 1]))  # one flipped bit
    streams = [StreamSpec(held, str(tmp_path / "b")), StreamSpec(str(train_copy), str(tmp_path / "a"))]
    with pytest.raises(ArtifactError, match=rf"{train_copy}.*{shard.name}"):
        build_dataloader(streams, tok, batch_size=1, cache_dir=None, shuffle=True, shuffle_seed=0)
    small = StreamingOptions(cache_limit=1000)
    with pytest.raises(
        ConfigError, match=r"^data\.cache_limit=1000 bytes is less than 4x the largest shard \(\d+ bytes"
    ):
        build_dataloader(streams[:1], tok, batch_size=1, cache_dir=None, shuffle=True, shuffle_seed=0, options=small)


def test_train_on_a_mix_of_streams(sample_shards, tmp_path):
    train_dir, held = sample_shards
    mix = f"data.streams=[{{remote: {train_dir}, proportion: 3}}, {{remote: {held}, proportion: 1}}]"
    base = ["data.train=null", "data.eval=null", "max_duration=2ba", "save_interval=2ba", "console=false"]
    with pytest.raises(ConfigError, match=r"^data\.streams\[1\]\.remote path .*/nope does not exist"):
        load_config("tiny", [*base, f"data.streams=[{{remote: {train_dir}}}, {{remote: {tmp_path}/nope}}]"])
    folder = tmp_path / "run"
    r = train(load_config("tiny", [*base, mix, "data.epoch_size=64", f"save_folder={folder}"]))
    assert r["batches"] == 2 and r["seq_len"] == 128
    caches = sorted(p.name.rsplit("-", 1)[0] for p in (folder / "stream-cache" / "train-streams").iterdir())
    assert caches == [held.name, train_dir.name]  # one cache per stream, named by its shards
    recorded = json.loads((folder / "hbpe_run.json").read_text())["train_config"]["data"]
    assert [s["proportion"] for s in recorded["streams"]] == [3.0, 1.0] and recorded["epoch_size"] == 64
