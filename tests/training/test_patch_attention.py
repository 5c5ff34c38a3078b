"""The native per-patch attention (training/model/_patch_attention.c) computes the torch path's function.

The torch path (layers.Attention._packed: length blocks, SDPA, RoPE as a complex product) is the
reference: the kernel's output and its gradient with respect to the fused qkv projection agree with
it to float64 rounding, over patches of every length from 1 to past S, causal and bidirectional.
Both paths share PatchPacking's RoPE frequencies, so both are also held to an attention written here
from the formulas (theta_i = base^(-2i/d), each channel pair turned by position * theta_i), and the
frequency helper to the formula itself. Whole models are held to the padded layout in
test_packed_local.py with the kernel on and off.
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import model_config
from hbpe.training.model import patch_attention as pa
from hbpe.training.model.layers import Attention, rope
from hbpe.training.model.packing import PatchPacking

pytestmark = pytest.mark.skipif(pa._patch_attention is None, reason="the C extension is not built")

LENGTHS = [1, 3, 1, 7, 2, 17, 5, 1, 10, 4, 4, 9, 6, 2]  # 1 to past S = 10, in no order


def _packing(lengths: list[int]) -> PatchPacking:
    real = torch.zeros(len(lengths), max(lengths), dtype=torch.bool)
    for m, n in enumerate(lengths):
        real[m, :n] = True
    return PatchPacking.from_real(real)


def _both(dtype: torch.dtype, causal: bool, *, heads: int = 4, dim: int = 32, seed: int = 0):
    """The same Attention layer on the same rows, through the kernel and through the torch path:
    outputs, the rows' gradients and the qkv weight's gradient of each."""
    torch.manual_seed(seed)
    packing = _packing(LENGTHS)
    attn = Attention(dim, heads, 10000.0, dropout=0.0).double()
    with torch.no_grad():  # scores far from uniform: softmax weights near 0 and 1 are exercised
        attn.qkv.weight.mul_(40.0)
    attn = attn.to(dtype)  # the same values in either precision: drawn in float64, then rounded
    x = torch.randn(packing.size, dim, dtype=torch.float64).to(dtype)
    g = torch.randn(packing.size, dim, dtype=torch.float64).to(dtype)
    out = {}
    for native in (True, False):
        rows = x.clone().requires_grad_()
        attn.zero_grad()
        if native:
            y = attn(rows, causal=causal, packing=packing, native=True)
        else:  # the torch path reads rows in length order and writes them so
            y = attn(rows.index_select(0, packing.order), causal=causal, packing=packing)
            y = y.index_select(0, packing.inverse)
        y.backward(g)
        out[native] = (y.detach(), rows.grad, attn.qkv.weight.grad.clone(), attn.out.weight.grad.clone())
    return out[True], out[False]


@pytest.mark.parametrize("causal", [False, True])
def test_the_kernel_is_the_torch_paths_function_in_float64(causal):
    native, torch_path = _both(torch.float64, causal)
    for a, b, what in zip(native, torch_path, ("output", "rows' grad", "qkv grad", "out grad"), strict=True):
        scale = b.abs().max()
        assert float((a - b).abs().max() / scale) < 1e-12, what


@pytest.mark.parametrize("causal", [False, True])
def test_in_float32_the_kernel_rounds_as_closely_as_sdpa(causal):
    """fp32: both within a few ulps of the torch path's float64 function; not of the kernel's own float64 output,
    which a bug in code both of the kernel's precisions run (its RoPE tables, say) shares."""
    _, exact = _both(torch.float64, causal)  # the torch path: length blocks and SDPA
    native, torch_path = _both(torch.float32, causal)
    for i, what in enumerate(("output", "rows' grad", "qkv grad")):
        scale = exact[i].abs().max()
        err_native = float((native[i].double() - exact[i]).abs().max() / scale)
        err_torch = float((torch_path[i].double() - exact[i]).abs().max() / scale)
        assert err_native < 1e-3 and err_native <= 2 * err_torch + 1e-6, (what, err_native, err_torch)


