"""The tokenizer artifact keeps its built tables (issue 39): written on save, read and checked on load.

Loaded from the tables, a tokenizer must be the one built from the rank file and merges: the same
ranks and arrays, the same bytes out of encode and decode on real corpora. Every mismatch is one
error naming the file and the command that rebuilds the tables; an artifact without them still loads.
"""

from __future__ import annotations

import json
import logging
import re
import shutil

import numpy as np
import pytest
import zstandard
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.pipeline.tokenizer import artifact, tables
from hbpe.pipeline.tokenizer.bench import bench_load
from hbpe.schemas.canonical import sha256_hex
from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.tokenizer_tables import TablesManifest, layout
from tests.conftest import SAMPLE_EN, SHARED_DATA
from tests.helpers import dir_bytes

LLAMA3 = SHARED_DATA / "ranks" / "llama3.tiktoken"
TABLE_FILES = ["hbpe_tokenizer_tables.bin", "hbpe_tokenizer_tables.json"]
ARRAYS = ("table", "patch_lengths", "token_nbytes")


@pytest.fixture(scope="module")
def saved(tmp_path_factory, gpt2_tokenizer):
    return artifact.save(gpt2_tokenizer, tmp_path_factory.mktemp("tables") / "gpt2-s10")


@pytest.fixture
def copy(saved, tmp_path):
    """A private copy of the saved artifact, for the tests that damage it."""
    return shutil.copytree(saved, tmp_path / "tok")


def _manifest(folder) -> dict:
    return json.loads((folder / "hbpe_tokenizer_tables.json").read_text())


def _write_manifest(folder, d: dict) -> None:
    (folder / "hbpe_tokenizer_tables.json").write_text(json.dumps(d))


def _assert_same_tokenizer(a, b) -> None:
    assert a.encoding._mergeable_ranks == b.encoding._mergeable_ranks
    assert a.encoding._special_tokens == b.encoding._special_tokens and a.encoding._pat_str == b.encoding._pat_str
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
    assert a.fingerprint == b.fingerprint and a.symbol_bytes == b.symbol_bytes


def _texts(path, n: int) -> list[str]:
    """The first n documents of a jsonl.zst corpus."""
    with zstandard.ZstdDecompressor().stream_reader(path.read_bytes()) as r:
        lines = r.read().decode("utf-8").splitlines()[:n]
    return [json.loads(line)["text"] for line in lines]


# ---- written and used ------------------------------------------------------------------------


def test_save_writes_the_tables_beside_the_spec(saved, gpt2_tokenizer):
    assert sorted(p.name for p in saved.iterdir()) == ["first_stage.tiktoken", "hbpe_tokenizer.json", *TABLE_FILES]
    m = _manifest(saved)
    data = (saved / "hbpe_tokenizer_tables.bin").read_bytes()
    assert (m["format"], m["version"], m["file"]) == ("hbpe-tokenizer-tables", 1, "hbpe_tokenizer_tables.bin")
    assert m["tokenizer_fingerprint"] == gpt2_tokenizer.fingerprint
    assert (m["size"], m["sha256"]) == (len(data), sha256_hex(data))
    shapes = {a["name"]: a["shape"] for a in m["arrays"]}
    assert shapes["patch_table"] == [50257 + 2, 10] and shapes["token_ids"] == [50256]


def test_loaded_from_tables_is_the_tokenizer_built_from_scratch(saved, gpt2_tokenizer):
    from_tables = artifact.load(saved)
    built = artifact.load(saved, use_tables=False)
    _assert_same_tokenizer(from_tables, gpt2_tokenizer)
    _assert_same_tokenizer(built, gpt2_tokenizer)
    from_tables.table[0, 0] = from_tables.table[0, 0]  # writable, as a built table: callers may edit a copy in place


def test_the_loader_takes_its_arrays_from_the_tables(copy):
    """A table entry changed, and the manifest's hash with it: the loaded tokenizer has the changed entry."""
    m = _manifest(copy)
    entry = next(a for a in m["arrays"] if a["name"] == "patch_lengths")
    data = bytearray((copy / "hbpe_tokenizer_tables.bin").read_bytes())
    data[entry["offset"] + 464] = 7  # "The" has a 2-symbol patch at S=10
    (copy / "hbpe_tokenizer_tables.bin").write_bytes(data)
    _write_manifest(copy, {**m, "sha256": sha256_hex(bytes(data))})
    assert artifact.load(copy).patch_lengths[464] == 7
    assert artifact.load(copy, use_tables=False).patch_lengths[464] == 2


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory):
    if not LLAMA3.is_file():
        pytest.skip(f"needs {LLAMA3}")
    tok = artifact.train_tokenizer(str(LLAMA3), max_patch_size=10, pattern="llama3")
    return artifact.save(tok, tmp_path_factory.mktemp("tables") / "llama3-s10")


