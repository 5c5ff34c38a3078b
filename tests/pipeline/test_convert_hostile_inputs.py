"""`hbpe convert` against inputs built to hurt it (issue 28): each ends as a reject or one clear error.

- a decompression bomb (a small compressed file of one huge line) is a too_long reject, read past in
  bounded memory, in every line format, and the next line is still read;
- an empty, cut-short or garbage .parquet is an unreadable_input reject, beside files still converted;
- a FIFO, device or link to nothing given as --input is named as such; in a folder, it is listed as skipped;
"""

from __future__ import annotations

import bz2
import gzip
import json
import os
import tracemalloc
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.pipeline.beam.convert import run_convert
from hbpe.pipeline.corpus import documents
from hbpe.pipeline.corpus.documents import Document, RecordPolicy, Reject
from hbpe.pipeline.corpus.files import iter_documents
from hbpe.pipeline.corpus.inputs import resolve_inputs
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ConfigError
from tests.helpers import IN_MEMORY, cli_fails, exported

BOMB = 32 << 20  # the huge line: 32 MiB of text in a few KB of .gz/.zst/.bz2
MAX_DOC = 100_000
BOUND = 16 << 20  # what reading it may take at its peak (it took 160 MiB, five copies of the line, before)
COMPRESS = {
    "": lambda b: b,
    ".gz": lambda b: gzip.compress(b, 1),
    ".zst": lambda b: zstandard.ZstdCompressor().compress(b),
    ".bz2": lambda b: bz2.compress(b, 1),
}


def bomb(path: Path, *, text: bool = False) -> Path:
    """`path` holding one line of BOMB bytes, then one short good line, compressed as its name says."""
    huge, good = (b"a" * BOMB, b"the next line") if text else (b'{"text": "' + b"a" * BOMB + b'"}', b'{"text": "next"}')
    path.write_bytes(
        COMPRESS[next((s for s in COMPRESS if s and path.name.endswith(s)), "")](huge + b"\n" + good + b"\n")
    )
    return path


def read_all(path: Path, policy: RecordPolicy, **kw) -> tuple[list[Document | Reject], int]:
    """The records of `path` and the most memory reading them took (tracemalloc's peak, in bytes)."""
    tracemalloc.start()
    try:
        records = list(iter_documents(str(path), policy, **kw))
        return records, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "name, text_unit",
    [
        ("bomb.jsonl", "file"),
        ("bomb.jsonl.gz", "file"),
        ("bomb.jsonl.zst", "file"),
        ("bomb.jsonl.bz2", "file"),
        ("bomb.txt.gz", "line"),
        ("bomb.txt.zst", "file"),
    ],
)
def test_a_decompression_bomb_is_a_too_long_reject_read_in_bounded_memory(tmp_path, name, text_unit):
    path = bomb(tmp_path / name, text=".txt" in name)
    records, peak = read_all(path, RecordPolicy(max_doc_bytes=MAX_DOC), text_unit=text_unit)
    assert peak < BOUND, f"{peak >> 20} MiB"
    first = records[0]
    assert isinstance(first, Reject) and first.reason == "too_long" and first.offset == 0, first
    if text_unit == "file" and ".txt" in name:  # the whole file is the one record: read no further than the limit
        assert len(records) == 1
        assert first.detail == f"a record of more than {MAX_DOC} bytes > {MAX_DOC} (max_doc_bytes={MAX_DOC}): skipped unread"  # fmt: skip
        return
    limit = MAX_DOC if ".txt" in name else 6 * MAX_DOC + (1 << 20)
    size = BOMB + (0 if ".txt" in name else len('{"text": ""}'))
    assert first.detail.startswith(f"a record of {size} bytes > {limit} (")
    assert [(type(r).__name__, r.line) for r in records[1:]] == [("Document", 2)]  # read on after it
    assert records[1].offset == size + 1


def test_without_max_doc_bytes_a_record_over_the_default_ceiling_is_a_reject(tmp_path, monkeypatch):
    monkeypatch.setattr(documents, "DEFAULT_MAX_RECORD_BYTES", 1 << 20)  # 1 GiB takes too long to write here
    records, peak = read_all(bomb(tmp_path / "bomb.jsonl.gz"), RecordPolicy())
    assert peak < BOUND, f"{peak >> 20} MiB"
    assert [(type(r).__name__, getattr(r, "reason", None)) for r in records] == [("Reject", "too_long"), ("Document", None)]  # fmt: skip
    assert records[0].detail.endswith(f"> {1 << 20} (hbpe's ceiling without --max-doc-bytes): skipped unread")


CEILING = 4 << 20  # hbpe's ceiling without --max-doc-bytes, lowered from 1 GiB to keep the file small
ZSTD_OUTPUT = 8 << 20  # what one of _ZstdReader's feeds may decompress to, held beside the line


