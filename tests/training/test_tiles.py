"""The loader's tiles (training/model/tiles.py): the packed model's function with static shapes and no host sync.

Held against the references: PatchPacking.from_real (the same rows, exactly), the padded model and the length
blocks (logits of every real position, loss and every gradient in float64 at 1e-9), on every scheme and option
with local models; empty rows change nothing; microbatches laid out apart add up to the batch; the step
dispatches no data-dependent op and compiles without a graph break.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hbpe.pipeline.shards.reader import ShardDir
from hbpe.schemas.symbols import PAD
from hbpe.training.data import tile_layout as tiles_module
from hbpe.training.data.schemes import TiledScheme, tiles_apply
from hbpe.training.data.schemes import build_scheme as _build_scheme
from hbpe.training.data.tile_layout import COL, DEC_TILES, ENC_TILES, PATCH, SEG, SRC, tile_batch, tile_width
from hbpe.training.model.packing import PatchPacking
from hbpe.training.model.patch_io import IGNORE
from hbpe.training.step_probe import DispatchCounts
from tests.training.test_packed_local import CASES, _batch, _cfg, _pair


@pytest.fixture(scope="module")
def shard_rows(sample_shards):
    """Six samples of the bundled sample's shards (test_packed_local's rows) and their tokenizer."""
    d = ShardDir(sample_shards[0])
    rows = [np.asarray(s["tokens"], dtype=np.int32) for _, s in zip(range(6), d.samples())]
    return d.tokenizer, np.stack(rows)


def _tiled(batch: dict[str, torch.Tensor], group: int | None = None) -> dict[str, torch.Tensor]:
    lay = tile_batch(batch["patches"].numpy(), batch["first_target"].numpy(), group=group)
    return {**batch, **{k: torch.from_numpy(v) for k, v in lay.items()}}


def _nll_grads(model, batch):
    logits, targets = model(batch)
    nll = F.cross_entropy(logits.double(), targets, ignore_index=IGNORE, reduction="sum")
    model.zero_grad()
    nll.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), targets, float(nll), grads


def _assert_grads_close(a, b, tol):
    assert a.keys() == b.keys()
    for name, g in a.items():
        scale = g.abs().max().clamp_min(1e-12)
        assert float((g - b[name]).abs().max() / scale) < tol, name


def test_the_layout_holds_exactly_the_rows_of_from_real(shard_rows):
    """Every real (patch, slot) once, each patch on consecutive rows of one tile in slot order, nothing else."""
    tok, rows = shard_rows
    cfg = _cfg("hierarchical-mean-prefix", "packed", "tiles")
    batch = _tiled(_batch(cfg, tok, rows))
    patches = batch["patches"]
    B, T1, S = patches.shape
    for key, side in ((ENC_TILES, patches[:, :-1]), (DEC_TILES, patches[:, 1:])):
        real = side.reshape(-1, S) != PAD
        if key == ENC_TILES:
            real[:, 0] = True  # the encoder keeps each patch's first position
        ref = PatchPacking.from_real(real)
        cols = batch[key].reshape(-1, 4)
        live = cols[:, SEG] >= 0
        got = sorted(zip(cols[live, PATCH].tolist(), cols[live, COL].tolist()))
        assert got == sorted(zip(ref.patch.tolist(), ref.col.tolist()))
        assert torch.equal(cols[live, SRC], cols[live, PATCH] * S + cols[live, COL])
        W = tile_width(S)
        where = torch.nonzero(live).squeeze(1)
        tile = where // W
        for m in cols[live, PATCH].unique()[:200].tolist():
            at = where[cols[live, PATCH] == m]
            assert torch.equal(at - at[0], torch.arange(len(at)))  # consecutive, slot order
            assert len(set((at // W).tolist())) == 1  # never across a tile
        assert cols.shape[0] % W == 0 and tile.max() < cols.shape[0] // W
        assert (cols[~live, SEG] < 0).all() and len(set(cols[~live, SEG].tolist())) == int((~live).sum())


@pytest.mark.parametrize("case", list(CASES))
def test_tiles_equal_the_padded_model_and_the_blocks(shard_rows, case):
    """float64: logits of every real position, the loss and every gradient at 1e-9 against padded and blocks."""
    tok, rows = shard_rows
    padded, tiled = _pair(case, tok, "tiles")
    _, blocks = _pair(case, tok, "blocks")
    batch = _tiled(_batch(padded.cfg, tok, rows))
    S = batch["patches"].shape[-1]
    lp, tp, nll_p, gp = _nll_grads(copy.deepcopy(padded).double(), batch)
    lt, tt, nll_t, gt = _nll_grads(copy.deepcopy(tiled).double(), batch)
    _, _, nll_b, gb = _nll_grads(copy.deepcopy(blocks).double(), {k: batch[k] for k in batch if "tile" not in k})
    cols = batch[DEC_TILES].reshape(-1, 4)
    live = cols[:, SEG] >= 0
    slot = cols[:, PATCH] * S + cols[:, COL]
    torch.testing.assert_close(lt[live], lp[slot[live]], rtol=1e-9, atol=1e-9)
    assert torch.equal(tt[live], tp[slot[live]]) and (tt[~live] == IGNORE).all()
    assert int((tt != IGNORE).sum()) == int((tp != IGNORE).sum())
    assert nll_t == pytest.approx(nll_p, rel=1e-12) and nll_t == pytest.approx(nll_b, rel=1e-12)
    _assert_grads_close(gp, gt, 1e-9)
    _assert_grads_close(gb, gt, 1e-9)


def test_empty_rows_change_no_real_row(shard_rows, monkeypatch):
    """Three times the empty tiles, and empty rows pointed at other symbols and slots: the same logits at every
    real row, the same loss and gradients (float64, 1e-12)."""
    tok, rows = shard_rows
    _, tiled = _pair("hierarchical-eop-add", tok, "tiles")
    tiled = tiled.double()
    base = _batch(tiled.cfg, tok, rows)
    a = _tiled(base)
    monkeypatch.setattr(tiles_module, "tile_bucket", lambda m: 3 * max(4, 2 ** round(np.log2(max(m, 1) / 128))) + 5)
    b = _tiled(base)
    g = torch.Generator().manual_seed(0)
    for key in (ENC_TILES, DEC_TILES):
        cols = b[key].reshape(-1, 4)
        empty = cols[:, SEG] < 0
        n = int(empty.sum())
        M = base["patches"].shape[0] * (base["patches"].shape[1] - 1)
        S = base["patches"].shape[-1]
        cols[empty, PATCH] = torch.randint(0, M, (n,), generator=g)
        cols[empty, COL] = torch.randint(0, S, (n,), generator=g)
        cols[empty, SRC] = cols[empty, PATCH] * S + cols[empty, COL]
    assert b[ENC_TILES].shape[1] > a[ENC_TILES].shape[1]
    la, ta, nll_a, ga = _nll_grads(tiled, a)
    lb, tb, nll_b, gb = _nll_grads(tiled, b)
    ka = a[DEC_TILES].reshape(-1, 4)[:, SEG] >= 0
    kb = b[DEC_TILES].reshape(-1, 4)[:, SEG] >= 0
    torch.testing.assert_close(la[ka], lb[kb], rtol=1e-12, atol=1e-12)
    assert torch.equal(ta[ka], tb[kb]) and (tb[~kb] == IGNORE).all()
    assert nll_b == pytest.approx(nll_a, rel=1e-12)
    _assert_grads_close(ga, gb, 1e-12)


@pytest.mark.parametrize("group", [2, 4])
def test_microbatches_laid_out_apart_add_up_to_the_batch(shard_rows, group):
    """group=2 or 4 over 6 samples (4: a last group of 2, as Composer splits 6 by 4): each microbatch (the samples
    Composer's split hands the model) gives its part, and the parts' NLL and gradients add up to the whole
    batch's; the whole batch read at once gives it too."""
    tok, rows = shard_rows
    _, tiled = _pair("hierarchical-mean-prefix", tok, "tiles")
    tiled = tiled.double()
    base = _batch(tiled.cfg, tok, rows)
    whole = _tiled(base)
    grouped = _tiled(base, group=group)
    _, _, nll, grads = _nll_grads(tiled, whole)
    _, _, nll_all_groups, grads_all = _nll_grads(tiled, grouped)
    parts, part_grads = 0.0, None
    for i in range(0, 6, group):
        micro = {k: v[i : i + group] for k, v in grouped.items()}
        _, _, n, g = _nll_grads(tiled, micro)
        parts += n
        part_grads = g if part_grads is None else {k: part_grads[k] + g[k] for k in g}
    assert parts == pytest.approx(nll, rel=1e-12) and nll_all_groups == pytest.approx(nll, rel=1e-12)
    _assert_grads_close(grads, part_grads, 1e-9)
    _assert_grads_close(grads, grads_all, 1e-9)


def test_the_tiled_step_dispatches_no_data_dependent_op(shard_rows):
    tok, rows = shard_rows
    _, tiled = _pair("hierarchical-mean-prefix", tok, "tiles")
    batch = _tiled(_batch(tiled.cfg, tok, rows))
    with DispatchCounts() as counts:
        logits, targets = tiled(batch)
        F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum").backward()
    assert counts.data_dependent == {}
    _, blocks = _pair("hierarchical-mean-prefix", tok, "blocks")
    with DispatchCounts() as counts:
        blocks(batch)
    assert counts.data_dependent  # the reference does dispatch them: the count can see one


def test_the_tiled_forward_compiles_without_a_graph_break_and_equals_eager(shard_rows):
    tok, rows = shard_rows
    _, tiled = _pair("hierarchical-eop-add", tok, "tiles")
    batch = _tiled(_batch(tiled.cfg, tok, rows))

    def loss(b):
        logits, targets = tiled(b)
        return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE, reduction="sum")

    torch._dynamo.reset()
    explained = torch._dynamo.explain(loss)(batch)
    assert explained.graph_break_count == 0, explained.break_reasons
    eager = float(loss(batch))
    compiled = float(torch.compile(loss, backend="aot_eager", fullgraph=True)(batch))
    assert compiled == pytest.approx(eager, rel=1e-5)
    torch._dynamo.reset()


