import json
import re

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.pipeline.tokenizer import artifact
from hbpe.schemas.canonical import canonical_json, sha256_hex
from hbpe.schemas.errors import ArtifactError
from hbpe.schemas.tokenizer_tables import TABLES_FILENAMES
from tests.helpers import make_special


@pytest.fixture
def artifact_dir(tmp_path, gpt2_tokenizer):
    return artifact.save(gpt2_tokenizer, tmp_path / "tok")


def test_save_load_round_trip(artifact_dir, gpt2_tokenizer):
    loaded = artifact.load(artifact_dir)
    assert loaded.fingerprint == gpt2_tokenizer.fingerprint
    assert loaded.merges == gpt2_tokenizer.merges
    assert (loaded.table == gpt2_tokenizer.table).all()
    spec = json.loads((artifact_dir / "hbpe_tokenizer.json").read_text())
    assert spec["format"] == "hbpe-tokenizer" and spec["version"] == 1
    assert spec["second_stage"]["max_patch_size"] == 10 and spec["second_stage"]["mode"] == "full"
    assert spec["second_stage"]["id_layout"]["eop"] == 256


def test_save_is_byte_identical(tmp_path, gpt2_tokenizer):
    a = artifact.save(gpt2_tokenizer, tmp_path / "a")
    b = artifact.save(gpt2_tokenizer, tmp_path / "b")
    for name in ("hbpe_tokenizer.json", "first_stage.tiktoken"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_refuses_to_overwrite(artifact_dir, gpt2_tokenizer):
    with pytest.raises(ArtifactError, match="--overwrite"):
        artifact.save(gpt2_tokenizer, artifact_dir)


def test_unknown_version(artifact_dir):
    p = artifact_dir / "hbpe_tokenizer.json"
    d = json.loads(p.read_text())
    d["version"] = 99
    p.write_text(json.dumps(d))
    with pytest.raises(ArtifactError, match=r"hbpe_tokenizer.json: schema version 99 is not supported"):
        artifact.load(artifact_dir)


def test_edited_content_fails_fingerprint(artifact_dir):
    p = artifact_dir / "hbpe_tokenizer.json"
    d = json.loads(p.read_text())
    d["second_stage"]["merges"][0] = [1, 2]
    p.write_text(json.dumps(d))
    with pytest.raises(ArtifactError, match="fingerprint mismatch.*edited"):
        artifact.load(artifact_dir)


def test_missing_rank_file(artifact_dir):
    (artifact_dir / "first_stage.tiktoken").unlink()
    with pytest.raises(ArtifactError, match="first_stage.tiktoken is missing"):
        artifact.load(artifact_dir)


@pytest.mark.parametrize("kind", ["fifo", "link-to-dev-zero"])
@pytest.mark.parametrize("name", ["first_stage.tiktoken", "hbpe_tokenizer.json"])
def test_a_special_file_in_a_tokenizer_dir_is_not_called_missing(artifact_dir, name, kind):
    """A FIFO or a link to /dev/zero was reported as "is missing" / "not found": the file is there, but not one to
    read."""
    make_special(artifact_dir / name, kind)
    what = "a FIFO" if kind == "fifo" else "a character device"
    with pytest.raises(ArtifactError, match=rf"^{artifact_dir / name} is not a regular file \({what}\): "):
        artifact.load(artifact_dir)


def test_altered_rank_file(artifact_dir):
    p = artifact_dir / "first_stage.tiktoken"
    p.write_bytes(p.read_bytes().replace(b"IQ== 0", b"IQ== 7", 1))
    with pytest.raises(ArtifactError, match="first_stage.tiktoken was altered"):
        artifact.load(artifact_dir)


def test_not_a_tokenizer_dir(tmp_path):
    with pytest.raises(ArtifactError, match="not a tokenizer directory"):
        artifact.load(tmp_path)


# ---- a malformed hbpe_tokenizer.json is one clear ArtifactError, also when its fingerprint is valid


def _edit_and_resign(artifact_dir, edit) -> None:
    """Apply `edit` to hbpe_tokenizer.json and re-sign it, so the validation (not the fingerprint check) must catch it."""
    p = artifact_dir / "hbpe_tokenizer.json"
    d = json.loads(p.read_text())
    edit(d)
    if isinstance(d, dict):
        content = {k: d[k] for k in ("format", "version", "first_stage", "second_stage") if k in d}
        d["fingerprint"] = sha256_hex(canonical_json(content))  # what TokenizerSpec.fingerprint hashes
    p.write_text(json.dumps(d))
    for name in TABLES_FILENAMES:  # built for the old fingerprint: stale, refused first (test_tokenizer_tables.py)
        (artifact_dir / name).unlink(missing_ok=True)


def _set(block, key, value):
    return lambda d: d[block].__setitem__(key, value)


def _merge(k, pair):
    return lambda d: d["second_stage"]["merges"].__setitem__(k, pair)


def test_resigned_edit_is_accepted(artifact_dir):
    """The re-signing helper is sound: a valid edit loads, so the refusals below come from the validation."""
    _edit_and_resign(artifact_dir, _set("second_stage", "mode", "minimal"))
    assert artifact.load(artifact_dir).mode == "minimal"


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/b", "", "..", "a\\b"])
def test_rank_file_must_be_a_plain_name_inside_the_directory(artifact_dir, name):
    _edit_and_resign(artifact_dir, _set("first_stage", "rank_file", name))
    with pytest.raises(
        ArtifactError,
        match=rf"hbpe_tokenizer.json: malformed tokenizer spec: first_stage.rank_file must be a plain file name inside "
        rf"the tokenizer directory \(like 'first_stage.tiktoken'\), got {re.escape(repr(name))}; restore",
    ):
        artifact.load(artifact_dir)


def _merge_rule(k: int, earlier: str = "") -> str:
    return rf"but merge {k} may only use ids 0\.\.256 \(bytes and EOP\){earlier}; PAD 257 and EOD 258 never appear"


MALFORMED = {
    "S-string": (_set("second_stage", "max_patch_size", "ten"), r"max_patch_size must be an integer, got 'ten'"),
    "S-float": (_set("second_stage", "max_patch_size", 10.5), r"max_patch_size must be an integer, got 10.5"),
    "S-bool": (_set("second_stage", "max_patch_size", True), r"max_patch_size must be an integer, got True"),
    "S-huge": (_set("second_stage", "max_patch_size", 100_000), r"max_patch_size must be <= 255, got 100000"),
    "mode": (
        _set("second_stage", "mode", "fast"),
        r"second_stage.mode must be one of \('full', 'minimal'\), got 'fast'",
    ),
    "merges-string": (_set("second_stage", "merges", "abc"), r"merges must be a list of \[left, right\] id pairs"),
    "merge-triple": (
        _merge(3, [1, 2, 3]),
        r"merges\[3\] must be a \[left, right\] pair of integer ids, got \[1, 2, 3\]",
    ),
    "merge-float": (
        _merge(3, [1.5, 32]),
        r"merges\[3\] must be a \[left, right\] pair of integer ids, got \[1.5, 32\]",
    ),
    "merge-nested": (_merge(3, [[1], 2]), r"merges\[3\] must be a \[left, right\] pair of integer ids"),
    "merge-later-id": (
        _merge(5, [264, 1]),
        r"merges\[5\] = \[264, 1\] uses id 264, " + _merge_rule(5, r" or 259\.\.263 \(earlier merges\)"),
    ),
    "merge-first-uses-merge": (
        _merge(0, [259, 32]),
        r"merges\[0\] = \[259, 32\] uses id 259, " + _merge_rule(0),
    ),
    "merge-pad": (_merge(5, [257, 1]), r"merges\[5\] = \[257, 1\] uses id 257"),
    "merge-eod": (_merge(5, [1, 258]), r"merges\[5\] = \[1, 258\] uses id 258"),
    "merge-negative": (_merge(5, [-1, 32]), r"merges\[5\] = \[-1, 32\] uses id -1"),
    "merge-huge": (_merge(5, [70000, 32]), r"merges\[5\] = \[70000, 32\] uses id 70000"),
    "vocab-size": (_set("second_stage", "vocab_size", 5), r"second_stage.vocab_size is 5, but 211 merges give 470"),
    "id-layout": (_set("second_stage", "id_layout", {"eop": 300}), r"second_stage.id_layout \{'eop': 300\} differs"),
    "special-list": (
        _set("first_stage", "special_tokens", ["<|endoftext|>"]),
        r"first_stage.special_tokens must map strings to non-negative integer ids, got \['<\|endoftext\|>'\]",
    ),
    "special-string-id": (
        _set("first_stage", "special_tokens", {"<|endoftext|>": "50256"}),
        r"first_stage.special_tokens must map strings to non-negative integer ids",
    ),
    "n-vocab-string": (_set("first_stage", "n_vocab", "50257"), r"first_stage.n_vocab must be a positive integer"),
    "pattern-int": (_set("first_stage", "pattern", 5), r"first_stage.pattern must be a non-empty string, got 5"),
    "sha-int": (_set("first_stage", "rank_file_sha256", 3), r"first_stage.rank_file_sha256 must be 64 lowercase hex"),
    "stage-list": (lambda d: d.__setitem__("second_stage", []), r"second_stage must be a JSON object, got \[\]"),
    "missing-key": (lambda d: d["first_stage"].pop("pattern"), r"first_stage has no 'pattern' entry"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_spec_is_one_clear_error(artifact_dir, case):
    edit, message = MALFORMED[case]
    _edit_and_resign(artifact_dir, edit)
    with pytest.raises(ArtifactError, match=rf"hbpe_tokenizer.json: malformed tokenizer spec: .*{message}.*; restore"):
        artifact.load(artifact_dir)


def test_spec_that_does_not_fit_its_rank_file(artifact_dir):
    _edit_and_resign(artifact_dir, _set("first_stage", "n_vocab", 12))
    with pytest.raises(ArtifactError, match=r"first_stage.n_vocab is 12, but first_stage.tiktoken .* give 50257"):
        artifact.load(artifact_dir)


def test_split_pattern_that_does_not_compile(artifact_dir):
    _edit_and_resign(artifact_dir, _set("first_stage", "pattern", "(("))
    with pytest.raises(ArtifactError, match=r"first_stage.pattern is not a valid split pattern \(.*parenthesis"):
        artifact.load(artifact_dir)


def test_merges_learned_for_a_larger_patch_size(artifact_dir):
    _edit_and_resign(artifact_dir, _set("second_stage", "max_patch_size", 4))
    with pytest.raises(ArtifactError, match=r"the second stage does not fit this first stage \(.* > S=4 symbols"):
        artifact.load(artifact_dir)


def test_spec_that_is_not_an_object(artifact_dir):
    (artifact_dir / "hbpe_tokenizer.json").write_text("[1, 2]")
    with pytest.raises(ArtifactError, match=r"hbpe_tokenizer.json: expected a JSON object, got list; restore"):
        artifact.load(artifact_dir)


@pytest.mark.parametrize("case", ["rank-file", "S-string", "merge-later-id", "special-list", "pattern"])
def test_malformed_spec_in_the_cli(artifact_dir, case):
    edits = {
        "rank-file": _set("first_stage", "rank_file", "../x"),
        "pattern": _set("first_stage", "pattern", "(("),
        **{k: MALFORMED[k][0] for k in ("S-string", "merge-later-id", "special-list")},
    }
    _edit_and_resign(artifact_dir, edits[case])
    r = CliRunner().invoke(main, ["tokenizer", "info", "--tokenizer", str(artifact_dir)])
    assert r.exit_code == 2, r.output
    assert (
        r.output.startswith(f"error: {artifact_dir / 'hbpe_tokenizer.json'}: ") and len(r.output.splitlines()) == 1
    ), r.output
    assert "Traceback" not in r.output


def test_special_token_id_that_is_also_a_rank(artifact_dir):
    _edit_and_resign(artifact_dir, _set("first_stage", "special_tokens", {"<|endoftext|>": 100}))
    with pytest.raises(ArtifactError, match=r"special token ids \[100\] are also ranks of first_stage.tiktoken"):
        artifact.load(artifact_dir)