@pytest.mark.parametrize("name", ["long.jsonl", "long.jsonl.gz", "long.jsonl.zst"])
def test_a_line_over_the_default_ceiling_is_rejected_holding_no_more_than_the_ceiling(tmp_path, monkeypatch, name):
    """(issue 35) Without --max-doc-bytes, a 3 GB single-line .gz took 2.2 GB before the 1 GiB ceiling rejected
    it: the line was read whole up to the ceiling, then joined into a second copy. Read in chunks that are
    dropped once the line is known too long, it takes the ceiling and a chunk (before: 2x the ceiling)."""
    monkeypatch.setattr(documents, "DEFAULT_MAX_RECORD_BYTES", CEILING)
    line = b'{"text": "' + b"a" * (10 << 20) + b'"}'
    path = tmp_path / name
    path.write_bytes(COMPRESS[next((s for s in COMPRESS if s and name.endswith(s)), "")](line + b'\n{"text": "ok"}\n'))
    records, peak = read_all(path, RecordPolicy())
    bound = CEILING + (2 << 20) + (ZSTD_OUTPUT if name.endswith(".zst") else 0)  # 1 MiB over it, measured
    assert peak < bound, f"{peak / CEILING:.2f} x the ceiling"
    assert [(type(r).__name__, getattr(r, "reason", None)) for r in records] == [("Reject", "too_long"), ("Document", None)]  # fmt: skip
    assert records[0].detail == (
        f"a record of {len(line)} bytes > {CEILING} (hbpe's ceiling without --max-doc-bytes): skipped unread"
    )
    assert (records[1].offset, records[1].line, records[1].text) == (len(line) + 1, 2, "ok")


@pytest.mark.parametrize("size", [CEILING - 1, CEILING, CEILING + 1])
def test_lines_at_the_ceiling_read_in_chunks_are_kept_whole_or_rejected(tmp_path, monkeypatch, size):
    """The chunked reader draws the line at the same byte as before: a record of CEILING bytes is kept."""
    monkeypatch.setattr(documents, "DEFAULT_MAX_RECORD_BYTES", CEILING)
    text = "b" * (size - len('{"text": ""}'))
    path = tmp_path / "edge.jsonl.gz"
    path.write_bytes(gzip.compress(json.dumps({"text": text}).encode() + b"\r\n", 1))
    [record] = list(iter_documents(str(path), RecordPolicy()))
    if size <= CEILING:
        assert isinstance(record, Document) and record.text == text
    else:
        assert record.reason == "too_long" and record.detail.startswith(f"a record of {size} bytes > {CEILING} (")


def convert(tok_dir, src: Path, out: Path, runner: str, **kw) -> dict:
    cfg = ConvertConfig(inputs=(str(src),), output=str(out), tokenizer=str(tok_dir), seq_len=16, tail="pad", **kw)
    if runner == "inprocess":
        return run_convert(cfg, runner="inprocess", workers=1, progress=False)
    return run_convert(cfg, IN_MEMORY, progress=False)


def rejects(out: Path) -> list[tuple[str, str]]:
    lines = (out / "rejects" / "rejects.jsonl").read_text().splitlines()
    return [(Path(r["source"]).name, r["reason"]) for r in map(json.loads, lines)]


@pytest.mark.parametrize("runner", ["inprocess", "DirectRunner"])
def test_a_bomb_beside_good_files_is_set_aside_and_the_rest_converted(tmp_path, gpt2_tokenizer_dir, runner):
    src = tmp_path / "in"
    src.mkdir()
    bomb(src / "a-bomb.jsonl.gz")
    (src / "b-good.jsonl").write_text('{"text": "a good document"}\n')
    out = tmp_path / "out"
    if runner == "inprocess":  # one unit at a time, in this process; Beam's own allocations would blur the line's
        tracemalloc.start()
        try:
            m = convert(gpt2_tokenizer_dir, src, out, runner, max_doc_bytes=MAX_DOC)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 2 * BOUND, f"{peak >> 20} MiB"
    else:
        m = convert(gpt2_tokenizer_dir, src, out, runner, max_doc_bytes=MAX_DOC)
    assert m["counts"]["rejected_by_reason"] == {"too_long": 1}
    assert m["counts"]["documents_read"] == 3 and m["counts"]["documents_written"] == 2
    assert rejects(out) == [("a-bomb.jsonl.gz", "too_long")]
    assert exported(out, tmp_path) == ["next", "a good document"]


# ---- damaged Parquet -----------------------------------------------------------------------------


def parquet_bytes(texts: list[str]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buf)
    return buf.getvalue()


