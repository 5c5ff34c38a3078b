"""The worked examples in the core algorithms' docstrings run, so they cannot drift from the code."""

from __future__ import annotations

import doctest

import numpy as np
import pytest


@pytest.mark.parametrize(
    "module",
    [
        "hbpe.pipeline.tokenizer.second_stage.apply",
        "hbpe.pipeline.tokenizer.pair_merges",
        "hbpe.pipeline.tokenizer.hierarchical",
        "hbpe.pipeline.beam.shard_tasks",
        "hbpe.training.model.flops",
        "hbpe.training.data.byte_patching",
        "hbpe.training.checkpoint.export_format",
        "hbpe.training.model.devices",
        "hbpe.schemas.manifest",
        "hbpe.api",
        "hbpe.training",
        "hbpe.schemas.names",
        "hbpe.schemas.locations",
        "hbpe.pipeline.storage",
        "hbpe.pipeline.beam.stores",
        "hbpe.pipeline.tokenizer.first_stage_train",
    ],
)
def test_docstring_examples(module, gpt2_tokenizer):
    import importlib

    mod = importlib.import_module(module)
    result = doctest.testmod(mod, extraglobs={"tok": gpt2_tokenizer, "np": np}, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0, f"{module} has no worked example"
