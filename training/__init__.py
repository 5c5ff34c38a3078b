"""Shards -> models: the hierarchical patch LM, its data, Composer training, eval, generation, export.

The rooms, in data order (each imports only the earlier ones; tests/test_module_graph.py):

    data/        shards -> batches: shard checks, token rows, byte patching, schemes, loaders (numpy)
    model/       the patch LM, its local models and layers, the entropy model, FLOPs (plain torch)
    checkpoint/  safe loading, run folders, sharded checkpoints, the export format, `load_model`
    train/       Composer: the trainer, optimizer, FSDP, loggers and callbacks, calibration, launch
    inference/   evaluate (BPB), generate, zero-shot tasks, Table 1's measured columns

and schemes/, one spec per `model.io` gathering its hooks from those rooms; the rooms ask its registry
(a leaf), which loads the built-in specs on first use.

The public API is the names below; the CLI and the experiments use only these:

>>> import hbpe.training as hbt
>>> cfg = hbt.load_config("tiny", ["data.train=runs/demo/shards-train"], check_paths=False)
>>> cfg.model.io, cfg.global_batch_size
('hierarchical', 8)

Each is a plain `from ... import` that editors and type checkers follow. Those that need neither
torch nor Composer are imported at once; the rest (torch and Composer take seconds to import) are
listed under TYPE_CHECKING and imported on first use by `__getattr__`, which reads that same list,
so `import hbpe.training` stays light and a command pays only for what it runs.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

if __name__ != "hbpe.training":  # `import training` from the repository root would load a second, different copy
    raise ImportError(f"import hbpe.training, not {__name__}: the folder training/ is hbpe.training (pip install -e .)")

# standard library only
from hbpe.schemas.train_config import ModelConfig, TrainConfig
from hbpe.training.inference.zero_shot.tasks import parse_tasks
from hbpe.training.schemes.registry import SchemeSpec, register_scheme, scheme_spec
from hbpe.training.train.launch_command import RESULT_FILE_ENV, TrainingInterrupted, launch

if TYPE_CHECKING:  # torch, Composer, omegaconf: imported on first use (the `__getattr__` below reads this block)
    from hbpe.training.bench import bench_generate, bench_train, bench_train_side_by_side
    from hbpe.training.checkpoint.consolidate import consolidate_checkpoint
    from hbpe.training.checkpoint.export import export_model
    from hbpe.training.checkpoint.load import load_model, scheme_for
    from hbpe.training.data.schemes import vocabulary_bytes
    from hbpe.training.data.token_rows import read_token_rows
    from hbpe.training.inference.evaluate import check_finite_bpb, evaluate
    from hbpe.training.inference.generate import check_generate_args, generate, generate_batch
    from hbpe.training.inference.sampling import check_sampling_args
    from hbpe.training.inference.scheme_stats import (
        count_words,
        flops_table,
        measure,
        render_table1,
        table1_row,
        with_measured_data,
    )
    from hbpe.training.inference.zero_shot.run import evaluate_tasks
    from hbpe.training.inference.zero_shot.run import render_table as render_task_table
    from hbpe.training.model.build import build_model
    from hbpe.training.model.devices import resolve_device
    from hbpe.training.model.paper_flops import paper_setup_rows, render_ffn_readings, render_paper_setup
    from hbpe.training.model.patch_lm import PatchLM
    from hbpe.training.train.calibration import resolve_tokenizer
    from hbpe.training.train.config_io import load_config, load_yaml
    from hbpe.training.train.plot_metrics import plot_run
    from hbpe.training.train.trainer import build_run
    from hbpe.training.train.trainer import train as train_model  # not `train`: that is the room hbpe.training.train

__all__ = [
    # configs and training
    "TrainConfig",
    "ModelConfig",
    "load_config",
    "load_yaml",
    "train_model",
    "build_run",
    "launch",
    "TrainingInterrupted",
    "RESULT_FILE_ENV",
    "resolve_tokenizer",
    # models and checkpoints
    "PatchLM",
    "build_model",
    "resolve_device",
    "load_model",
    "export_model",
    "consolidate_checkpoint",
    # evaluation and generation
    "evaluate",
    "check_finite_bpb",
    "generate",
    "generate_batch",
    "check_generate_args",
    "check_sampling_args",
    "plot_run",
    "evaluate_tasks",
    "render_task_table",
    "parse_tasks",
    "flops_table",
    "render_table1",
    "with_measured_data",
    "paper_setup_rows",
    "render_ffn_readings",
    "render_paper_setup",
    # schemes (`model.io`): a new one subclasses SchemeSpec and registers it
    "SchemeSpec",
    "register_scheme",
    "scheme_spec",
    # the pieces an experiment combines (hbpe/experiments): batches of a scheme, patching measured on shards
    "scheme_for",
    "vocabulary_bytes",
    "read_token_rows",
    "count_words",
    "measure",
    "table1_row",
    # benchmarks
    "bench_train",
    "bench_train_side_by_side",
    "bench_generate",
]


@functools.cache
def _lazy_imports() -> dict[str, tuple[str, str]]:
    """Public name -> (module, attribute), read from the TYPE_CHECKING block above (one list for tools and for us)."""
    import ast  # only on the first lazy name, which then imports torch: nothing next to that
    from pathlib import Path

    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    return {
        a.asname or a.name: (n.module, a.name) for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names
    }


def __getattr__(name: str) -> Any:
    where = _lazy_imports().get(name)
    if where is None:
        raise AttributeError(f"module 'hbpe.training' has no attribute {name!r}")
    module, attr = where
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
