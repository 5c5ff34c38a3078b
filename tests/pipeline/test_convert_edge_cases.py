"""Red-team findings on the pipeline side: each test reproduces a data loss or a wrong result of the old code.

Tokenizer `--out` and convert `--output` never delete files hbpe did not write; a shard
directory whose tokenizer/ copy is not the conversion's is refused in one place; export-text
never writes into the directory it reads; seq_len 1 is refused up front.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.pipeline.shards.reader import ShardDir, load_shard_tokenizer
from hbpe.pipeline.shards.tools import export_text_to, verify
from hbpe.pipeline.tokenizer import artifact
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ArtifactError, ConfigError
from tests.conftest import SAMPLE_ZH
from tests.helpers import convert, dir_bytes


def user_files(d: Path) -> dict[str, bytes]:
    """A folder of the user's own files, as `hbpe tokenizer train --out` / `convert --output` might be pointed at."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "README.md").write_text("my notes")
    (d / "corpus.jsonl").write_text('{"text": "mine"}\n')
    (d / "sub").mkdir()
    (d / "sub" / "keep.txt").write_text("keep")
    return dir_bytes(d)


# ---- 1, 2: tokenizer train --out . / --out DIR --overwrite


def test_tokenizer_train_out_dot_overwrite_keeps_the_current_directory(tmp_path, monkeypatch):
    work = tmp_path / "work"
    before = user_files(work)
    monkeypatch.chdir(work)
    # the old save made its temp dir inside '.' and then rmtree'd '.': every file above was gone
    r = CliRunner().invoke(main, ["tokenizer", "train", "--encoding", "gpt2", "-S", "10", "--out", ".", "--overwrite"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "error: . holds files hbpe did not write: README.md, corpus.jsonl, sub;" in r.output
    assert dir_bytes(work) == before and sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_save_to_parent_directory_refused(tmp_path, monkeypatch, gpt2_tokenizer):
    before = user_files(tmp_path / "data")
    monkeypatch.chdir(tmp_path / "data" / "sub")
    with pytest.raises(ArtifactError, match=r"^\.\. holds files hbpe did not write: README.md, corpus.jsonl, sub;"):
        artifact.save(gpt2_tokenizer, "..", overwrite=True)
    assert dir_bytes(tmp_path / "data") == before


def test_overwrite_refuses_a_directory_with_the_users_files(tmp_path, gpt2_tokenizer):
    out = tmp_path / "tok"
    before = user_files(out)
    artifact.save(gpt2_tokenizer, tmp_path / "scratch")  # a real artifact next to them changes nothing
    shutil.copy(tmp_path / "scratch" / "hbpe_tokenizer.json", out / "hbpe_tokenizer.json")
    with pytest.raises(
        ArtifactError, match=r"tok holds files hbpe did not write: README.md, corpus.jsonl, sub; overwriting only"
    ):
        artifact.save(gpt2_tokenizer, out, overwrite=True)
    assert {k: v for k, v in dir_bytes(out).items() if k != "hbpe_tokenizer.json"} == before


def test_overwrite_replaces_a_tokenizer_directory_and_the_message_names_the_cli_flag(tmp_path, gpt2_tokenizer):
    out = tmp_path / "tok"
    tok6 = artifact.with_patch_size(gpt2_tokenizer, max_patch_size=6, mode="full")
    artifact.save(tok6, out)
    with pytest.raises(ArtifactError, match=r"tok already holds a tokenizer; pass --overwrite to replace it$"):
        artifact.save(gpt2_tokenizer, out)
    assert artifact.save(gpt2_tokenizer, out, overwrite=True) == out.resolve()
    assert artifact.load(out).fingerprint == gpt2_tokenizer.fingerprint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]  # no temp or old folder left beside it
    r = CliRunner().invoke(main, ["tokenizer", "train", "--encoding", "gpt2", "-S", "6", "--out", str(out)])
    assert r.exit_code == 2 and "pass --overwrite to replace it" in r.output and "overwrite=True" not in r.output


def test_save_into_an_empty_current_directory(tmp_path, monkeypatch, gpt2_tokenizer):
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    artifact.save(gpt2_tokenizer, ".")
    assert artifact.load(tmp_path / "here").fingerprint == gpt2_tokenizer.fingerprint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]


# ---- 3: convert --overwrite into a folder that was never a conversion


def test_convert_overwrite_refuses_a_folder_of_hbpe_named_files_that_is_no_conversion(
    tmp_path, gpt2_tokenizer_dir, gpt2_tokenizer
):
    out = tmp_path / "project"
    out.mkdir()
    (out / "index.json").write_text('{"my": "index"}')
    (out / "manifest.json").write_text('{"name": "my package"}')
    tok8 = artifact.with_patch_size(gpt2_tokenizer, max_patch_size=8, mode="full")
    artifact.save(tok8, out / "tokenizer")  # the user's own S=8 tokenizer
    before = dir_bytes(out)
    # the old check went by names only: all three were hbpe's, and --overwrite deleted them
    with pytest.raises(
        ConfigError,
        match=r"holds files hbpe did not write: index.json, manifest.json, tokenizer; it is not an earlier conversion",
    ):
        convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out, overwrite=True)
    with pytest.raises(ConfigError, match=r"holds files hbpe did not write: index.json, manifest.json, tokenizer;"):
        convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out)
    assert dir_bytes(out) == before


