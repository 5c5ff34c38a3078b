"""`hbpe bench step` (training/step_probe.py): its counters see what they claim to, and it runs on real shards."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.training.step_probe import DispatchCounts, SyncCalls, count_step


class Syncing(torch.nn.Module):
    """A step with a known number of host syncs: two value reads, a nonzero, a boolean index, a bincount."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, batch):
        x = batch["x"] * self.w  # (4,)
        n = int(x.sum())  # a read: __int__
        keep = x[x > 0]  # a boolean index
        idx = (x > 1).nonzero()
        counts = torch.bincount(batch["ids"]).tolist()  # a data-sized op and a read
        return {"out": keep.sum() + idx.numel() + n + len(counts)}

    def loss(self, outputs, batch):
        return outputs["out"]

    def get_metrics(self, is_train=False):
        return {}

    def flops_per_batch(self, batch):
        return float(batch["x"].sum())  # Composer's loop: one read


def test_counters_see_each_kind_of_host_sync_once():
    batch = {"x": torch.tensor([1.0, 2.0, 0.0, 3.0]), "ids": torch.tensor([0, 2, 2])}
    r = count_step(Syncing(), batch)
    # the boolean index's backward scatters through the same mask: index_put with a bool index, a sync of its own
    assert r["host_sync_kinds"] == {"__int__": 1, "tolist": 1, "index": 1, "nonzero": 1, "bincount": 1, "index_put": 1}
    assert r["host_syncs"] == 6
    assert r["loop_host_sync_kinds"] == {"__float__": 1} and r["loop_host_syncs"] == 1


def test_dispatch_counts_ops_views_casts_and_matmuls():
    a = torch.randn(3, 4)
    with DispatchCounts() as d, SyncCalls() as s:
        b = a.t()  # a view
        c = (b.to(torch.float64) @ torch.randn(3, 2, dtype=torch.float64)).sum()  # a cast, a matmul, a sum, randn
    assert (d.views, d.casts, d.matmuls) == (1, 1, 1)
    assert d.ops == 4 and not d.data_dependent and s.calls == {}
    assert float(c) == float(c)  # outside the modes: not counted


def test_bench_step_on_real_shards(sample_shards):
    train, _ = sample_shards
    base = ["bench", "step", "tiny", f"data.train={train}", "data.eval=null", "--batches", "3", "--json"]
    res = CliRunner().invoke(main, [*base, "model.io=bpe"])
    assert res.exit_code == 0, res.output
    bpe = json.loads(res.stdout)
    # BPE's step is one graph with nothing data-dependent: the CUDA target for every scheme
    assert bpe["host_syncs"] == 0 and bpe["graph_breaks"] == 0 and bpe["recompiles"] == 0
    assert abs(bpe["loss_compiled"] - bpe["loss_eager"]) <= 1e-5 * abs(bpe["loss_eager"])
    assert bpe["aten_ops"] > 50 and bpe["matmuls"] >= 2 * 2  # forward and backward of each latent layer at least
    res = CliRunner().invoke(main, [*base, "model.packed_attention=blocks"])
    assert res.exit_code == 0, res.output
    patch = json.loads(res.stdout)
    assert patch["io"] == "hierarchical" and patch["aten_ops"] > bpe["aten_ops"]
    # the length blocks decide their layout on the device, in the step: the probe reports it rather than failing
    assert patch["host_syncs"] > 0 and "nonzero" in patch["host_sync_kinds"]
    assert patch["graph_breaks"] is not None or "graph_breaks_failed" in patch
    res = CliRunner().invoke(main, base)  # auto: what a GPU runs, the loader's tiles
    assert res.exit_code == 0, res.output
    tiles = json.loads(res.stdout)
    assert tiles["packed_attention"] == "tiles" and tiles["host_syncs"] == 0 and tiles["loop_host_syncs"] == 0
    assert tiles["graph_breaks"] == 0 and tiles["graphs"] == 1 and tiles["recompiles"] <= 1
    assert abs(tiles["loss_compiled"] - tiles["loss_eager"]) <= 1e-5 * abs(tiles["loss_eager"])
    assert tiles["aten_ops"] < patch["aten_ops"]  # one attention call per layer, no permutations
