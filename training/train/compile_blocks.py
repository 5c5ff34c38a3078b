"""`compile: true`: torch.compile each transformer block on its own, in place (torchtitan's per-block compile),
and the loss.

A block is the unit FSDP wraps and activation checkpointing recomputes, and every block of a stack has the same
shapes, so a few compiled graphs serve all of them (the blocks share one code cache: the local stacks' rows and the
latent's sequences compile apart, then run dynamic) and a wrapper around a block still sees a module. The whole
model is not compiled at once: its batch-dependent glue (pooling, the decoder's inputs) is cheap and would tie
the graph to each scheme's code. On the loader's tiles a block has static shapes and no data-dependent op
(training/model/tiles.py), so it compiles with no graph break (tests/training/test_tiles.py, forward and
backward, every block); on the length blocks (packed_attention: blocks)
each mix of patch lengths is a new guard and recompiles, which is why `auto` lays out tiles on a GPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hbpe.training.model.layers import Block
from hbpe.training.model.patch_io import cross_entropy_sum


def compile_blocks(model: nn.Module, *, backend: str = "inductor") -> int:
    """Compile every `Block` of `model` in place (nn.Module.compile); -> how many."""
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for block in blocks:
        block.compile(backend=backend)
    return len(blocks)


def compile_loss(cmodel: Any, *, backend: str = "inductor") -> None:
    """Compile the ComposerModel's summed NLL: eager, `cross_entropy_sum` copies the logits to fp32 before the
    softmax (for BPE at batch 64 x 128, 8,192 x 50,259 values); compiled, the cast fuses into the softmax's
    kernel and no fp32 copy is made. Its row count changes with the tiles' buckets: dynamo marks it dynamic
    after the first change (one recompile)."""
    cmodel.nll_sum = torch.compile(cross_entropy_sum, backend=backend)
