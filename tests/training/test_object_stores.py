"""Training and everything after it with shards, checkpoints and exports in a bucket (issue 11 §1).

Against the real servers of tests/object_stores.py (moto's S3, the GCS emulator), each store in
turn: `hbpe convert` reads a corpus and a tokenizer from the bucket and writes the train shards into
it (the whole job through bucket URLs, issue 11 §1), real Composer training on CPU reads its shards
from the bucket through streaming and saves into the bucket through Composer's RemoteUploader, hbpe's
run files beside the checkpoints; the save-folder checks, autoresume, eval, generate, export and
consolidate then read the bucket, and their results must equal the same commands on a local copy.
Every command runs in a fresh current directory, which must end up holding only the local caches
(`runs/<run_name>/`), never a folder named after the URI (`s3:/bucket/...`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from composer import Callback, Event

from hbpe.cli import main
from hbpe.pipeline import storage
from hbpe.schemas.errors import ConfigError
from hbpe.training.checkpoint.save_folder import check_save_folder, clear_previous_run, latest_checkpoint
from hbpe.training.train.config_io import load_config
from hbpe.training.train.trainer import build_run
from tests.conftest import split_sample
from tests.helpers import comparable, dir_bytes, get_dir
from tests.object_stores import ObjectStoreServer

RUN_NAME = "bucket-run"
SAVED = [  # what a run leaves in its save folder: Composer's checkpoint and pointer, hbpe's run files
    "ep0-ba4-rank0.pt",
    "hbpe_run.json",
    "latest-rank0.pt.symlink",
    "tokenizer/first_stage.tiktoken",
    "tokenizer/hbpe_tokenizer.json",
    "tokenizer/hbpe_tokenizer_tables.bin",
    "tokenizer/hbpe_tokenizer_tables.json",
]


@dataclass
class BucketRun:
    server: ObjectStoreServer
    bucket: str  # s3://hbpe-...
    cwd: Path  # the current directory of every run and command
    train_output: dict

    @property
    def run(self) -> str:
        return f"{self.bucket}/run"

    def overrides(self, *extra: str) -> list[str]:
        shards = f"{self.bucket}/shards"
        common = [f"data.train={shards}/train", f"data.eval={shards}/eval", f"save_folder={self.run}"]
        quick = ["eval_subset_num_batches=2", "console=false", "log_interval=100ba"]
        return [*common, f"run_name={RUN_NAME}", *quick, *extra]


def _cli(*args: str) -> str:
    r = CliRunner().invoke(main, list(args))
    assert r.exit_code == 0, r.output
    return r.stdout


def _json(*args: str) -> dict:
    out = _cli(*args, "--json")
    return json.loads(out[out.index("{") :])


def test_training_and_everything_after_it_in_a_bucket(
    object_store, gpt2_tokenizer_dir, sample_shards, tmp_path, monkeypatch, caplog
):
    """One conversion and one run per store (Beam's workers and Composer's uploads are processes that import
    their libraries: seconds each), then each step on it in turn; the steps are the functions below."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    bucket = object_store.new_bucket()
    store = BucketRun(object_store, bucket, cwd, {})
    a_corpus_in_the_bucket_converts_into_it_as_locally(store, gpt2_tokenizer_dir, sample_shards, tmp_path)
    storage.upload_dir(sample_shards[1], f"{bucket}/shards/eval")  # the conversion above is the one into a bucket
    store.train_output = _json(
        "train", "tiny", *store.overrides("max_duration=4ba", "eval_interval=4ba", "save_interval=4ba")
    )
    training_saved_checkpoints_and_run_files_into_the_bucket(store)
    a_second_run_is_refused_unless_it_resumes_the_same_model(store)
    eval_generate_and_export_from_the_bucket_equal_the_local_copy(store, sample_shards, tmp_path)
    consolidate_a_sharded_checkpoint_in_the_bucket(store, tmp_path)
    autoresume_continues_from_the_bucket(store, caplog)
    # every command wrote only below the prefix it was given: Composer's `.credentials_validated_successfully`,
    # uploaded by `train` at the bucket's root, is not written any more (issue 28)
    assert {name.split("/")[0] for name in object_store.list(bucket)} == {"corpus", "export", "run", "shards", "tokenizer"}  # fmt: skip


