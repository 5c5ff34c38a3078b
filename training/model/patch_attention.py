"""Attention within each patch of packed rows, in one native call per layer on CPU (`_patch_attention.c`).

The packed local models' torch path (layers.Attention._packed) sorts the rows by patch length and
runs one SDPA call per length present, after RoPE as a separate product; at a 4K first stage and
S = 10 that is ~10 calls per layer over blocks of 1-10 symbol patches, plus the permutations, the
rotation and the block concatenations, which together cost more than the arithmetic. The C kernel
walks the patches in their row-major order instead: each patch's scores, softmax and weighted
values stay in a scratch of its own length, RoPE is applied as q and k are loaded, and the
backward reads the softmax weights the forward kept (H * sum l^2 values per layer, a fraction of
one (N, d) activation) instead of recomputing a dot product and an exp per pair. It is the same
function; tests hold it to the torch path and to the padded model.

It runs where it can: CPU tensors of float32 or float64 (bf16 autocast leaves the local
projections in bf16 and takes the torch path), no attention dropout in training, and the
extension built. `model.packed_attention: blocks` forces the torch path (for measuring).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.autograd.function import once_differentiable

from hbpe.schemas.train_config import PACKED_ATTENTION
from hbpe.training.model.packing import PatchPacking

try:
    from hbpe.training.model import _patch_attention
except ImportError:  # a source checkout that was never `pip install`ed: the torch path runs
    _patch_attention = None


def native_applies(x: torch.Tensor, packing: PatchPacking, *, heads: int, choice: str, dropout: float) -> bool:
    """Whether the native kernel runs a packed stack over rows x (N, d): see the module docstring.

    Also not where the softmax weights it keeps (heads * sum l^2 values per layer) would outgrow one (N, d)
    activation: long patches (space or entropy patches run to 1,025 bytes) take the torch path, whose SDPA
    keeps O(N) per layer. Short patches are far inside it: 0.31x one activation at crossover-mini (4.3
    symbols per patch, H = 4, d = 64)."""
    if choice not in PACKED_ATTENTION:
        raise ValueError(f"packed attention {choice!r}: one of {PACKED_ATTENTION}")
    return (
        choice == "auto"
        and _patch_attention is not None
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and not dropout
        and not torch.is_autocast_enabled("cpu")
        and heads * packing.attention_pairs() <= x.numel()
    )


def patch_attention(
    qkv: torch.Tensor, packing: PatchPacking, *, heads: int, theta: float, causal: bool
) -> torch.Tensor:
    """qkv (N, 3 * D): the fused projection of row-major packed rows, q, k, v per head before RoPE -> (N, D),
    each row attending within its own patch (causal: to its patch's rows up to itself)."""
    if qkv.dtype not in (torch.float32, torch.float64):  # the C code would read other items' bytes as floats
        raise TypeError(f"patch attention runs on float32 or float64 qkv, not {qkv.dtype}")
    head_dim = qkv.shape[1] // 3 // heads
    cos, sin = packing.rotation_table(head_dim, theta, qkv.dtype)
    return _PatchAttention.apply(qkv, packing.counts, cos, sin, heads, causal)


def _buffer(t: torch.Tensor):  # noqa: ANN202 (a numpy view: numpy is not imported here for a type)
    """A zero-copy view the C code reads through the buffer protocol."""
    return t.detach().numpy()


class _PatchAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, lens, cos, sin, heads: int, causal: bool):  # noqa: ANN001, ANN205
        qkv, lens = qkv.contiguous(), lens.to(torch.int64).contiguous()
        N, D = qkv.shape[0], qkv.shape[1] // 3
        head_dim = D // heads
        squares = lens * lens
        # each patch's softmax weights (H, l, l): sum l^2 * H values, a fraction of one (N, D) activation
        y, probs = qkv.new_empty(N, D), qkv.new_empty(int(squares.sum()) * heads)
        scale = 1.0 / math.sqrt(head_dim)
        args = (heads, head_dim, causal, scale, qkv.element_size())
        tables = (_buffer(cos), _buffer(sin))
        q, out, p, n = (_buffer(t) for t in (qkv, y, probs, lens))

        def part(m: slice, r: slice, w: slice) -> None:
            _patch_attention.forward(q[r], n[m], *tables, out[r], p[w], *args)

        _in_parts(lens, squares * heads, part)
        ctx.save_for_backward(qkv, y, probs, lens, squares, cos, sin)
        ctx.args = args
        return y

    @staticmethod
    @once_differentiable  # the C backward is not itself differentiable: a double backward raises, not a silent 0
    def backward(ctx, dy):  # noqa: ANN001, ANN205
        qkv, y, probs, lens, squares, cos, sin = ctx.saved_tensors
        dqkv = torch.empty_like(qkv)
        q, out, p, g, n, grad = (_buffer(t) for t in (qkv, y, probs, dy.contiguous(), lens, dqkv))
        tables = (_buffer(cos), _buffer(sin))

        def part(m: slice, r: slice, w: slice) -> None:
            _patch_attention.backward(q[r], out[r], p[w], g[r], n[m], *tables, grad[r], *ctx.args)

        _in_parts(lens, squares * ctx.args[0], part)
        return dqkv, None, None, None, None, None


ROWS_PER_THREAD = 4096  # below this a thread's start costs more than its share of the patches


def _in_parts(lens: torch.Tensor, weights: torch.Tensor, part: Callable[[slice, slice, slice], None]) -> None:
    """part(patches, their rows, their softmax weights) over the patches split into about equal runs of rows,
    one per torch thread: the C code releases the GIL, so the runs go in parallel as torch's own ops would.
    Each patch is computed whole by one call, so the result does not depend on the split."""
    ends = lens.cumsum(0)
    total = int(ends[-1]) if ends.numel() else 0
    parts = max(1, min(torch.get_num_threads(), total // ROWS_PER_THREAD))
    if parts == 1:
        everything = slice(None)
        part(everything, everything, everything)
        return
    # patch boundaries nearest to equal shares of the rows
    cuts = torch.searchsorted(ends, torch.arange(1, parts) * total // parts, right=True).tolist()
    bounds = [0, *cuts, lens.numel()]
    row_at, weight_at = [0, *ends.tolist()], [0, *weights.cumsum(0).tolist()]
    spans = [
        (slice(a, b), slice(row_at[a], row_at[b]), slice(weight_at[a], weight_at[b]))
        for a, b in zip(bounds, bounds[1:], strict=False)
        if b > a
    ]
    list(_pool(len(spans)).map(lambda span: part(*span), spans))


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hbpe-patch-attention")


# A forked child inherits the pools but none of their threads: its calls would wait on them forever. It starts
# its own.
os.register_at_fork(after_in_child=_pool.cache_clear)
