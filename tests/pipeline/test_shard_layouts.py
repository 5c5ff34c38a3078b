"""Lean shards (the default: `tokens` and `num_bytes`) and `--store-patches` shards (today's layout, `patches` too).

Both layouts of one corpus cut the same shards of the same samples: readers derive a lean shard's
patches with the tokenizer the manifest names, and training sees tensor-equal batches either way.
Shards of every earlier hbpe (manifest version 1, no `columns`) keep loading, training and verifying.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from hbpe import api
from hbpe.cli import main
from hbpe.pipeline.beam import inprocess as inprocess_module
from hbpe.pipeline.beam.convert import run_convert
from hbpe.pipeline.shards.reader import ShardDir, load_shard_tokenizer, read_manifest
from hbpe.pipeline.shards.tools import export_text_to, inspect, verify
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ArtifactError, ConfigError, HbpeError
from hbpe.training.data.loader import (
    PatchSource,
    StreamSpec,
    build_dataloader,
    check_compatible,
    check_shards,
    stop_downloads,
    stream_source,
)
from tests.conftest import SAMPLE_EN
from tests.helpers import cli_fails, dir_bytes, without_timing

pytestmark = pytest.mark.e2e  # converts corpora (and streams them)

SEQ_LEN = 64
SHARD_BYTES = 1 << 16  # 42 samples of 64 patches at S=10: 3 shards of the corpus below
LEAN = ["num_bytes", "tokens"]
STORED = ["num_bytes", "patches", "tokens"]


def corpus(folder: Path, docs: int = 3) -> Path:
    import zstandard

    lines = zstandard.ZstdDecompressor().stream_reader(SAMPLE_EN.read_bytes()).read().decode().splitlines()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "corpus.jsonl"
    path.write_text("\n".join(lines[:docs]) + "\n")
    return path


def cfg(tok_dir, src: Path, out: Path, **kw) -> ConvertConfig:
    return ConvertConfig(
        inputs=(str(src),), output=str(out), tokenizer=str(tok_dir), seq_len=SEQ_LEN, shard_bytes=SHARD_BYTES, **kw
    )


def convert(config: ConvertConfig, **kw) -> dict:
    return run_convert(config, runner="inprocess", workers=1, progress=False, **kw)


def as_todays_main_writes(folder: Path) -> None:
    """Rewrite a --store-patches conversion's manifest as hbpe before lean shards wrote it: version 1, shard
    schema 1, no `columns`, no `store_patches` in its config (its shards and index.json are those bytes already)."""
    m = json.loads((folder / "manifest.json").read_text())
    del m["columns"], m["config"]["store_patches"]
    m.update(version=1, shard_schema_version=1)
    (folder / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")


@pytest.fixture(scope="module")
def layouts(tmp_path_factory, gpt2_tokenizer_dir) -> dict[str, Path]:
    """{"lean", "stored", "v1"}: one corpus converted by default and with `store_patches=True` (the Python API),
    and that stored one under the manifest today's main writes."""
    root = tmp_path_factory.mktemp("layouts")
    src = corpus(root / "corpus")
    for name, store in (("lean", False), ("stored", True)):
        api.convert(src, root / name, tokenizer=gpt2_tokenizer_dir, seq_len=SEQ_LEN, shard_bytes=SHARD_BYTES,
                    store_patches=store, runner="inprocess", workers=1)  # fmt: skip
    shutil.copytree(root / "stored", root / "v1")
    as_todays_main_writes(root / "v1")
    return {name: root / name for name in ("lean", "stored", "v1")}


def test_hbpe_convert_store_patches_is_the_python_apis_option(tmp_path, gpt2_tokenizer_dir):
    src = corpus(tmp_path / "corpus")
    outs = {}
    for store in (False, True):
        outs[store] = tmp_path / f"cli-{store}"
        flag = ["--store-patches"] if store else []
        args = ["convert", "--tokenizer", str(gpt2_tokenizer_dir), "--input", str(src), "--out", str(outs[store]),
                "--seq-len", str(SEQ_LEN), "--runner", "inprocess", "--workers", "1", *flag]  # fmt: skip
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        row = "1 (num_bytes, patches, tokens)" if store else "1 (num_bytes, tokens; patches derived from tokens)"
        assert f"shards                   {row}\n" in r.output, r.output
    api_out = tmp_path / "api"
    api.convert(src, api_out, tokenizer=gpt2_tokenizer_dir, seq_len=SEQ_LEN, store_patches=True, runner="inprocess")
    assert without_timing(dir_bytes(outs[True])) == without_timing(dir_bytes(api_out))
    assert read_manifest(outs[False]).columns == LEAN