def _formula_frequencies(head_dim: int, base: float) -> torch.Tensor:
    """theta_i = base^(-2i/d) for the channel pairs i = 0 .. d/2 - 1, in float64 (RoFormer, eq. 15)."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    return torch.tensor(base, dtype=torch.float64) ** (-2.0 * i / head_dim)


def _formula_rope(t: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """t (..., L, H, Dh) with each channel pair (x_2i, x_2i+1) at position p turned by the angle p * theta_i."""
    ang = positions.double()[:, None] * _formula_frequencies(t.shape[-1], base)[None, :]  # (L, Dh/2)
    c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]  # (L, 1, Dh/2): one angle for every head
    even, odd = t[..., 0::2], t[..., 1::2]
    out = torch.empty_like(t)
    out[..., 0::2], out[..., 1::2] = even * c - odd * s, even * s + odd * c
    return out


def _formula_attention(attn: Attention, x: torch.Tensor, lengths: list[int], causal: bool) -> torch.Tensor:
    """Each patch's rows (in row-major order) attend within the patch, at RoPE positions 0 .. l-1: softmax(q k^T /
    sqrt(Dh)) v per head, written out in float64 with no helper of hbpe's but the layer's two projections."""
    H = attn.heads
    D = x.shape[1]
    Dh = D // H
    outs, start = [], 0
    for n in lengths:
        q, k, v = attn.qkv(x[start : start + n]).double().view(n, 3, H, Dh).unbind(1)  # 3 x (l, H, Dh)
        pos = torch.arange(n)
        q, k = _formula_rope(q, pos, attn.theta), _formula_rope(k, pos, attn.theta)
        scores = torch.einsum("qhd,khd->hqk", q, k) / Dh**0.5  # (H, l, l)
        if causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, D))
        start += n
    return attn.out(torch.cat(outs).to(x.dtype))


def test_the_rope_helpers_are_the_formula():
    """PatchPacking's frequencies (both paths' RoPE), its two tables (the kernel's, the torch path's) and the padded
    layout's `rope` against theta_i = base^(-2i/d) and the pair rotation, to fp32 rounding of the angles."""
    packing = _packing(LENGTHS)
    for head_dim, base in ((8, 10000.0), (16, 500.0), (64, 1e6)):
        expected = _formula_frequencies(head_dim, base)
        torch.testing.assert_close(packing._frequencies(head_dim, base).double(), expected, rtol=1e-6, atol=0)
        ang = torch.arange(max(LENGTHS), dtype=torch.float64)[:, None] * expected[None, :]  # (L, Dh/2)
        cos, sin = packing.rotation_table(head_dim, base, torch.float64)
        torch.testing.assert_close(cos, ang.cos(), rtol=0, atol=1e-5)
        torch.testing.assert_close(sin, ang.sin(), rtol=0, atol=1e-5)
        turn = packing.rotation(head_dim, base)[:, 0]  # (N, Dh/2) at each length-ordered row's slot
        slot = packing.col.index_select(0, packing.order).double()[:, None] * expected[None, :]
        torch.testing.assert_close(turn.real.double(), slot.cos(), rtol=0, atol=1e-5)
        torch.testing.assert_close(turn.imag.double(), slot.sin(), rtol=0, atol=1e-5)
        t = torch.randn(2, 3, 7, head_dim, dtype=torch.float64)  # (B, H, L, Dh)
        pos = torch.arange(5, 12)
        padded = rope(t, pos, base).transpose(1, 2)  # (B, L, H, Dh)
        torch.testing.assert_close(padded, _formula_rope(t.transpose(1, 2), pos, base), rtol=0, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_both_paths_are_the_formulas_attention(causal):
    """Kernel and torch path against attention written from the formulas (its own RoPE): a frequency helper that
    both share cannot hide here. float64, weights scaled so that softmax is far from uniform; the tolerance is
    the fp32 rounding of the RoPE angles both paths use (their factors are fp32 values)."""
    torch.manual_seed(4)
    packing = _packing(LENGTHS)
    attn = Attention(32, 4, 10000.0, dropout=0.0).double()
    with torch.no_grad():
        attn.qkv.weight.mul_(4.0)
    x = torch.randn(packing.size, 32, dtype=torch.float64)
    with torch.no_grad():
        expected = _formula_attention(attn, x, LENGTHS, causal)
        native = attn(x, causal=causal, packing=packing, native=True)
        torch_path = attn(x.index_select(0, packing.order), causal=causal, packing=packing)
        torch_path = torch_path.index_select(0, packing.inverse)
    scale = expected.abs().max()
    for got, what in ((native, "kernel"), (torch_path, "torch path")):
        assert float((got - expected).abs().max() / scale) < 1e-5, what


def test_gradcheck_of_the_kernel_alone():
    """The backward against finite differences of the forward, in float64, RoPE and the causal mask included."""
    packing = _packing([1, 4, 2, 6])
    torch.manual_seed(1)
    qkv = torch.randn(packing.size, 3 * 8, dtype=torch.float64, requires_grad=True)
    for causal in (False, True):
        assert torch.autograd.gradcheck(
            lambda t, c=causal: pa.patch_attention(t, packing, heads=2, theta=10000.0, causal=c), (qkv,)
        )


def test_a_one_symbol_patch_gets_its_value_exactly():
    packing = _packing([1, 1, 3])
    qkv = torch.randn(packing.size, 3 * 8)
    y = pa.patch_attention(qkv, packing, heads=2, theta=10000.0, causal=False)
    assert torch.equal(y[:2], qkv[:2, 16:])  # softmax over one key is 1: y is v, bit for bit


def test_no_rows_at_all():
    packing = PatchPacking.from_real(torch.zeros(3, 4, dtype=torch.bool))
    qkv = torch.zeros(0, 24, requires_grad=True)
    y = pa.patch_attention(qkv, packing, heads=2, theta=10000.0, causal=True)
    y.sum().backward()
    assert y.shape == (0, 8) and qkv.grad.shape == (0, 24)


def _misaligned(*shape: int) -> torch.Tensor:
    """Zeros of float32 one byte past an aligned address."""
    return torch.frombuffer(bytearray(4 * int(np.prod(shape)) + 1), dtype=torch.float32, offset=1).view(shape)


def _call(qkv, lens, cos, sin, y, probs, heads=2, head_dim=4, itemsize=4):
    pa._patch_attention.forward(
        *(t.numpy() if isinstance(t, torch.Tensor) else t for t in (qkv, lens, cos, sin, y, probs)),
        heads,
        head_dim,
        False,
        0.5,
        itemsize,
    )


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(lens=torch.tensor([2, 2], dtype=torch.int64)), "sum to 4"),
        (dict(lens=torch.tensor([-1, 4], dtype=torch.int64)), "length -1"),
        (dict(lens=torch.tensor([1, 1, 1], dtype=torch.int32)), "lens not int64"),
        (dict(cos=torch.zeros(1, 2), sin=torch.zeros(1, 2)), "short of 2 slots"),
        (dict(y=torch.zeros(2, 8)), "y holds"),
        (dict(probs=torch.zeros(9)), "probs holds"),
        (dict(itemsize=8), "whole rows|holds"),
        (dict(head_dim=3), "even head_dim"),
        (dict(qkv=torch.zeros(3, 23)), "whole rows"),
        (dict(qkv=_misaligned(3, 24)), "qkv is not aligned"),  # a view at a byte offset: no float reads there
        (dict(y=_misaligned(3, 8)), "y is not aligned"),
        # no rows, but heads * head_dim past the kernels' int row index is refused all the same
        (
            dict(
                qkv=torch.zeros(0),
                lens=torch.zeros(2, dtype=torch.int64),
                y=torch.zeros(0),
                probs=torch.zeros(0),
                heads=1 << 30,
            ),
            "heads \\* head_dim = 4294967296 is past",
        ),
    ],
)
def test_a_wrong_call_is_refused_before_any_read(bad, message):
    """The C code checks every length and size against the buffers it is given: ValueError, never a read
    past a buffer (the Python wrapper always passes consistent ones; this holds it to that contract)."""
    args = dict(
        qkv=torch.zeros(3, 24),
        lens=torch.tensor([1, 2], dtype=torch.int64),
        cos=torch.zeros(3, 2),
        sin=torch.zeros(3, 2),
        y=torch.zeros(3, 8),
        probs=torch.zeros(2 * (1 + 4)),
    )
    args.update(bad)
    with pytest.raises(ValueError, match=message):
        _call(**args)