def test_the_loader_lays_out_tiles_where_they_apply(shard_rows):
    tok, rows = shard_rows
    cfg = _cfg("hierarchical-mean-prefix", "packed", "auto")
    assert tiles_apply(cfg, device="gpu") and not tiles_apply(cfg, device="cpu")
    assert tiles_apply(_cfg("hierarchical-mean-prefix", "packed", "tiles"), device="cpu")
    assert not tiles_apply(_cfg("hierarchical-mean-prefix", "padded"), device="gpu")
    assert not tiles_apply(cfg, device="gpu", symbols_per_patch=1025)
    from hbpe.training.data.schemes import build_scheme

    out = TiledScheme(build_scheme(cfg, tok, derive=True)).batch(rows, None)
    assert out[ENC_TILES].shape[0] == len(rows) and out[ENC_TILES].dtype == np.int64


def _train_losses(sample_shards, folder, *overrides):
    from composer.loggers import InMemoryLogger

    from hbpe.training.train.trainer import build_run
    from tests.helpers import train_cfg

    mem = InMemoryLogger()
    cfg = train_cfg(sample_shards, folder, "max_duration=6ba", "save_interval=6ba", "global_batch_size=4", *overrides)
    run = build_run(cfg, eval_enabled=False, loggers=[mem])
    run.trainer.fit()
    compiled = sum(getattr(m, "_compiled_call_impl", None) is not None for m in run.trainer.state.model.modules())
    run.close()
    return [float(v) for _, v in mem.data["loss/train/total"]], compiled


