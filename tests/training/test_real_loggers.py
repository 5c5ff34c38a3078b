"""The `loggers:` block with the real trackers: wandb in offline mode and MLflow with a file store, both in
tmp_path, no network (the `loggers` extra: pip install -e '.[loggers]')."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hbpe.cli import main


def _train(sample_shards, folder, loggers: str) -> dict:
    train_dir, eval_dir = sample_shards
    args = ["train", "tiny", f"data.train={train_dir}", f"data.eval={eval_dir}", f"save_folder={folder}"]
    args += ["max_duration=2ba", "eval_interval=2ba", "save_interval=2ba", "eval_subset_num_batches=2"]
    r = CliRunner().invoke(main, [*args, "console=false", f"loggers={loggers}", "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_mlflow_file_store_holds_the_run_metrics(sample_shards, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the loggers extra: pip install -e '.[loggers]'")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses a file store without it
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    result = _train(
        sample_shards,
        tmp_path / "run",
        f"{{mlflow: {{tracking_uri: '{uri}', experiment_name: hbpe-test, log_system_metrics: false}}}}",
    )
    client = MlflowClient(uri)
    [exp] = [e for e in client.search_experiments() if e.name == "hbpe-test"]
    [run] = client.search_runs([exp.experiment_id])
    history = client.get_metric_history(run.info.run_id, "metrics/eval/BitsPerByte")
    assert history and history[-1].value == pytest.approx(result["eval"]["BitsPerByte"], rel=1e-6)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss/train/total")]


def test_wandb_offline_run_holds_the_run_metrics(sample_shards, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the loggers extra: pip install -e '.[loggers]'")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    result = _train(sample_shards, tmp_path / "run", "{wandb: {project: hbpe-test}}")
    [run_dir] = list((tmp_path / "wandb").glob("offline-run-*"))
    import wandb

    wandb.teardown()  # what the process's exit does: the wandb service writes out the run's records
    [record_file] = list(run_dir.glob("run-*.wandb"))  # the offline run's record, for `wandb sync`
    history = _wandb_history(record_file)
    assert history["metrics/eval/BitsPerByte"][-1] == pytest.approx(result["eval"]["BitsPerByte"], rel=1e-6)
    assert len(history["loss/train/total"]) == 2  # one value per trained batch


def _wandb_history(path) -> dict[str, list[float]]:
    """Every value the run logged, by key, read back from the offline run's transaction log."""
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal import datastore

    store = datastore.DataStore()
    store.open_for_scan(str(path))
    out: dict[str, list[float]] = {}
    while (data := store.scan_data()) is not None:
        rec = pb.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "history":
            for item in rec.history.item:
                out.setdefault(item.key or "/".join(item.nested_key), []).append(json.loads(item.value_json))
    return out
