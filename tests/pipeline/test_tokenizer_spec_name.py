"""The tokenizer spec is hbpe_tokenizer.json (issue 19: tokenizer.json is Hugging Face's format), and artifacts,
shard sets and runs written before, with tokenizer.json, still read alike: same fingerprint, same shards."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np

from hbpe.pipeline.tokenizer import artifact
from tests.conftest import IN_MEMORY_BEAM

# the spec, the rank file, and (since issue 39) the built tables
FILES = ["first_stage.tiktoken", "hbpe_tokenizer.json", "hbpe_tokenizer_tables.bin", "hbpe_tokenizer_tables.json"]


def _old_style(new: Path, dest: Path) -> Path:
    """A copy of an artifact as hbpe wrote it before the rename: the same bytes under tokenizer.json."""
    shutil.copytree(new, dest)
    (dest / "hbpe_tokenizer.json").rename(dest / "tokenizer.json")
    return dest


def test_new_artifacts_name_the_spec_hbpe_tokenizer_json(gpt2_tokenizer_dir):
    assert sorted(p.name for p in Path(gpt2_tokenizer_dir).iterdir()) == FILES


def test_an_old_artifact_loads_with_the_same_fingerprint_and_patches(gpt2_tokenizer_dir, tmp_path, sample_texts):
    new = artifact.load(gpt2_tokenizer_dir)
    old = artifact.load(_old_style(Path(gpt2_tokenizer_dir), tmp_path / "old"))
    assert old.fingerprint == new.fingerprint  # the fingerprint hashes content, not the file's name
    for text in sample_texts[:20]:
        assert np.array_equal(old.encode_patches(text)[1], new.encode_patches(text)[1])
    # --overwrite treats an old artifact as a tokenizer directory, and writes the new name
    artifact.save(new, tmp_path / "old", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == FILES


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "manifest.json"  # the manifest records the input paths and times
    }


def test_converting_with_an_old_artifact_writes_the_same_shards(gpt2_tokenizer_dir, tmp_path):
    import json

    from hbpe.pipeline.beam.convert import run_convert
    from hbpe.schemas.convert_config import ConvertConfig
    from tests.conftest import SAMPLE_EN

    old = _old_style(Path(gpt2_tokenizer_dir), tmp_path / "old-tok")
    outs = {}
    for name, tok in (("new", gpt2_tokenizer_dir), ("old", old)):
        cfg = ConvertConfig(
            inputs=(str(SAMPLE_EN),), output=str(tmp_path / name), tokenizer=str(tok), seq_len=128, shard_bytes=1 << 20
        )
        run_convert(cfg, IN_MEMORY_BEAM, progress=False)
        outs[name] = _tree(tmp_path / name)
    assert outs["old"] == outs["new"]  # shards, index and the tokenizer copy (now hbpe_tokenizer.json) byte for byte
    assert "tokenizer/hbpe_tokenizer.json" in outs["old"] and any(k.endswith(".mds.zstd") or k.endswith(".mds")
                                                                   for k in outs["old"])  # fmt: skip
    manifests = [json.loads((tmp_path / n / "manifest.json").read_text()) for n in ("new", "old")]
    assert manifests[0]["tokenizer_fingerprint"] == manifests[1]["tokenizer_fingerprint"]
