"""A large compressed file cut into ranges of its text, so that several workers encode it: the same records,
rejects (line numbers and offsets included) and shards as the file read whole, for every compression."""

from __future__ import annotations

import bz2
import gzip
from pathlib import Path

import pytest
import zstandard

from hbpe.pipeline.beam.convert import run_convert
from hbpe.pipeline.corpus.documents import RecordPolicy
from hbpe.pipeline.corpus.files import (
    MAX_PIECES,
    SPREAD_UNITS,
    FileInfo,
    WorkUnit,
    file_info,
    iter_unit,
    plan_units,
)
from hbpe.schemas.convert_config import ConvertConfig
from tests.conftest import SAMPLE_EN
from tests.helpers import dir_bytes

BAD = [
    b'{"id": "bad-json", "text": "unterminated',
    b'["not", "an", "object"]',
    b'{"id": "bad-utf8", "text": "caf\xe9"}',
    b'{"id": "big", "text": "' + b"y" * 70_000 + b'"}',  # over max_doc_bytes (60 kB) below: too long
    b"   ",
]


def text_with_bad_records() -> bytes:
    """The sample's 24 documents (~1 MB) with a bad record after every 2nd."""
    good = zstandard.ZstdDecompressor().stream_reader(SAMPLE_EN.read_bytes()).read().splitlines()
    out = []
    for i, line in enumerate(good):
        out.append(line)
        if i % 2 == 0:
            out.append(BAD[i // 2 % len(BAD)])
    return b"\n".join(out) + b"\n"


COMPRESS = {
    "jsonl.zst": lambda b: zstandard.ZstdCompressor().compress(b),
    "jsonl.gz": lambda b: gzip.compress(b, mtime=0),
    "jsonl.bz2": bz2.compress,
}


def records(path: Path, split_bytes: int) -> tuple[int, list]:
    units = plan_units([file_info(str(path))], split_bytes=split_bytes)
    policy = RecordPolicy(max_doc_bytes=60_000)
    return len(units), [r for u in units for r in iter_unit(u, policy)]


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
@pytest.mark.parametrize("truncated", [False, True], ids=["whole", "truncated"])
def test_ranges_of_a_compressed_file_read_as_the_whole_file(tmp_path, suffix, truncated):
    data = COMPRESS[suffix](text_with_bad_records())
    path = tmp_path / f"in.{suffix}"
    path.write_bytes(data[: len(data) * 2 // 3] if truncated else data)  # cut inside the text: one reject
    n_whole, whole = records(path, 1 << 30)
    n_cut, cut = records(path, 65536)
    assert (n_whole, n_cut) == (1, MAX_PIECES)
    assert cut == whole  # documents and rejects, their offsets and line numbers
    reasons = [getattr(r, "reason", None) for r in whole]
    assert reasons.count("unreadable_input") == int(truncated)
    if not truncated:  # (bz2 decompresses 900 kB blocks: a truncated file yields nothing before its reject)
        assert reasons.count(None) >= 10 and {"malformed_json", "not_an_object", "invalid_utf8", "too_long"} <= set(
            reasons
        )
    assert all(r.line is not None for r in whole if getattr(r, "reason", None) != "unreadable_input")


def test_which_compressed_files_are_cut():
    zst = FileInfo("/a.jsonl.zst", 10 << 20, 0.0, "jsonl", "zstd")  # about 40 MiB of text
    assert len(plan_units([zst], split_bytes=64 << 20)) == 1  # under split_bytes of text: whole
    assert len(plan_units([zst], split_bytes=16 << 20)) == 3  # one unit per split_bytes of text
    assert len(plan_units([zst], split_bytes=1 << 20)) == MAX_PIECES  # each unit reads the text before it
    assert len(plan_units([zst] * SPREAD_UNITS, split_bytes=1 << 20)) == SPREAD_UNITS  # every worker has files
    txt = FileInfo("/a.txt.zst", 10 << 20, 0.0, "text", "zstd")  # one document per file: never cut
    assert len(plan_units([txt], split_bytes=1 << 20)) == 1
    assert len(plan_units([txt], split_bytes=1 << 20, text_unit="line")) == MAX_PIECES


def test_conversion_of_a_cut_file_writes_the_same_shards_and_rejects(tmp_path, gpt2_tokenizer_dir):
    src = tmp_path / "in.jsonl.zst"
    src.write_bytes(COMPRESS["jsonl.zst"](text_with_bad_records()))
    outs = {}
    for name, split in (("whole", 1 << 30), ("cut", 65536)):
        cfg = ConvertConfig(
            inputs=(str(src),), output=str(tmp_path / name), tokenizer=str(gpt2_tokenizer_dir), seq_len=128,
            split_bytes=split, shard_bytes=1 << 20, max_doc_bytes=60_000,
        )  # fmt: skip
        m = run_convert(cfg, runner="inprocess", workers=2, progress=False)
        files = dir_bytes(tmp_path / name)
        del files["manifest.json"]  # its config holds split_bytes, its timing the run
        outs[name] = (m["counts"], files)
    assert outs["cut"] == outs["whole"]
    assert outs["whole"][0]["documents_rejected"] > 10 and len(outs["whole"][1]) > 4


LINE = 16  # every line of the file below: `{"text":"k=NN"}` and its newline
COMPRESSION = {"jsonl": None, "jsonl.gz": "gzip", "jsonl.bz2": "bzip2", "jsonl.zst": "zstd"}


def sixteen_byte_lines(n: int) -> bytes:
    out = b"".join(b'{"text":"k=%02d"}\n' % k for k in range(n))
    assert len(out) == LINE * n
    return out


@pytest.mark.parametrize("suffix", sorted(COMPRESSION))
@pytest.mark.parametrize("split", [4 * LINE, 4 * LINE + 5], ids=["on-a-line-start", "inside-a-line"])
def test_a_line_starting_exactly_on_a_range_boundary_is_read_once(tmp_path, suffix, split):
    """A range owns the lines that *start* inside it, [start, end): a line starting at `end` is the next range's.
    Before (a planted `pos <= end` in _iter_lines), no test put a line start on a boundary, and such a line was
    read by both ranges: a duplicate record. Ranges are made by hand at multiples of `split`, as plan_units cuts
    a plain file, and through the compressed reader (_skip_text) the same way."""
    data = sixteen_byte_lines(10)
    path = tmp_path / f"in.{suffix}"
    path.write_bytes(COMPRESS[suffix](data) if suffix in COMPRESS else data)
    starts = list(range(0, len(data), split))
    units = [
        WorkUnit(i, 0, str(path), "jsonl", COMPRESSION[suffix], start, starts[i + 1] if i + 1 < len(starts) else None)
        for i, start in enumerate(starts)
    ]
    per_unit = [list(iter_unit(u, RecordPolicy())) for u in units]
    read = [r for records in per_unit for r in records]
    assert [(r.offset, r.text) for r in read] == [(k * LINE, f"k={k:02d}") for k in range(10)]  # each line once
    if COMPRESSION[suffix]:  # the skipped text is counted; a plain file's later ranges do not know their lines
        assert [r.line for r in read] == list(range(1, 11))
    owns = [[r.offset for r in records] for records in per_unit]
    assert owns == [[o for o in range(0, len(data), LINE) if s <= o < s + split] for s in starts]