@pytest.mark.parametrize("encoding", ["gpt2", "llama3"])
def test_tables_encode_and_decode_byte_identically_on_real_corpora(encoding, request):
    folder = request.getfixturevalue("saved" if encoding == "gpt2" else "llama3_dir")
    from_tables, built = artifact.load(folder), artifact.load(folder, use_tables=False)
    _assert_same_tokenizer(from_tables, built)
    corpora = [SHARED_DATA / n for n in ("en-sotu.jsonl.zst", "en-open-docs.jsonl.zst", "zh-kernel-docs.jsonl.zst")]
    texts = [t for c in corpora if c.is_file() for t in _texts(c, 8)] or _texts(SAMPLE_EN, 20)
    assert sum(len(t) for t in texts) > 100_000
    for text in texts:
        tokens, patches = from_tables.encode_patches(text)
        want_tokens, want_patches = built.encode_patches(text)
        assert tokens.tobytes() == want_tokens.tobytes() and patches.tobytes() == want_patches.tobytes()
        assert from_tables.decode_patches(patches) == text == from_tables.decode_tokens(tokens.tolist())
        assert from_tables.nbytes(tokens) == built.nbytes(tokens) == len(text.encode("utf-8"))


# ---- refused: one error naming the file and the rebuild command ---------------------------------


def test_an_altered_table_file_is_refused_and_the_command_rebuilds_it(copy, saved):
    path = copy / "hbpe_tokenizer_tables.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(data)
    with pytest.raises(
        ArtifactError,
        match=rf"^{re.escape(str(path))} was altered: its sha256 [0-9a-f]{{16}}\.\.\. differs from its manifest's "
        rf"[0-9a-f]{{16}}\.\.\.; rebuild the tables with `hbpe tokenizer tables --tokenizer {re.escape(str(copy))}`$",
    ):
        artifact.load(copy)
    r = CliRunner().invoke(main, ["tokenizer", "tables", "--tokenizer", str(copy)])
    assert r.exit_code == 0, r.output
    sizes = [(saved / n).stat().st_size for n in TABLE_FILES]
    assert r.output == f"wrote {TABLE_FILES[0]} ({sizes[0]} bytes), {TABLE_FILES[1]} ({sizes[1]} bytes) into {copy}\n"
    assert dir_bytes(copy) == dir_bytes(saved)


def _truncate(folder):
    p = folder / "hbpe_tokenizer_tables.bin"
    p.write_bytes(p.read_bytes()[:-64])


def _for_s8(folder):
    tables.write(artifact.with_patch_size(artifact.load(folder), max_patch_size=8, mode="full"), folder)


def _outside(folder):
    _write_manifest(folder, {**_manifest(folder), "file": "../first_stage.tiktoken"})


def _huge(folder):
    """Shapes laid out consistently, but more token bytes than the rank file could hold: refused before reading."""
    m = _manifest(folder)
    shapes = {a["name"]: tuple(a["shape"]) for a in m["arrays"]}
    entries = layout({**shapes, "token_bytes": (10**12,)})
    forged = TablesManifest(tokenizer_fingerprint=m["tokenizer_fingerprint"], sha256=m["sha256"], arrays=entries)
    _write_manifest(folder, forged.to_dict())


@pytest.mark.parametrize(
    "damage, message",
    [
        (_truncate, r"hbpe_tokenizer_tables.bin has \d+ bytes, its manifest says \d+"),
        (lambda f: (f / "hbpe_tokenizer_tables.bin").unlink(), "hbpe_tokenizer_tables.bin is missing"),
        (_for_s8, r"hbpe_tokenizer_tables.json is for another tokenizer \(fingerprint \w{12}, the spec's is \w{12}\)"),
        (_outside, r"hbpe_tokenizer_tables.json: malformed: file must be a plain file name inside the tokenizer"),
        (
            _huge,
            r"hbpe_tokenizer_tables.json: shapes do not fit the tokenizer \(n_vocab 50257, S=10\): token_bytes "
            r"\(1000000000000,\) \(more than the 835554 bytes of the rank file\)",
        ),
        (lambda f: (f / TABLE_FILES[1]).write_text("{"), r"hbpe_tokenizer_tables.json: not valid JSON"),
    ],
    ids=["truncated", "missing", "another-tokenizer", "outside-the-folder", "huge", "not-json"],
)
def test_tables_that_do_not_fit_are_refused(copy, damage, message):
    damage(copy)
    with pytest.raises(ArtifactError, match=rf"^{re.escape(str(copy))}/{message}.*; rebuild the tables with `hbpe "):
        artifact.load(copy)
    artifact.add_tables(copy)  # the fix the message names
    _assert_same_tokenizer(artifact.load(copy), artifact.load(copy, use_tables=False))