def a_corpus_in_the_bucket_converts_into_it_as_locally(store: BucketRun, tokenizer_dir, sample_shards, tmp) -> None:
    """`hbpe convert` with tokenizer, corpus and output in the bucket, on the runner `auto` picks for a remote
    path (Beam's worker processes, which reach the store only through the options hbpe hands them): the same
    shards as the local conversion of the same text (`sample_shards`)."""
    split_sample(tmp / "corpus")
    store.server.upload_dir(tmp / "corpus", f"{store.bucket}/corpus")
    store.server.upload_dir(tokenizer_dir, f"{store.bucket}/tokenizer")
    shards = f"{store.bucket}/shards/train"
    inputs = ["--tokenizer", f"{store.bucket}/tokenizer", "--input", f"{store.bucket}/corpus/train.jsonl"]
    summary = _json("convert", *inputs, "--out", shards, "--seq-len", "128", "--shard-mb", "1")
    assert summary["timing"]["runner"] == "DirectRunner", summary["timing"]
    assert "COMPLETED" in store.server.list(shards)
    remote = get_dir(store.server, shards, tmp / "train-copy")
    assert comparable(remote) == comparable(dir_bytes(sample_shards[0]))
    assert _json("shards", "verify", "--data", shards)["ok"] is True
    assert sorted(os.listdir(store.cwd)) == []  # no `s3:` folder from the conversion either


def training_saved_checkpoints_and_run_files_into_the_bucket(store: BucketRun) -> None:
    assert store.train_output["batches"] == 4 and store.train_output["save_folder"] == store.run
    assert store.server.list(store.run) == SAVED
    # a bucket has no symlinks: Composer's latest-rank0.pt is an object naming the checkpoint's object
    assert storage.read_bytes(f"{store.run}/latest-rank0.pt.symlink") == b"run/ep0-ba4-rank0.pt"
    meta = json.loads(storage.read_bytes(f"{store.run}/hbpe_run.json"))
    assert meta["train_config"]["save_folder"] == store.run and meta["seq_len"] == 128
    # caches and logs stay local, under runs/<run_name>; nothing named after the URI (the issue's `s3:` folder)
    assert sorted(os.listdir(store.cwd)) == ["runs"]
    assert sorted(os.listdir(store.cwd / "runs" / RUN_NAME)) == ["metrics.jsonl", "stream-cache", "train.log"]


def a_second_run_is_refused_unless_it_resumes_the_same_model(store: BucketRun) -> None:
    before = store.server.list(store.run)
    r = CliRunner().invoke(main, ["train", "tiny", *store.overrides("max_duration=6ba")])
    assert r.exit_code == 2, r.output
    assert f"error: save_folder {store.run} already holds a run (ep0-ba4-rank0.pt, hbpe_run.json, " in r.output
    other = load_config("tiny", store.overrides("max_duration=6ba", "autoresume=true", "model.latent_dim=96"))
    with pytest.raises(ConfigError, match=r"holds a run with another model or tokenizer \(model\.latent_dim 64 -> 96"):
        build_run(other)
    assert store.server.list(store.run) == before  # refused before anything was written
    assert sorted(os.listdir(store.cwd)) == ["runs"]