def test_convert_overwrite_still_replaces_a_conversion_known_by_its_manifest(tmp_path, gpt2_tokenizer_dir):
    out = tmp_path / "out"
    convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out)
    (out / "COMPLETED").unlink()  # killed during an earlier replace: only the hbpe manifest tells it
    m = convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out, overwrite=True, seq_len=256)
    assert m["seq_len"] == 256 and (out / "COMPLETED").exists()


# ---- 4: a tokenizer/ copy that is not the conversion's


@pytest.fixture
def swapped_tokenizer(sample_shards, tmp_path, gpt2_tokenizer) -> Path:
    d = tmp_path / "train"
    shutil.copytree(sample_shards[0], d)
    artifact.save(
        artifact.with_patch_size(gpt2_tokenizer, max_patch_size=6, mode="full"), d / "tokenizer", overwrite=True
    )
    return d


MISMATCH = (
    r"tokenizer does not match the manifest: its fingerprint \w{12} \(S=6, full\) != manifest \w{12} \(S=10, full\)"
)


def test_a_swapped_tokenizer_copy_is_one_clear_error(swapped_tokenizer, tmp_path):
    with pytest.raises(ArtifactError, match=MISMATCH + ".*restore it from the tokenizer used for the conversion"):
        ShardDir(swapped_tokenizer).tokenizer  # noqa: B018 (the property is the check)
    with pytest.raises(ArtifactError, match=MISMATCH):  # what training's load_shard_tokenizer should call
        load_shard_tokenizer(str(swapped_tokenizer))
    # inspect printed garbage with rc 0; export-text raised UnicodeDecodeError
    for cmd in (["inspect"], ["export-text", "--out", str(tmp_path / "x.jsonl")]):
        r = CliRunner().invoke(main, ["shards", cmd[0], "--data", str(swapped_tokenizer), *cmd[1:]])
        assert r.exit_code == 2 and "Traceback" not in r.output and "does not match the manifest" in r.output, cmd
    assert not (tmp_path / "x.jsonl").exists()


def test_verify_reports_a_swapped_tokenizer_and_checks_the_rest(swapped_tokenizer):
    problems = verify(ShardDir(swapped_tokenizer))  # was a ValueError: shapes (128,10) and (128,6) do not broadcast
    assert len(problems) == 1 and problems[0].startswith("tokenizer/ cannot be used (samples not checked against it)")
    r = CliRunner().invoke(main, ["shards", "verify", "--data", str(swapped_tokenizer)])
    assert r.exit_code == 1 and "FAIL tokenizer/ cannot be used" in r.output and "Traceback" not in r.output


# ---- 5: export-text output paths


def test_export_text_refuses_an_output_inside_the_shard_directory(sample_shards, tmp_path):
    d = tmp_path / "train"
    shutil.copytree(sample_shards[0], d)
    before = dir_bytes(d)
    for target in (d / "index.json", d / "tokenizer" / "x.jsonl"):
        with pytest.raises(ArtifactError, match=r"output .* lies inside the shard directory .*/train being exported"):
            export_text_to(target, ShardDir(d))
    r = CliRunner().invoke(main, ["shards", "export-text", "--data", str(d), "--out", str(d / "index.json")])
    assert r.exit_code == 2 and "lies inside the shard directory" in r.output
    assert dir_bytes(d) == before and ShardDir(d).index["shards"]


def test_export_text_to_a_missing_folder_names_the_requested_path(sample_shards, tmp_path):
    target = tmp_path / "nonexist" / "x.jsonl"
    # the old error named the temp file: ".../nonexist/.x.jsonl.tmp"
    with pytest.raises(ArtifactError, match=rf"^cannot write {target}: its folder {target.parent} does not exist"):
        export_text_to(target, ShardDir(sample_shards[0]))
    r = CliRunner().invoke(main, ["shards", "export-text", "--data", str(sample_shards[0]), "--out", str(target)])
    assert r.exit_code == 2 and ".x.jsonl.tmp" not in r.output and f"cannot write {target}" in r.output


# ---- 6: seq_len 1


def test_seq_len_1_is_refused(tmp_path, gpt2_tokenizer_dir):
    with pytest.raises(ConfigError, match=r"seq_len must be >= 2, got 1: a sample needs one context patch and one"):
        ConvertConfig(
            inputs=(str(SAMPLE_ZH),), output=str(tmp_path / "o"), tokenizer=str(gpt2_tokenizer_dir), seq_len=1
        )
    assert ConvertConfig(inputs=("x",), output="o", tokenizer="t", seq_len=2).seq_len == 2
    assert json.loads(json.dumps(ConvertConfig(inputs=("x",), output="o", tokenizer="t").to_dict()))["seq_len"] == 1024
