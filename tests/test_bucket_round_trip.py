"""The whole job through bucket URLs, against real local S3 and GCS servers.

Corpus, tokenizer, shards, checkpoints and run files all live in a bucket; `hbpe convert`,
`hbpe train`, `hbpe eval` and `hbpe generate` are run through the CLI as a user would, from a
working directory that must stay empty of `s3:`/`gs:` folders. The remote results must equal
the same commands run on a local download of the bucket.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from click.testing import CliRunner

from hbpe.cli import main
from tests.conftest import split_sample

BATCHES = 4


def _hbpe(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, f"hbpe {' '.join(args)} -> {result.exit_code}:\n{result.output}"
    return result.output


def _json(*args: str) -> dict:
    return json.loads(_hbpe(*args, "--json"))


def test_convert_train_eval_generate_through_a_bucket(object_store, gpt2_tokenizer_dir, tmp_path, monkeypatch):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    bucket = object_store.new_bucket()
    train_txt, eval_txt = split_sample(tmp_path / "corpus")
    object_store.upload_dir(tmp_path / "corpus", f"{bucket}/corpus")
    object_store.upload_dir(gpt2_tokenizer_dir, f"{bucket}/tokenizer")

    for split in ("train", "eval"):
        _hbpe(
            "convert",
            "--tokenizer",
            f"{bucket}/tokenizer",
            "--input",
            f"{bucket}/corpus/{split}.jsonl",
            "--out",
            f"{bucket}/shards/{split}",
            "--seq-len",
            "128",
        )
        assert "COMPLETED" in object_store.list(f"{bucket}/shards/{split}")
    assert _json("shards", "verify", "--data", f"{bucket}/shards/train")

    run = f"{bucket}/runs/tiny"
    _hbpe(
        "train",
        "tiny",
        f"data.train={bucket}/shards/train",
        f"data.eval={bucket}/shards/eval",
        f"save_folder={run}",
        f"max_duration={BATCHES}ba",
        f"eval_interval={BATCHES}ba",
        f"save_interval={BATCHES}ba",
        "console=false",
    )
    stored = object_store.list(run)
    checkpoint = f"ep0-ba{BATCHES}-rank0.pt"
    assert {"hbpe_run.json", "tokenizer/hbpe_tokenizer.json", checkpoint} <= set(stored), stored
    assert not [p.name for p in work.rglob("*") if p.name in ("s3:", "gs:")]

    remote_eval = _json("eval", "--checkpoint", f"{run}/{checkpoint}", "--data", f"{bucket}/shards/eval")
    assert math.isfinite(remote_eval["bpb"]) and remote_eval["bpb"] > 0

    # the same commands on a local download of the bucket give the same numbers and text
    local_run = object_store.download_dir(run, tmp_path / "local-run")
    local_eval_shards = object_store.download_dir(f"{bucket}/shards/eval", tmp_path / "local-eval")
    local_eval = _json("eval", "--checkpoint", str(Path(local_run, checkpoint)), "--data", str(local_eval_shards))
    assert abs(remote_eval["bpb"] - local_eval["bpb"]) < 1e-6

    prompt = ["--prompt", "The state of the Union", "--max-bytes", "40", "--seed", "3"]
    remote_text = _json("generate", "--checkpoint", f"{run}/{checkpoint}", *prompt)
    local_text = _json("generate", "--checkpoint", str(Path(local_run, checkpoint)), *prompt)
    assert [r["text"] for r in remote_text] == [r["text"] for r in local_text]
    assert len(remote_text[0]["text"].encode()) >= 40
