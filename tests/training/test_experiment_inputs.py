"""`hbpe experiment` keys finished runs and prepared data on the bytes of their inputs, keeps its output
folder to itself, and finds the presets' shared corpora from any directory.

Before: a corpus edited under the same name left every run "finished earlier (skipped)" with the old
BPBs; a user's own results.json and table.md in --out were overwritten; two experiments on one --out
removed each other's files (both rc 0); and `hbpe experiment table1-mini` outside the checkout's root
said its corpus `../shared/data/en-sotu.jsonl.zst` did not exist.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.experiments.data_prep import corpus_files, rank_file_of
from hbpe.experiments.out_folder import claim
from hbpe.experiments.presets import load_spec
from hbpe.schemas.errors import ConfigError
from tests.conftest import SAMPLE_EN, SHARED_DATA, split_sample
from tests.helpers import cli_fails as _fails

SPEC = """\
name: two-runs
description: two small runs on the bundled sample
first_stages: {gpt2: {encoding: gpt2}}
runs:
  - {name: patch, first_stage: gpt2, model: {io: hierarchical}}
  - {name: bpe, first_stage: gpt2, model: {io: bpe}}
batches: 2
eval_points: 1
eval_batches: 1
final_eval_batches: 1
global_batch_size: 2
warmup: 1
"""
SMALL = ["model.latent_layers=1", "model.encoder_layers=1", "model.decoder_layers=1"]


def _experiment(spec, out, train, *extra: str):
    args = ["experiment", str(spec), *SMALL, *extra, "--out", str(out), "--train-input", str(train)]
    return CliRunner().invoke(main, args)


def _result(out, name: str) -> dict:
    return json.loads((out / "runs" / name / "result.json").read_text())


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "two-runs.yaml"
    path.write_text(SPEC)
    return path


def test_a_corpus_changed_under_its_name_is_trained_on_again(spec, tmp_path):
    train, _ = split_sample(tmp_path / "corpus")  # 20 documents; every 10th held out
    out = tmp_path / "out"
    first = _experiment(spec, out, train)
    assert first.exit_code == 0, first.output
    # runs done of the total, the time left from the runs trained; each run's own training progress line
    assert re.search(
        r"^\[1/2\] \w+: BPB [\d.]+ after [\d.]+ MB in \d+ s; 1/2 runs done, about \d\d:\d\d left$", first.output, re.M
    )
    assert re.search(r"^\[2/2\] \w+: BPB .*; 2/2 runs done$", first.output, re.M)
    assert re.search(r"^train: 100% \d+/\d+ batches \[", first.output, re.M)
    before = {n: _result(out, n) for n in ("patch", "bpe")}
    split_before = (out / "data" / "corpus" / "train.jsonl").read_text()
    shards = out / "data" / "gpt2" / "shards-train"
    index_before = (shards / "index.json").read_bytes()

    again = _experiment(spec, out, train)  # the same bytes: nothing to do
    assert again.exit_code == 0, again.output
    assert again.output.count("finished earlier") == 2

    lines = train.read_text().splitlines()
    train.write_text("\n".join(lines[10:] + lines[:10]) + "\n")  # other content, the same name
    changed = _experiment(spec, out, train)
    assert changed.exit_code == 0, changed.output
    assert "finished earlier" not in changed.output
    assert changed.output.count("its corpus or rank file changed since it finished; training it again") == 2
    after = {n: _result(out, n) for n in ("patch", "bpe")}
    for n in after:  # trained again, on the new split and shards, and recorded so
        assert after[n]["inputs"] != before[n]["inputs"]
        assert after[n]["fingerprint"] == before[n]["fingerprint"]
        assert after[n]["train_seconds"] != before[n]["train_seconds"]
    assert (out / "data" / "corpus" / "train.jsonl").read_text() != split_before
    assert (shards / "index.json").read_bytes() != index_before  # shards of the new split (other hashes)


@pytest.mark.parametrize("name", ["results.json", "table.md"])
def test_a_users_own_report_file_in_out_is_refused_not_overwritten(name, spec, tmp_path):
    train, _ = split_sample(tmp_path / "corpus")
    out = tmp_path / "out"
    out.mkdir()
    mine = out / name
    mine.write_text('{"my": "numbers"}\n' if name.endswith(".json") else "| my | table |\n")
    r = _experiment(spec, out, train)
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines()[-1] == (
        f"error: {out} holds {name} that no hbpe experiment wrote, and an experiment would overwrite it; "
        "move it away or pass another --out"
    )
    assert mine.read_text() in ('{"my": "numbers"}\n', "| my | table |\n")
    assert not (out / "data").exists()  # refused before anything was prepared


def test_a_second_experiment_on_the_same_out_is_refused_naming_the_first(spec, tmp_path):
    train, _ = split_sample(tmp_path / "corpus")
    out = tmp_path / "out"
    with claim(out):  # what a running experiment holds
        r = _experiment(spec, out, train)
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines()[-1] == (
        f"error: {out} is in use by another hbpe experiment (pid {os.getpid()}); wait until it ends, "
        "or pass another --out"
    )
    assert not (out / "data").exists()
    with claim(out):  # released when the first ends (however it ends: the kernel drops a dead process's lock)
        pass


@pytest.mark.parametrize("kind", ["symbolic link", "FIFO"])
def test_a_link_or_fifo_as_out_lock_is_refused_and_its_target_untouched(spec, tmp_path, kind):
    """Issue 28: a link planted as OUT/.lock had its target (outside --out) truncated and given a pid (rc 0), and
    a FIFO there ended in `internal error: UnsupportedOperation`."""
    train, _ = split_sample(tmp_path / "corpus")
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious\n")
    lock = out / ".lock"
    if kind == "symbolic link":
        lock.symlink_to(victim)
    else:
        os.mkfifo(lock)
    r = _experiment(spec, out, train)
    _fails(r, 2, f"{lock} is a {kind}, where hbpe keeps a lock file; hbpe never writes through a link")
    assert victim.read_text() == "precious\n" and not (out / "data").exists()


@pytest.mark.skipif(not (SHARED_DATA / "en-sotu.jsonl.zst").is_file(), reason="needs the shared data folder")
def test_the_presets_find_the_shared_data_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("HBPE_SHARED_DATA", raising=False)
    monkeypatch.chdir(tmp_path)  # not the checkout's root: `../shared/data` is not there
    train, held = corpus_files(load_spec("table1-mini"))
    assert train == [str(SHARED_DATA / "en-sotu.jsonl.zst")] and held == []
    assert rank_file_of(load_spec("chinese-mini").first_stages["llama3"]) == str(
        SHARED_DATA / "ranks" / "llama3.tiktoken"
    )


def test_hbpe_shared_data_points_elsewhere_and_a_missing_corpus_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(SAMPLE_EN, elsewhere / "en-sotu.jsonl.zst")
    monkeypatch.setenv("HBPE_SHARED_DATA", str(elsewhere))
    assert corpus_files(load_spec("table1-mini"))[0] == [str(elsewhere / "en-sotu.jsonl.zst")]

    monkeypatch.setenv("HBPE_SHARED_DATA", str(tmp_path / "empty"))
    r = CliRunner().invoke(main, ["experiment", "table1-mini", "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == (
        f"error: en-sotu.jsonl.zst, the preset's default corpus, is not in $HBPE_SHARED_DATA={tmp_path / 'empty'}; "
        "set HBPE_SHARED_DATA to the folder that holds it, or pass --train-input FILE (and --eval-input FILE)"
    )

    monkeypatch.delenv("HBPE_SHARED_DATA")
    monkeypatch.setattr("hbpe.experiments.shared_data.BESIDE_CHECKOUT", tmp_path / "no-checkout")
    with pytest.raises(
        ConfigError, match=r"is not in .*no-checkout and .*shared/data \(\$HBPE_SHARED_DATA is not set\)"
    ):
        corpus_files(load_spec("chinese-mini"))


def test_a_corpus_in_a_bucket_is_keyed_on_its_bytes_too(object_store):
    from hbpe.experiments.inputs import content_key

    uri = f"{object_store.new_bucket()}/corpus/train.jsonl"
    object_store.put(uri, b'{"text": "one"}\n')
    first = content_key([uri])
    assert content_key([uri]) == first
    object_store.put(uri, b'{"text": "two"}\n')  # the same name, other bytes
    assert content_key([uri]) != first