def test_damaged_parquet_files_are_unreadable_input_rejects_beside_a_good_file(tmp_path, gpt2_tokenizer_dir):
    src = tmp_path / "in"
    src.mkdir()
    good = parquet_bytes(["kept from parquet"])
    (src / "a-empty.parquet").write_bytes(b"")
    (src / "b-cut.parquet").write_bytes(good[: len(good) // 2])
    (src / "c-garbage.parquet").write_bytes(b"not parquet at all\n" * 10)
    (src / "d-good.parquet").write_bytes(good)
    (src / "e-good.jsonl").write_text('{"text": "kept from jsonl"}\n')
    out = tmp_path / "out"
    m = convert(gpt2_tokenizer_dir, src, out, "inprocess")  # was: internal error: ArrowInvalid, nothing converted
    assert m["counts"]["rejected_by_reason"] == {"unreadable_input": 3}
    assert rejects(out) == [(n, "unreadable_input") for n in ("a-empty.parquet", "b-cut.parquet", "c-garbage.parquet")]
    assert exported(out, tmp_path) == ["kept from parquet", "kept from jsonl"]
    # alone, through the CLI: a conversion of no document, the file set aside with its reason
    alone = tmp_path / "alone"
    r = CliRunner().invoke(
        main,
        [
            "convert",
            "--tokenizer",
            str(gpt2_tokenizer_dir),
            "--input",
            str(src / "b-cut.parquet"),
            "--out",
            str(alone),
        ],  # fmt: skip
    )
    assert r.exit_code == 0, r.output
    assert rejects(alone) == [("b-cut.parquet", "unreadable_input")]


# ---- what is no regular file ---------------------------------------------------------------------


def run_cli(*args: str):
    return CliRunner().invoke(main, ["convert", *args])


def test_a_fifo_or_device_given_as_input_is_named_as_such(tmp_path, gpt2_tokenizer_dir):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    tok = ("--tokenizer", str(gpt2_tokenizer_dir), "--out", str(tmp_path / "out"))
    cli_fails(run_cli(*tok, "--input", str(fifo)), 2, f"--input '{fifo}' is not a regular file (a FIFO): ")
    cli_fails(run_cli(*tok, "--input", "/dev/zero"), 2, "--input '/dev/zero' is not a regular file (a character device)")  # fmt: skip
    with pytest.raises(ConfigError, match=r"is a link to '.*/nowhere.jsonl', which does not exist; fix the link"):
        resolve_inputs([str(tmp_path / "gone.jsonl")])  # the CLI says it "does not exist" before


def test_fifos_and_links_to_nothing_in_a_folder_are_listed_as_skipped(tmp_path, gpt2_tokenizer_dir):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "read"}\n')
    os.mkfifo(src / "b-pipe.jsonl")
    (src / "c-gone.jsonl").symlink_to(src / "nowhere.jsonl")
    out = tmp_path / "out"
    r = run_cli(
        "--tokenizer",
        str(gpt2_tokenizer_dir),
        "--input",
        str(src),
        "--out",
        str(out),
        "--seq-len",
        "16",
        "--tail",
        "pad",
    )
    assert r.exit_code == 0, r.output
    skipped = [
        {"path": f"{src}/b-pipe.jsonl", "reason": "not_a_regular_file"},
        {"path": f"{src}/c-gone.jsonl", "reason": "dangling_link"},
    ]
    assert json.loads((out / "manifest.json").read_text())["skipped_inputs"] == skipped
    assert "inputs skipped (not a file)  2" in r.stdout
    assert (
        f"skipped 2 input path(s) that are no regular file (a FIFO, socket or device, or a link to nothing): "
        f"{src}/b-pipe.jsonl (not_a_regular_file), {src}/c-gone.jsonl (dangling_link); the manifest lists them "
        "under skipped_inputs"
    ) in r.stderr
    assert exported(out, tmp_path) == ["read"]


# ---- an output prefix a store keeps as written ---------------------------------------------------


@pytest.mark.parametrize("out, fixed", [("s3://b/a/../b", "s3://b/b"), ("gs://b/a//b/", "gs://b/a/b")])
def test_an_output_prefix_with_dot_dot_or_empty_parts_is_refused_up_front(tmp_path, gpt2_tokenizer_dir, out, fixed):
    """Before: the shards were written under keys like `a/../b/index.json`, which hbpe's own downloads refuse."""
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "x"}\n')
    r = run_cli("--tokenizer", str(gpt2_tokenizer_dir), "--input", str(src), "--out", out)
    cli_fails(r, 2, f"--out {out}: the object prefix ")
    assert r.output.rstrip().endswith(f"hbpe refuses to download such names: write {fixed}")
    cfg = ConvertConfig(inputs=(str(src),), output=out, tokenizer=str(gpt2_tokenizer_dir))
    with pytest.raises(ConfigError, match=r"has an empty, '\.' or '\.\.' part"):
        run_convert(cfg, runner="inprocess", progress=False)  # the library checks it too, before any store is reached