def test_lens_inside_an_output_buffer_cannot_steer_the_kernel_out_of_bounds():
    """The lengths are checked once, then the kernel writes y and the weights: it reads its own copy of them, so an
    output that overlaps lens (here the weights' first bytes) cannot turn them into unchecked ones mid-call."""
    torch.manual_seed(3)
    qkv, cos, sin = torch.randn(4, 24), torch.rand(2, 2), torch.rand(2, 2)
    y, probs = torch.zeros(4, 8), torch.zeros(2 * (4 + 4))
    lens = probs.view(torch.int64)[:2]  # 16 bytes of the weights' buffer
    lens.copy_(torch.tensor([2, 2]))
    _call(qkv, lens, cos, sin, y, probs)
    y_apart, probs_apart = torch.zeros(4, 8), torch.zeros(2 * (4 + 4))
    _call(qkv, torch.tensor([2, 2]), cos, sin, y_apart, probs_apart)
    assert torch.equal(y, y_apart) and torch.equal(probs, probs_apart)


def test_where_the_kernel_runs():
    packing = _packing([2, 2])
    x32 = torch.zeros(4, 8)

    def runs(x, choice="auto", dropout=0.0, heads=2, p=packing):
        return pa.native_applies(x, p, heads=heads, choice=choice, dropout=dropout)

    assert runs(x32) and runs(x32.double())
    assert not runs(x32, choice="blocks")  # asked for the torch path
    assert not runs(x32, dropout=0.1)  # attention dropout: SDPA's
    assert not runs(x32.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not runs(x32)  # the projections are bf16 under autocast
    # the weights it keeps, heads * sum l^2, past one (N, d) activation: 2 * (4 + 4) = 16 <= 32, 5 * 8 = 40 > 32
    assert runs(x32, heads=4) and not runs(x32, heads=5)
    with pytest.raises(ConfigError, match="model.packed_attention"):
        model_config("tiny", packed_attention="fast")


def test_a_stack_over_long_patches_takes_the_torch_path(monkeypatch):
    """One 300-symbol patch among short ones: its weights (H * 300^2) would dwarf the activations, so the
    Transformer runs the torch path for the whole stack, and computes the same function."""
    from hbpe.training.model import layers

    calls = []
    real = layers.patch_attention
    monkeypatch.setattr(layers, "patch_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(3)
    stack = layers.Transformer(layers=2, dim=16, ffn=32, heads=2).double()
    for lengths, native in (([300, 2, 3, 1], False), ([3, 2, 3, 1], True)):
        packing = _packing(lengths)
        x = torch.randn(packing.size, 16, dtype=torch.float64)
        calls.clear()
        y = stack(x, causal=True, packing=packing)
        assert bool(calls) == native, lengths
        forced = layers.Transformer(layers=2, dim=16, ffn=32, heads=2, packed_attention="blocks").double()
        forced.load_state_dict(stack.state_dict())
        torch.testing.assert_close(y, forced(x, causal=True, packing=packing), rtol=1e-12, atol=1e-12)


def test_the_kernel_is_deterministic():
    a, b = _both(torch.float32, True), _both(torch.float32, True)
    for x, y in zip(a[0], b[0], strict=True):
        assert np.array_equal(x.numpy(), y.numpy())


class _Counted:
    """The C module with its forward calls counted."""

    def __init__(self, native) -> None:
        self.native, self.forwards = native, 0

    def forward(self, *args) -> None:
        self.forwards += 1
        self.native.forward(*args)

    def backward(self, *args) -> None:
        self.native.backward(*args)


def test_split_over_threads_gives_the_same_bits(monkeypatch):
    """With several torch threads the patches are cut into runs, one per thread; each patch is still computed
    whole by one call, so outputs and gradients are bit for bit those of one thread."""
    packing = _packing(LENGTHS * 5)
    torch.manual_seed(2)
    qkv, g = torch.randn(packing.size, 3 * 8), torch.randn(packing.size, 8)
    monkeypatch.setattr(pa, "ROWS_PER_THREAD", 16)
    runs = {}
    for threads in (1, 3):
        counted = _Counted(pa._patch_attention)
        monkeypatch.setattr(pa, "_patch_attention", counted)
        monkeypatch.setattr(torch, "get_num_threads", lambda t=threads: t)
        t = qkv.clone().requires_grad_()
        y = pa.patch_attention(t, packing, heads=2, theta=10000.0, causal=True)
        y.backward(g)
        runs[threads] = (y.detach(), t.grad, counted.forwards)
        monkeypatch.setattr(pa, "_patch_attention", counted.native)
    assert runs[1][2] == 1 and runs[3][2] == 3  # one call with one thread, three runs with three
    assert torch.equal(runs[1][0], runs[3][0]) and torch.equal(runs[1][1], runs[3][1])


def _split_call(packing: PatchPacking, qkv: torch.Tensor) -> None:
    pa.patch_attention(qkv, packing, heads=2, theta=10000.0, causal=True)


def test_a_forked_child_splits_over_threads_of_its_own(monkeypatch):
    """The thread pools outlive a call; a child forked after one (a DataLoader worker, a process pool) has the
    pools but not their threads, and must not wait on them."""
    packing = _packing(LENGTHS * 5)
    qkv = torch.randn(packing.size, 3 * 8)
    monkeypatch.setattr(pa, "ROWS_PER_THREAD", 16)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    _split_call(packing, qkv)  # the parent's pool of 2 threads exists now
    child = multiprocessing.get_context("fork").Process(target=_split_call, args=(packing, qkv))
    child.start()
    child.join(timeout=30)
    hung = child.exitcode is None
    if hung:
        child.kill()
        child.join()
    assert not hung and child.exitcode == 0


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.complex64])
def test_other_dtypes_are_refused_not_read_as_floats(dtype):
    packing = _packing([2, 1])
    with pytest.raises(TypeError, match=f"float32 or float64 qkv, not {dtype}"):
        pa.patch_attention(torch.ones(3, 24, dtype=dtype), packing, heads=2, theta=10000.0, causal=True)


def test_a_double_backward_is_refused_not_silently_zero():
    packing = _packing([2, 3])
    qkv = torch.randn(packing.size, 3 * 8, requires_grad=True)
    y = pa.patch_attention(qkv, packing, heads=2, theta=10000.0, causal=True)
    (grad,) = torch.autograd.grad(y.square().sum(), qkv, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad|double backward"):
        grad.sum().backward()