def eval_generate_and_export_from_the_bucket_equal_the_local_copy(store: BucketRun, sample_shards, tmp_path) -> None:
    local = tmp_path / "run"
    storage.download_dir(store.run, local)
    remote_ckpt, local_ckpt = f"{store.run}/ep0-ba4-rank0.pt", str(local / "ep0-ba4-rank0.pt")
    few = ("--max-batches", "3")
    local_eval = _json("eval", "--checkpoint", local_ckpt, "--data", str(sample_shards[1]), *few)
    remote_eval = _json("eval", "--checkpoint", remote_ckpt, "--data", f"{store.bucket}/shards/eval", *few)
    assert remote_eval["bytes"] == local_eval["bytes"] > 0
    assert remote_eval["bpb"] == pytest.approx(local_eval["bpb"], abs=1e-6)
    # the save folder itself: its latest pointer names the checkpoint
    prompt = ("--prompt", "Fellow-Citizens of the Senate", "--max-bytes", "40")
    text = _cli("generate", "--checkpoint", store.run, *prompt)
    assert text.startswith(prompt[1]) and text == _cli("generate", "--checkpoint", local_ckpt, *prompt)
    assert len(text.encode()) >= len(prompt[1]) + 40, text  # the 40 new bytes were generated
    export = f"{store.bucket}/export"
    summary = _json("export", "--checkpoint", remote_ckpt, "--out", export)
    assert summary["out"] == export and summary["parameters"] > 0
    assert store.server.list(export) == ["hbpe_model.json", "model.safetensors", *SAVED[-4:]]
    assert json.loads(storage.read_bytes(f"{export}/hbpe_model.json"))["source"] == {"checkpoint": remote_ckpt}
    exported_eval = _json("eval", "--checkpoint", export, "--data", str(sample_shards[1]), *few)
    assert exported_eval["bpb"] == pytest.approx(local_eval["bpb"], abs=1e-6)
    r = CliRunner().invoke(main, ["export", "--checkpoint", remote_ckpt, "--out", export])
    assert r.exit_code == 2 and f"--out {export} already holds an export; pass --overwrite" in r.output
    r = CliRunner().invoke(main, ["eval", "--checkpoint", f"{store.run}/ep0-ba9-rank0.pt", "--data", export])
    assert r.exit_code == 2 and f"checkpoint {store.run}/ep0-ba9-rank0.pt does not exist" in r.output
    assert sorted(os.listdir(store.cwd)) == ["runs"]


def consolidate_a_sharded_checkpoint_in_the_bucket(store: BucketRun, tmp_path) -> None:
    """A torch.distributed.checkpoint folder of the run's weights (the layout FSDP2 saves) in the bucket ->
    one `.pt` uploaded beside it, holding the weights of the checkpoint it came from."""
    import torch
    import torch.distributed.checkpoint as dcp

    from hbpe.training.checkpoint.load import load_model

    model, _, _ = load_model(f"{store.run}/ep0-ba4-rank0.pt")
    sharded = tmp_path / "ep0-ba4"
    weights = {f"model.{k}": v.clone() for k, v in model.state_dict().items()}
    dcp.save({"state": {"model": weights}}, checkpoint_id=str(sharded), no_dist=True)
    storage.upload_dir(sharded, f"{store.run}/sharded/ep0-ba4")
    summary = _json("checkpoint", "consolidate", "--checkpoint", f"{store.run}/sharded/ep0-ba4")
    out = f"{store.run}/sharded/ep0-ba4-consolidated.pt"
    assert summary["out"] == out and "sharded/ep0-ba4-consolidated.pt" in store.server.list(store.run)
    r = CliRunner().invoke(main, ["checkpoint", "consolidate", "--checkpoint", f"{store.run}/sharded/ep0-ba4"])
    assert r.exit_code == 2 and f"{out} exists; pass --overwrite" in r.output
    consolidated = load_model(out)[0].state_dict()
    assert consolidated.keys() == model.state_dict().keys()
    for k, v in model.state_dict().items():
        assert torch.equal(consolidated[k], v), k


class _FirstBatch(Callback):
    def __init__(self) -> None:
        self.batch: int | None = None

    def run_event(self, event, state, logger):
        if event == Event.BATCH_START and self.batch is None:
            self.batch = int(state.timestamp.batch)


