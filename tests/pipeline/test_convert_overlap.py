"""The in-process runner writes a shard as soon as the units before its end are encoded, not after all of them.

Real conversions of a real file cut into several units and shards: the shards are there while the
last unit still encodes, and the output is the same bytes as Beam's, whose PlanShards waits for
every unit (the serial plan) and whose units encode one batch at a time, in both layouts, for 1 to
3 workers, with either tail.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import zstandard

from hbpe.pipeline.beam import inprocess
from hbpe.pipeline.beam.convert import run_convert
from hbpe.pipeline.beam.shard_tasks import ReadyShards, plan_shards
from hbpe.pipeline.beam.units import UnitSummary
from hbpe.schemas.convert_config import ConvertConfig
from tests.conftest import IN_MEMORY_BEAM, SAMPLE_EN
from tests.helpers import dir_bytes, without_timing

WAIT_S = 20  # how long the last unit waits for a shard before it encodes: only a barrier makes it wait this long


def corpus(d: Path) -> Path:
    """One plain jsonl file of ~330 KB: six byte-range units of 64 KiB at the smallest --split-bytes."""
    d.mkdir(parents=True, exist_ok=True)
    lines = zstandard.ZstdDecompressor().stream_reader(SAMPLE_EN.read_bytes()).read().decode().splitlines()
    texts = [json.loads(x)["text"] for x in lines][:12]
    src = d / "e.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    return src


def convert(tok_dir, src, out, *, workers=None, store_patches=False, tail="drop", args=(), on_start=None, runner="inprocess"):  # fmt: skip
    cfg = ConvertConfig(
        inputs=(str(src),),
        output=str(out),
        tokenizer=str(tok_dir),
        seq_len=128,
        split_bytes=65536,
        shard_bytes=1 << 18,  # 85 samples of 128 patches: about a unit's worth, so several shards
        encode_batch_docs=1,  # batches of one document: several per unit, each encoding while the last is written
        tail=tail,
        store_patches=store_patches,
    )
    return run_convert(cfg, list(args), runner=runner, workers=workers, progress=False, on_start=on_start)


def _shard_files(staging: str) -> list[str]:
    d = Path(staging, "shards")
    return sorted(p.name for p in d.glob("shard.*.mds.zstd")) if d.is_dir() else []


@pytest.mark.parametrize("workers", [1, 2])
def test_shards_are_written_while_the_last_unit_encodes(tmp_path, gpt2_tokenizer_dir, monkeypatch, workers):
    """The last unit's encoding waits (up to WAIT_S) for a shard file in staging: with a barrier between encoding
    and writing, none comes, and it records none. In a forked worker too: the spy is in place before the fork."""
    src, seen = corpus(tmp_path / "in"), tmp_path / "seen.json"
    real, last = inprocess.encode_unit, []

    def spy(tok, unit, staging, *args, **kwargs):
        if unit.index == last[0]:
            deadline = time.monotonic() + WAIT_S
            while not _shard_files(staging) and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.write_text(json.dumps(_shard_files(staging)))
        return real(tok, unit, staging, *args, **kwargs)

    monkeypatch.setattr(inprocess, "encode_unit", spy)
    t = time.monotonic()
    m = convert(gpt2_tokenizer_dir, src, tmp_path / "out", workers=workers, on_start=lambda us: last.append(us[-1].index))  # fmt: skip
    assert last[0] >= 4 and len(m["shards"]) >= 5  # several units, several shards
    assert json.loads(seen.read_text())[:1] == ["shard.00000.mds.zstd"]
    assert time.monotonic() - t < WAIT_S  # it never waited out the deadline


@pytest.mark.parametrize(("store_patches", "tail"), [(False, "drop"), (True, "pad")], ids=["lean-drop", "stored-pad"])
def test_overlapped_output_is_byte_identical_to_the_serial_plan(tmp_path, gpt2_tokenizer_dir, store_patches, tail):
    src = corpus(tmp_path / "in")
    ref = convert(gpt2_tokenizer_dir, src, tmp_path / "beam", store_patches=store_patches, tail=tail, args=IN_MEMORY_BEAM, runner="auto")  # fmt: skip
    assert ref["timing"]["runner"] == "DirectRunner" and len(ref["shards"]) >= 5
    expected = without_timing(dir_bytes(tmp_path / "beam"))
    for workers in (1, 2, 3):
        out = tmp_path / f"w{workers}"
        convert(gpt2_tokenizer_dir, src, out, workers=workers, store_patches=store_patches, tail=tail)
        assert without_timing(dir_bytes(out)) == expected, f"{workers} workers"


@pytest.mark.parametrize("tail", ["drop", "pad"])
def test_ready_shards_are_the_plans_full_shards_in_any_arrival_order(tail):
    rng = random.Random(7)
    for _ in range(200):
        n, seq_len, spp = rng.randint(1, 12), rng.randint(1, 9), rng.randint(1, 4)
        units = [UnitSummary(i, stream_patches=rng.choice([0, 1, 3, seq_len * spp, rng.randint(0, 80)])) for i in range(n)]  # fmt: skip
        plan = plan_shards(units, seq_len=seq_len, samples_per_shard=spp, tail=tail)
        ready, got = ReadyShards(list(range(n)), seq_len=seq_len, samples_per_shard=spp), []
        for u in rng.sample(units, n):
            got += ready.add(u)
        full = plan.total_patches // (seq_len * spp)  # the shards that end inside the stream
        assert tuple(got) == plan.tasks[:full] and ready.handed_out == full
