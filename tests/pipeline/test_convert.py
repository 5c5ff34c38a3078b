"""The Beam conversion pipeline end to end: real DirectRunner runs, real MDS shards."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import zstandard

from hbpe.pipeline.shards.reader import ShardDir
from hbpe.pipeline.shards.tools import verify
from hbpe.schemas.errors import ArtifactError, ConfigError, HbpeError
from tests.conftest import SAMPLE_EN, SAMPLE_ZH, SHARED_DATA
from tests.helpers import bad_inputs, convert, dir_bytes, exported


def read_jsonl_texts(path: Path) -> list[str]:
    data = path.read_bytes()
    if path.suffix == ".zst":
        data = zstandard.ZstdDecompressor().stream_reader(data).read()
    return [json.loads(line)["text"] for line in data.decode().splitlines()]


def test_shared_corpora_multiprocessing_round_trip(tmp_path, gpt2_tokenizer_dir):
    en, zh = SHARED_DATA / "en-sotu.jsonl.zst", SHARED_DATA / "zh-kernel-docs.jsonl.zst"
    if not en.exists():
        en, zh = SAMPLE_EN, SAMPLE_ZH
    out = tmp_path / "shards"
    m = convert(
        gpt2_tokenizer_dir,
        [zh, en],
        out,
        args=["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
        tail="pad",
        seq_len=1024,
    )
    c = m["counts"]
    expected = read_jsonl_texts(en) + read_jsonl_texts(zh)  # sorted path order: en-... before zh-...
    assert c["documents_read"] == c["documents_written"] == len(expected) and c["documents_rejected"] == 0
    assert c["tail_patches_dropped"] == 0 and c["tail_patches_padded"] < 1024
    assert verify(ShardDir(out)) == []
    assert exported(out, tmp_path) == expected
    assert (out / "COMPLETED").exists() and not (out / ".hbpe-staging").exists()
    assert m["statistics"]["bytes_per_patch"] > 3


def test_rerun_is_byte_identical_and_independent_of_splitting(tmp_path, gpt2_tokenizer_dir):
    src = tmp_path / "in" / "corpus.jsonl"
    src.parent.mkdir()
    texts = read_jsonl_texts(SAMPLE_EN)[:12]
    src.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    assert src.stat().st_size > 3 * 65536
    outs = []
    for out, split in ((tmp_path / "a", 1 << 26), (tmp_path / "a", 1 << 26), (tmp_path / "c", 65536)):
        m = convert(gpt2_tokenizer_dir, [src], out, split_bytes=split, shard_bytes=1 << 18, overwrite=True)
        files = dir_bytes(out)
        manifest = json.loads(files.pop("manifest.json"))
        assert manifest == m
        del manifest["timing"]
        outs.append((files, manifest))
    (a, ma), (b, mb), (c, mc) = outs
    assert a == b and ma == mb  # the same run twice: byte-identical, timing aside
    shards = lambda d: {k: v for k, v in d.items() if k.startswith("shard.") or k == "index.json"}  # noqa: E731
    assert len(shards(a)) > 2 and shards(a) == shards(c)  # 4 byte-range units, the same shards
    assert ma["counts"] == mc["counts"]


def test_bad_inputs_are_counted_and_set_aside(tmp_path, gpt2_tokenizer_dir):
    src = tmp_path / "in"
    src.mkdir()
    bad_inputs(src)
    out = tmp_path / "out"
    m = convert(gpt2_tokenizer_dir, [src], out, max_doc_bytes=300, tail="pad")
    c = m["counts"]
    assert c["documents_read"] == c["documents_written"] + c["documents_rejected"]
    by = c["rejected_by_reason"]
    assert by == {
        "blank_line": 1,
        "empty_text": 1,
        "invalid_utf8": 2,
        "malformed_json": 1,
        "missing_text_field": 1,
        "non_string_text": 1,
        "not_an_object": 1,
        "too_long": 1,
        "unreadable_input": 2,
    }
    rejects = [json.loads(line) for line in (out / "rejects" / "rejects.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rejects[:9]] == [
        "malformed_json",
        "not_an_object",
        "missing_text_field",
        "non_string_text",
        "invalid_utf8",
        "invalid_utf8",
        "empty_text",
        "blank_line",
        "too_long",
    ]
    assert rejects[0]["line"] == 2 and rejects[0]["source"].endswith("a.jsonl") and rejects[2]["doc_id"] == "no-text"
    assert {r["source"].rsplit("/", 1)[1] for r in rejects if r["reason"] == "unreadable_input"} == {
        "b.jsonl.zst",
        "c.jsonl.gz",
    }
    docs = exported(out, tmp_path)
    assert docs[:2] == ["first good document", "second good document"] and docs[-1] == "bz2 ok"
    assert docs.count("zstd document") == 50  # the complete first frame is kept


def test_invalid_utf8_replace_option(tmp_path, gpt2_tokenizer_dir):
    src = tmp_path / "x.jsonl"
    src.write_bytes(b'{"text": "caf\xe9"}\n{"text": "\\udc80 lone"}\n')
    out = tmp_path / "out"
    m = convert(gpt2_tokenizer_dir, [src], out, invalid_utf8="replace", tail="pad")
    assert m["counts"]["documents_rejected"] == 0
    assert exported(out, tmp_path) == ["caf\ufffd", "? lone"]


def test_parquet_nested_field_and_text_files(tmp_path, gpt2_tokenizer_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "in"
    src.mkdir()
    table = pa.table(
        {"doc": [{"body": "parquet one"}, {"body": "parquet two"}, {"other": "x"}], "id": ["p1", "p2", "p3"]}
    )
    pq.write_table(table, src / "a.parquet", row_group_size=1)
    (src / "b.txt").write_text("a whole file\nwith two lines")
    out = tmp_path / "out"
    m = convert(gpt2_tokenizer_dir, [src / "a.parquet"], out, text_field="doc.body", tail="pad")
    assert m["counts"]["rejected_by_reason"] == {"missing_text_field": 1}
    assert exported(out, tmp_path) == ["parquet one", "parquet two"]
    out2 = tmp_path / "out2"
    convert(gpt2_tokenizer_dir, [src / "b.txt"], out2, tail="pad")
    assert exported(out2, tmp_path) == ["a whole file\nwith two lines"]
    out3 = tmp_path / "out3"
    convert(gpt2_tokenizer_dir, [src / "b.txt"], out3, tail="pad", text_unit="line")
    assert exported(out3, tmp_path) == ["a whole file", "with two lines"]


def test_verify_detects_corruption_and_manifest_mismatch(tmp_path, gpt2_tokenizer_dir):
    out = tmp_path / "out"
    convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out, shard_bytes=1 << 18)
    assert verify(ShardDir(out)) == []
    shard = out / "shard.00001.mds.zstd"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert any("shard.00001.mds.zstd" in p and "does not match" in p for p in verify(ShardDir(out)))
    shard.write_bytes(
        bytes(data[: len(data) // 2] + bytearray([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1 :])
    )
    mpath = out / "manifest.json"
    m = json.loads(mpath.read_text())
    m["counts"]["samples"] += 1
    mpath.write_text(json.dumps(m))
    assert any("manifest counts" in p for p in verify(ShardDir(out)))


def test_failure_mid_run_commits_nothing(tmp_path, gpt2_tokenizer_dir, monkeypatch):
    from hbpe.pipeline.beam import write_shards as shards

    real = shards._WriteShardFn.process

    def failing(self, task):
        if task.index == 1:
            raise RuntimeError("simulated worker crash")
        yield from real(self, task)

    monkeypatch.setattr(shards._WriteShardFn, "process", failing)
    out = tmp_path / "out"
    with pytest.raises(HbpeError, match="nothing was committed.*simulated worker crash"):
        convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out, shard_bytes=1 << 18)
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert not [n for n in left if n.startswith("shard.") or n in ("index.json", "manifest.json", "COMPLETED")]
    # nothing committed: no index.json nor manifest.json, so not even an unfinished conversion
    with pytest.raises(ArtifactError, match=rf"^{re.escape(str(out))} is not a shard directory \(no index.json or"):
        ShardDir(out)


def test_existing_output_is_refused_without_overwrite(tmp_path, gpt2_tokenizer_dir):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match="is not empty and holds files hbpe did not write: keep.txt"):
        convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out)
    (out / "keep.txt").unlink()
    convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out)
    with pytest.raises(ConfigError, match="exists and is not empty; pass --overwrite"):
        convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out)
    with pytest.raises(ConfigError, match="matches no file"):
        convert(gpt2_tokenizer_dir, [tmp_path / "nope-*.jsonl"], tmp_path / "o2")