def autoresume_continues_from_the_bucket(store: BucketRun, caplog) -> None:
    """The pointer names the newest checkpoint: autoresume takes it. Then the state a kill between a checkpoint's
    upload and the pointer's leaves (issue 20; here no pointer at all): autoresume still continues from the newest
    checkpoint (before: from batch 0, then Composer's FileExistsError at the save of ep0-ba4) and moves the pointer."""
    first = _FirstBatch()
    longer = ("autoresume=true", "optim.allow_new_duration=true")  # 4 -> 6 batches: the cosine over the new length
    cfg = load_config("tiny", store.overrides("max_duration=6ba", "eval_interval=6ba", "save_interval=2ba", *longer))
    caplog.clear()
    assert latest_checkpoint(cfg) == f"{store.run}/ep0-ba4-rank0.pt" and "autoresume:" not in caplog.text
    store.server.delete(f"{store.run}/latest-rank0.pt.symlink")
    run = build_run(cfg, callbacks=[first])
    run.trainer.fit()
    run.close()
    assert first.batch == 4 and int(run.trainer.state.timestamp.batch) == 6  # continued at the saved step
    assert store.server.list(store.run)[:3] == ["ep0-ba4-rank0.pt", "ep0-ba6-rank0.pt", "hbpe_run.json"]
    assert storage.read_bytes(f"{store.run}/latest-rank0.pt.symlink") == b"run/ep0-ba6-rank0.pt"
    assert sorted(os.listdir(store.cwd)) == ["runs"]  # Composer's own autoresume would download into ./s3:/...


def test_a_save_folder_on_or_around_shards_in_a_bucket_is_refused(object_store, sample_shards):
    bucket = object_store.new_bucket()
    shards = f"{bucket}/shards/train"
    storage.upload_dir(sample_shards[0], shards)
    common = [f"data.train={shards}", "data.eval=null"]
    for folder, where in ((shards, "is"), (f"{shards}/sub", "lies inside"), (f"{bucket}/shards", "contains")):
        cfg = load_config("tiny", [*common, f"save_folder={folder}"])
        with pytest.raises(ConfigError, match=rf"^save_folder {folder} {where} the shard directory data\.train="):
            check_save_folder(cfg)
    other = f"{bucket}/other"
    storage.upload_dir(sample_shards[1], other)  # not a source of this run, but a shard directory
    cfg = load_config("tiny", [*common, f"save_folder={other}"])
    with pytest.raises(ConfigError, match=rf"^save_folder {other} holds a shard directory's files \(manifest\.json, "):
        check_save_folder(cfg)
    check_save_folder(load_config("tiny", [*common, f"save_folder={bucket}/shards-run"]))  # a prefix, not a folder
    cfg = load_config("tiny", [*common, f"save_folder={bucket}-missing/run"])
    with pytest.raises(
        ConfigError, match=rf"^save_folder {bucket}-missing/run: bucket '{bucket[5:]}-missing' does not"
    ):
        check_save_folder(cfg)


def test_save_overwrite_in_a_bucket_names_the_checkpoints_it_cannot_delete(object_store, caplog):
    run = f"{object_store.new_bucket()}/run"
    for name in ("ep0-ba8-rank0.pt", "hbpe_run.json", "notes.txt"):
        storage.write_bytes(f"{run}/{name}", b"x")
    assert clear_previous_run(run) == []
    assert f"{run} keeps the previous run's ep0-ba8-rank0.pt until the new run saves" in caplog.text
    assert object_store.list(run) == ["ep0-ba8-rank0.pt", "hbpe_run.json", "notes.txt"]


def test_save_folder_schemes():
    def save_folder(value: str) -> str:
        return load_config("tiny", ["data.train=s", f"save_folder={value}"], check_paths=False).save_folder

    assert save_folder("file:///tmp/run") == "/tmp/run" and save_folder("gs://b/run") == "gs://b/run"
    with pytest.raises(
        ConfigError, match=r"^save_folder=hf://b/run: hf:// is not supported \(hbpe reads and writes s3:// and gs://"
    ):
        save_folder("hf://b/run")
    # a store keeps `..` and empty parts as written: checkpoints a download then refuses (issue 28)
    with pytest.raises(ConfigError, match=r"^save_folder=s3://b/a/\.\./run: the object prefix 'a/\.\./run' has an emp"):
        save_folder("s3://b/a/../run")