# ---- without tables: the old way, said once ---------------------------------------------------


def test_an_artifact_without_tables_loads_and_says_once_how_to_add_them(tmp_path, gpt2_tokenizer, caplog):
    folder = artifact.save(gpt2_tokenizer, tmp_path / "old", with_tables=False)
    assert sorted(p.name for p in folder.iterdir()) == ["first_stage.tiktoken", "hbpe_tokenizer.json"]
    with caplog.at_level(logging.WARNING, logger="hbpe.pipeline.tokenizer.artifact"):
        _assert_same_tokenizer(artifact.load(folder), gpt2_tokenizer)
        artifact.load(folder)
    hints = [r.getMessage() for r in caplog.records if "no built tables" in r.getMessage()]
    assert hints == [
        f"{folder} has no built tables (hbpe_tokenizer_tables.json) for this hbpe, so loading parses the rank file "
        f"and builds the patch table; add them with `hbpe tokenizer tables --tokenizer {folder}` to load it several "
        "times faster"
    ]


def test_tables_of_another_version_are_rebuilt_not_read(copy, gpt2_tokenizer, caplog):
    _write_manifest(copy, {**_manifest(copy), "version": 99, "arrays": "a layout this hbpe does not know"})
    with caplog.at_level(logging.WARNING, logger="hbpe.pipeline.tokenizer.artifact"):
        _assert_same_tokenizer(artifact.load(copy), gpt2_tokenizer)
    assert any(f"tables --tokenizer {copy}`" in r.getMessage() for r in caplog.records)


# ---- determinism ------------------------------------------------------------------------------


def test_the_table_files_are_byte_identical_however_they_are_written(saved, gpt2_tokenizer, tmp_path):
    again = artifact.save(gpt2_tokenizer, tmp_path / "again")
    artifact.save(gpt2_tokenizer, again, overwrite=True)  # over an artifact with tables: they are its files
    added = artifact.save(gpt2_tokenizer, tmp_path / "added", with_tables=False)
    assert artifact.add_tables(added) == {n: (saved / n).stat().st_size for n in TABLE_FILES}
    for name in TABLE_FILES:
        assert (again / name).read_bytes() == (saved / name).read_bytes() == (added / name).read_bytes(), name


# ---- the benchmark ----------------------------------------------------------------------------


def test_bench_load_times_both_ways_without_touching_an_artifact_without_tables(tmp_path, gpt2_tokenizer):
    folder = artifact.save(gpt2_tokenizer, tmp_path / "old", with_tables=False)
    before = dir_bytes(folder)
    r = bench_load(folder, repeat=2)
    assert dir_bytes(folder) == before
    assert r["tables"] == "added to a temporary copy" and r["repeat"] == 2
    assert [len(r["runs"][k]) for k in ("with_tables", "without_tables")] == [2, 2]
    assert r["speedup"] == pytest.approx(r["seconds"]["without_tables"] / r["seconds"]["with_tables"])
    assert all(s > 0 for s in r["seconds"].values())


# ---- a run's tokenizer/ holds the tables too ----------------------------------------------------


def test_save_overwrite_clears_a_run_tokenizer_that_holds_tables(tmp_path, gpt2_tokenizer):
    """save_overwrite deletes a run's tokenizer/ only when it holds nothing but hbpe's files: the tables are."""
    from hbpe.training.checkpoint.save_folder import check_clearable, clear_previous_run

    artifact.save(gpt2_tokenizer, tmp_path / "tokenizer")
    check_clearable(str(tmp_path))
    assert clear_previous_run(str(tmp_path)) == ["tokenizer"] and list(tmp_path.iterdir()) == []


def test_a_folder_the_tables_cannot_be_written_into_is_one_clear_error(copy):
    for name in TABLE_FILES:
        (copy / name).unlink()
    (copy / "hbpe_tokenizer_tables.bin").mkdir()  # where the data file goes
    r = CliRunner().invoke(main, ["tokenizer", "tables", "--tokenizer", str(copy)])
    assert r.exit_code == 2 and r.output == (
        f"error: cannot write the tables into {copy}: is a directory where a file is needed; pass a file path\n"
    ), r.output
    assert sorted(p.name for p in copy.iterdir()) == ["first_stage.tiktoken", "hbpe_tokenizer.json", TABLE_FILES[0]]