def test_composer_trains_on_the_tiles_compiled_as_on_the_cpu_kernel(sample_shards, tmp_path, monkeypatch):
    """Real Composer training, 6 batches: the loader's tiles with every block compiled (aot_eager: the graphs
    dynamo captures, without a C++ build) follow the native CPU kernel's losses within fp32 rounding, with two
    microbatches per batch (each laid out apart), and the loop reads its FLOPs and bytes from the loader."""
    monkeypatch.setenv("HBPE_COMPILE_BACKEND", "aot_eager")
    native, none = _train_losses(sample_shards, tmp_path / "native", "model.packed_attention=auto")
    torch._dynamo.reset()
    tiled, compiled = _train_losses(
        sample_shards, tmp_path / "tiled", "model.packed_attention=tiles", "compile=true", "device_microbatch_size=2"
    )
    torch._dynamo.reset()
    assert len(native) == len(tiled) == 6
    assert none == 0 and compiled == 4  # tiny: 2 latent blocks, 1 encoder and 1 decoder block, each compiled
    for a, b in zip(native, tiled, strict=True):
        assert b == pytest.approx(a, rel=2e-4), (native, tiled)
    assert native[-1] < native[0]  # it trained: the comparison is not of two constants


def test_every_compiled_block_runs_without_a_graph_break(shard_rows):
    """What `compile: true` compiles (each Block on its own, one code cache for the encoder's, decoder's and
    latent's): no graph break in any of them, over two batches of different tile counts, forward and backward."""
    from torch._dynamo.utils import counters

    from hbpe.training.train.compile_blocks import compile_blocks

    tok, rows = shard_rows
    _, tiled = _pair("hierarchical-eop-add", tok, "tiles")
    torch._dynamo.reset()
    counters.clear()
    assert compile_blocks(tiled, backend="eager") == 9  # 3 latent, 3 encoder, 3 decoder blocks
    for batch in (_tiled(_batch(tiled.cfg, tok, rows)), _tiled(_batch(tiled.cfg, tok, rows[:3]))):
        logits, targets = tiled(batch)
        F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum").backward()
    breaks = dict(counters["graph_break"])
    torch._dynamo.reset()
    assert breaks == {}