def shard_columns_of(folder: Path) -> list[dict[str, np.ndarray]]:
    sd = ShardDir(folder)
    return [sd.read_columns(e) for e in sd.shard_entries]


# ---- the two layouts ----------------------------------------------------------------------------------------


def test_lean_is_the_default_and_store_patches_keeps_todays_columns(layouts, gpt2_tokenizer):
    lean, stored = read_manifest(layouts["lean"]), read_manifest(layouts["stored"])
    assert (lean.columns, lean.shard_schema_version, lean.config["store_patches"]) == (LEAN, 2, False)
    assert (stored.columns, stored.shard_schema_version, stored.config["store_patches"]) == (STORED, 2, True)
    for name, columns in (("lean", LEAN), ("stored", STORED)):
        raw = json.loads((layouts[name] / "manifest.json").read_text())
        assert (raw["version"], raw["columns"]) == (2, columns)
        index = json.loads((layouts[name] / "index.json").read_text())
        assert [e["column_names"] for e in index["shards"]] == [columns] * 3
    # today's encodings, exactly, in the stored layout (its shard bytes are MDSWriter's: test_shard_plan.py)
    (entry, *_) = json.loads((layouts["stored"] / "index.json").read_text())["shards"]
    assert entry["column_encodings"] == ["int64", "ndarray:uint16:64,10", "ndarray:int32:64"]
    assert entry["column_sizes"] == [8, 1280, 256]
    # the same shards of the same samples; the stored patches are the tokenizer's rows of the tokens
    assert lean.shards == stored.shards and lean.counts == stored.counts
    for a, b in zip(shard_columns_of(layouts["lean"]), shard_columns_of(layouts["stored"]), strict=True):
        assert a.keys() == {"num_bytes", "tokens"}
        assert np.array_equal(a["tokens"], b["tokens"]) and np.array_equal(a["num_bytes"], b["num_bytes"])
        assert np.array_equal(b["patches"], gpt2_tokenizer.patches(b["tokens"]))


def test_lean_shards_take_at_most_0_4_of_the_bytes_on_disk(layouts):
    def on_disk(folder: Path) -> int:
        return sum(p.stat().st_size for p in folder.glob("shard.*.mds.zstd"))

    ratio = on_disk(layouts["lean"]) / on_disk(layouts["stored"])
    assert 0.2 < ratio <= 0.4, ratio  # measured 0.34: tokens compress to ~1 byte, patches to ~2


@pytest.mark.parametrize("name", ["lean", "stored", "v1"])
def test_verify_inspect_and_export_read_every_layout(layouts, tmp_path, name):
    sd = ShardDir(layouts[name])
    assert verify(sd) == []
    preview = inspect(sd, samples=1)["samples_preview"][0]["text"]
    assert preview.startswith("Fellow-Citizens of the Senate and House of Representatives:")
    export_text_to(tmp_path / "docs.jsonl", sd)
    docs = [json.loads(line)["text"] for line in (tmp_path / "docs.jsonl").read_text().splitlines()]
    want = [json.loads(line)["text"] for line in (layouts["lean"].parent / "corpus" / "corpus.jsonl").open()]
    assert docs == want[: len(docs)] and len(docs) >= 2
    r = CliRunner().invoke(main, ["shards", "verify", "--data", str(layouts[name])])
    assert r.exit_code == 0, r.output
    what = "tokens check out (patches are derived from them)" if name == "lean" else "patches check out"
    assert what in r.output


def test_verify_still_compares_stored_patches_with_the_tokenizer(layouts, tmp_path, gpt2_tokenizer):
    """A stored `patches` column that is not the tokenizer's rows of `tokens` is found (the xxh64s rewritten)."""
    from hbpe.pipeline.shards import mds_format
    from hbpe.schemas import shard_columns

    folder = Path(shutil.copytree(layouts["stored"], tmp_path / "stored"))
    sd = ShardDir(folder)
    entry = sd.shard_entries[0]
    cols = sd.read_columns(entry)
    cols["patches"][3, 0, 0] = 0  # sample 3's first symbol
    columns = read_manifest(folder).mds_columns()
    data, new = mds_format.write_shard(columns, cols, basename=entry["zip_data"]["basename"],
                                       hashes=list(shard_columns.HASHES))  # fmt: skip
    (folder / entry["zip_data"]["basename"]).write_bytes(data)
    index = json.loads((folder / "index.json").read_text())
    index["shards"][0] = new
    (folder / "index.json").write_text(json.dumps(index, sort_keys=True))
    assert verify(ShardDir(folder)) == [
        "shard.00000.mds.zstd sample 3: patches differ from the tokenizer applied to tokens"
    ]


