"""Shards -> models: the hierarchical patch LM, its data, Composer training, eval, generation, export.

The rooms, in data order (each imports only the earlier ones; tests/test_module_graph.py):

    data/        shards -> batches: shard checks, token rows, byte patching, schemes, loaders (numpy)
    model/       the patch LM, its local models and layers, the entropy model, FLOPs (plain torch)
    checkpoint/  safe loading, run folders, sharded checkpoints, the export format, `load_model`
    train/       Composer: the trainer, optimizer, FSDP, loggers and callbacks, calibration, launch
    inference/   evaluate (BPB), generate, zero-shot tasks, Table 1's measured columns

and schemes/, one spec per `model.io` gathering its hooks from those rooms; the rooms ask its registry
(a leaf), which loads the built-in specs on first use.

The public API is the names below, imported on first use (so `import hbpe.training` stays light and
a command pays only for what it runs); the CLI and the experiments use only these:

>>> import hbpe.training as hbt
>>> cfg = hbt.load_config("tiny", ["data.train=runs/demo/shards-train"], check_paths=False)
>>> cfg.model.io, cfg.global_batch_size
('hierarchical', 8)
"""

from __future__ import annotations

import importlib
from typing import Any

if __name__ != "hbpe.training":  # `import training` from the repository root would load a second, different copy
    raise ImportError(f"import hbpe.training, not {__name__}: the folder training/ is hbpe.training (pip install -e .)")

# public name -> the module that defines it
_API = {
    # configs and training
    "TrainConfig": "hbpe.schemas.train_config",
    "ModelConfig": "hbpe.schemas.train_config",
    "load_config": "hbpe.training.train.config_io",
    "train_model": "hbpe.training.train.trainer:train",  # not `train`: that is the room hbpe.training.train
    "build_run": "hbpe.training.train.trainer",
    "launch": "hbpe.training.train.launch_command",
    "TrainingInterrupted": "hbpe.training.train.launch_command",
    "RESULT_FILE_ENV": "hbpe.training.train.launch",
    "resolve_tokenizer": "hbpe.training.train.calibration",
    # models and checkpoints
    "PatchLM": "hbpe.training.model.patch_lm",
    "build_model": "hbpe.training.model.patch_lm",
    "resolve_device": "hbpe.training.model.devices",
    "load_model": "hbpe.training.checkpoint.load",
    "export_model": "hbpe.training.checkpoint.export",
    "consolidate_checkpoint": "hbpe.training.checkpoint.consolidate",
    # evaluation and generation
    "evaluate": "hbpe.training.inference.evaluate",
    "generate": "hbpe.training.inference.generate",
    "generate_batch": "hbpe.training.inference.generate",
    "check_generate_args": "hbpe.training.inference.generate",
    "check_sampling_args": "hbpe.training.inference.sampling",
    "plot_run": "hbpe.training.train.plot_metrics",
    "evaluate_tasks": "hbpe.training.inference.zero_shot.run",
    "render_task_table": "hbpe.training.inference.zero_shot.run:render_table",
    "parse_tasks": "hbpe.training.inference.zero_shot.tasks",
    "flops_table": "hbpe.training.inference.scheme_stats",
    "render_table1": "hbpe.training.inference.scheme_stats",
    "with_measured_data": "hbpe.training.inference.scheme_stats",
    "paper_setup_rows": "hbpe.training.model.paper_flops",
    "render_ffn_readings": "hbpe.training.model.paper_flops",
    "render_paper_setup": "hbpe.training.model.paper_flops",
    # schemes (`model.io`): a new one subclasses SchemeSpec and registers it
    "SchemeSpec": "hbpe.training.schemes.registry",
    "register_scheme": "hbpe.training.schemes.registry",
    "scheme_spec": "hbpe.training.schemes.registry",
    # the pieces an experiment combines (hbpe/experiments): batches of a scheme, patching measured on shards
    "scheme_for": "hbpe.training.checkpoint.load",
    "vocabulary_bytes": "hbpe.training.data.schemes",
    "read_token_rows": "hbpe.training.data.token_rows",
    "check_finite_bpb": "hbpe.training.inference.evaluate",
    "count_words": "hbpe.training.inference.scheme_stats",
    "measure": "hbpe.training.inference.scheme_stats",
    "table1_row": "hbpe.training.inference.scheme_stats",
    "load_yaml": "hbpe.training.train.config_io",
    # benchmarks
    "bench_train": "hbpe.training.bench",
    "bench_train_side_by_side": "hbpe.training.bench",
    "bench_generate": "hbpe.training.bench",
}
__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    where = _API.get(name)
    if where is None:
        raise AttributeError(f"module 'hbpe.training' has no attribute {name!r}")
    module, _, attr = where.partition(":")
    value = getattr(importlib.import_module(module), attr or name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