def test_more_tiles_than_one_sdpa_call_holds_are_split_into_calls(shard_rows, monkeypatch):
    """CUDA's grid holds 65,535 tiles per SDPA call: past that the tiles go in several calls, the same values."""
    from hbpe.training.model import layers

    tok, rows = shard_rows
    _, tiled = _pair("hierarchical-eop-add", tok, "tiles")
    tiled = tiled.double()
    batch = _tiled(_batch(tiled.cfg, tok, rows))
    one, t1, nll1, g1 = _nll_grads(tiled, batch)
    calls = []
    real_sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(layers, "SDPA_BATCH_LIMIT", 7)
    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real_sdpa(*a, **k))
    many, t2, nll2, g2 = _nll_grads(tiled, batch)
    monkeypatch.undo()
    tiles = batch[ENC_TILES].reshape(-1, 4).shape[0] // tile_width(batch["patches"].shape[-1])
    assert len(calls) > 2 * -(-tiles // 7) - 1  # several calls per layer, not one
    torch.testing.assert_close(many, one, rtol=1e-12, atol=1e-12)
    assert torch.equal(t1, t2) and nll2 == pytest.approx(nll1, rel=1e-12)
    _assert_grads_close(g1, g2, 1e-12)


def test_the_collator_reads_stored_patches_under_every_wrapper(sample_shards):
    """Stored `patches` (a --store-patches conversion, or the tokenizer's own shards) are read and checked, not
    derived again, whatever wraps the scheme: the tiles (a GPU's loader) and the host counts (the trainer's)."""
    from hbpe.training.data.loader import Collator, PatchSource, innermost
    from hbpe.training.data.schemes import TokenScheme
    from hbpe.training.train.host_counts import HostCounts

    d = ShardDir(sample_shards[0])
    tok = d.tokenizer
    inner = TokenScheme(tok, derive=False)
    wrapped = HostCounts(TiledScheme(inner), _cfg("hierarchical-mean-prefix", "packed", "tiles"), tok.vocab_size)
    assert innermost(wrapped) is inner
    samples = [dict(s) for _, s in zip(range(2), d.samples())]
    for s in samples:  # stored patches that the tokenizer would not give: read, so they show in the batch
        s["patches"] = np.zeros((len(s["tokens"]), tok.max_patch_size), dtype=np.int64) + 5
    batch = Collator(tok, PatchSource(derive=False), scheme=wrapped)(samples)
    assert (batch["patches"] == 5).all()


def test_the_loops_flops_count_every_row_the_tiles_run(shard_rows):
    """Executed FLOPs (MFU, pad_share) on tiles count every row and W x W pairs per tile, as they run; what is not
    a real symbol's work is PAD, so the useful part equals the packed count's."""
    from hbpe.training.model.flops import batch_train_flops
    from hbpe.training.train.host_counts import HOST_FLOPS, HostCounts

    tok, rows = shard_rows
    cfg = _cfg("hierarchical-mean-prefix", "packed", "tiles")
    scheme = _build_scheme(cfg, tok, derive=True)
    tiled = HostCounts(TiledScheme(scheme), cfg, tok.vocab_size).batch(rows, None)
    packed = batch_train_flops(cfg, torch.from_numpy(scheme.batch(rows, None)["patches"]), vocab_size=tok.vocab_size)
    run = {part: tiled[key] for part, key in HOST_FLOPS.items()}
    assert run["executed"] > packed["executed"] and run["pad"] > 0.05 * run["executed"]
    assert run["executed"] - run["pad"] == pytest.approx(packed["executed"] - packed["pad"], rel=1e-12)
    assert run["paper"] == packed["paper"]