# ---- manifests of earlier hbpe ----------------------------------------------------------------------------


def test_a_manifest_of_todays_main_loads_as_stored_patches(layouts, gpt2_tokenizer):
    raw = json.loads((layouts["v1"] / "manifest.json").read_text())
    assert raw["version"] == 1 and "columns" not in raw and "store_patches" not in raw["config"]
    m = read_manifest(layouts["v1"])
    assert m.columns == STORED and m.stores_patches and m.shard_schema_version == 1
    assert ConvertConfig.from_dict(m.config).store_patches is True  # what that hbpe wrote
    assert check_compatible(m, gpt2_tokenizer, where="v1") == PatchSource(derive=False)  # its patches are read
    assert check_compatible(read_manifest(layouts["lean"]), gpt2_tokenizer, where="x") == PatchSource(derive=True)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.update(columns=STORED), "malformed manifest (version 1 has no columns)"),
        (lambda m: m.update(version=3), "not an hbpe shard manifest of version 1 or 2 (format='hbpe-shards', version=3)"),
        (lambda m: m.update(version=2), "malformed manifest (version 2 without columns)"),
        (lambda m: m.update(version=2, columns=["tokens"]), "columns=['tokens'] (hbpe shards store ['num_bytes', 'tokens']"),
        (lambda m: m.update(version=2, columns=LEAN, shard_schema_version=3), "shard schema 3 is newer than this hbpe"),
    ],
    ids=["v1-with-columns", "v3", "v2-no-columns", "unknown-columns", "schema-3"],
)  # fmt: skip
def test_a_manifest_of_no_known_version_is_one_clear_error(layouts, tmp_path, edit, message):
    folder = Path(shutil.copytree(layouts["v1"], tmp_path / "shards"))
    m = json.loads((folder / "manifest.json").read_text())
    edit(m)
    (folder / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=r"manifest\.json: .*(reconvert|upgrade hbpe)") as e:
        read_manifest(folder)
    assert message in str(e.value)


# ---- shards whose columns disagree with the manifest ---------------------------------------------------------


@pytest.mark.parametrize(("shards", "manifest_of"), [("lean", "stored"), ("stored", "lean"), ("lean", "v1")])
def test_shards_of_the_other_layout_are_one_error_naming_the_file(layouts, tmp_path, shards, manifest_of):
    folder = Path(shutil.copytree(layouts[shards], tmp_path / "shards"))
    shutil.copy(layouts[manifest_of] / "manifest.json", folder / "manifest.json")  # same shards and counts
    expected = (
        rf"^{folder}: shard shard\.00000\.mds\.zstd stores columns .*, manifest\.json says every shard stores .*"
        r"index\.json and manifest\.json are not from the same conversion; restore the file from a copy or "
        r"reconvert with `hbpe convert --overwrite`$"
    )
    with pytest.raises(ArtifactError, match=expected):
        ShardDir(folder)
    with pytest.raises(ArtifactError, match=expected):
        check_shards(str(folder), str(tmp_path / "cache"))  # what training and eval check first
    for command in ("verify", "inspect", "stats"):
        cli_fails(CliRunner().invoke(main, ["shards", command, "--data", str(folder)]), 2,
                  "shard.00000.mds.zstd stores columns")  # fmt: skip


# ---- training reads the same batches -----------------------------------------------------------------------


def batches(folder: Path, tok, cache: Path) -> list[dict[str, torch.Tensor]]:
    from hbpe.training.data.shared_memory import release

    dl = build_dataloader(str(folder), tok, batch_size=8, cache_dir=str(cache), shuffle=True, shuffle_seed=7)
    try:
        return list(dl)
    finally:
        stop_downloads(dl)
        release(dl.dataset)


def test_training_batches_are_tensor_equal_in_every_layout(layouts, tmp_path):
    tok = load_shard_tokenizer(layouts["lean"])
    got = {name: batches(folder, tok, tmp_path / name) for name, folder in layouts.items()}
    assert len(got["lean"]) == 92 // 8  # every sample once, drop_last, shuffled across the 3 shards
    for name in ("stored", "v1"):
        assert len(got[name]) == len(got["lean"])
        for a, b in zip(got["lean"], got[name], strict=True):
            assert a.keys() == b.keys() and "patches" in a
            for k in a:
                assert torch.equal(a[k], b[k]), (name, k)
    # a mix of lean and stored streams derives every stream's patches (one source per batch)
    mix = [StreamSpec(str(layouts["stored"]), "/unused/a"), StreamSpec(str(layouts["lean"]), "/unused/b")]
    assert stream_source(mix, tok) == PatchSource(derive=True)
    assert stream_source(mix[:1], tok) == PatchSource(derive=False)


# ---- determinism: reruns and resume, both layouts -----------------------------------------------------------


@pytest.mark.parametrize("store_patches", [False, True], ids=["lean", "stored"])
def test_reruns_and_a_resumed_conversion_are_byte_identical(tmp_path, gpt2_tokenizer_dir, monkeypatch, store_patches):
    src = corpus(tmp_path / "corpus")
    first, again, resumed = (tmp_path / n for n in ("first", "again", "resumed"))
    convert(cfg(gpt2_tokenizer_dir, src, first, store_patches=store_patches))
    convert(cfg(gpt2_tokenizer_dir, src, again, store_patches=store_patches))
    assert without_timing(dir_bytes(first)) == without_timing(dir_bytes(again))

    def crash(*a, **kw):
        raise RuntimeError("simulated crash")

    with monkeypatch.context() as patch:  # every unit encoded, then the shard writer fails
        patch.setattr(inprocess_module, "write_shard", crash)
        with pytest.raises(HbpeError, match=r"simulated crash.*encoded unit\(s\) are kept"):
            convert(cfg(gpt2_tokenizer_dir, src, resumed, store_patches=store_patches), resume=True)
    # the other layout is another conversion: its resume is refused, the layout named
    with pytest.raises(ConfigError, match=rf"store_patches {store_patches} -> {not store_patches}"):
        convert(cfg(gpt2_tokenizer_dir, src, resumed, store_patches=not store_patches), resume=True)
    m = convert(cfg(gpt2_tokenizer_dir, src, resumed, store_patches=store_patches), resume=True)
    assert m["timing"]["units_reused"] == 1
    assert without_timing(dir_bytes(resumed)) == without_timing(dir_bytes(first))
    assert read_manifest(resumed).stores_patches is store_patches


def test_store_patches_must_be_a_bool(tmp_path):
    with pytest.raises(ConfigError, match="store_patches must be True or False, got 'yes'"):
        ConvertConfig(inputs=("x",), output=str(tmp_path), tokenizer="t", store_patches="yes")


def test_the_beam_pipeline_writes_the_same_stored_shards(tmp_path, gpt2_tokenizer_dir):
    """WriteMdsShards carries the layout to its workers: DirectRunner's output is the in-process runner's."""
    from tests.conftest import IN_MEMORY_BEAM

    src = corpus(tmp_path / "corpus")
    beam, local = tmp_path / "beam", tmp_path / "inprocess"
    run_convert(cfg(gpt2_tokenizer_dir, src, beam, store_patches=True), IN_MEMORY_BEAM, runner="DirectRunner",
                progress=False)  # fmt: skip
    convert(cfg(gpt2_tokenizer_dir, src, local, store_patches=True))
    assert read_manifest(beam).columns == STORED
    assert without_timing(dir_bytes(beam)) == without_timing(dir_bytes(local))


def test_bench_convert_reports_both_layouts_side_by_side(tmp_path, gpt2_tokenizer_dir):
    src = corpus(tmp_path / "corpus")
    args = ["bench", "convert", "--tokenizer", str(gpt2_tokenizer_dir), "--input", str(src), "--seq-len", str(SEQ_LEN),
            "--runner", "inprocess", "--workers", "1", "--repeat", "2", "--json"]  # fmt: skip
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    report = json.loads(r.output[r.output.index("{") :])
    lean, stored = report["layouts"]["lean"], report["layouts"]["stored"]
    assert (lean["columns"], stored["columns"]) == (LEAN, STORED)
    assert len(lean["all_s"]) == len(stored["all_s"]) == len(report["tiktoken"]["all_s"]) == 2  # interleaved rounds
    # the bytes on disk are those of the conversion itself, per byte of the text it holds
    out = tmp_path / "lean"
    m = api.convert(src, out, tokenizer=gpt2_tokenizer_dir, seq_len=SEQ_LEN, runner="inprocess", workers=1)
    on_disk = sum(p.stat().st_size for p in out.glob("shard.*.mds.zstd"))
    assert lean["bytes_on_disk"] == on_disk
    assert lean["disk_bytes_per_text_byte"] == on_disk / m.as_dict()["counts"]["bytes"]
    assert report["lean_vs_stored"]["disk_ratio"] == on_disk / stored["bytes_on_disk"] <= 0.4
    assert len(report["load"]) == 2 and report["repeat"] == 2
