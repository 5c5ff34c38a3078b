"""What one training step dispatches, measured on CPU along the path CUDA takes: `hbpe bench step`.

A GPU step is bound by overhead when it launches many small kernels, or when the host waits for the device
(a data-dependent op: its output size or a Python value depends on tensor contents). On CPU neither costs much,
so the numbers here are counts, not times, and they carry over to CUDA:

- `aten_ops`: aten operators dispatched by one forward + loss + backward in eager mode (views counted apart:
  they launch no kernel), and the casts and matmuls among them;
- `host_syncs`: data-dependent ops dispatched per step: Python reads of a tensor's value (`item`, `tolist`,
  `bool`, `int`, `float`, `numpy`) and ops whose output size depends on the data (`nonzero`, boolean indexing,
  `masked_select`, `unique`, `bincount`, `repeat_interleave` without `output_size`). On CUDA each one waits for
  the queue to drain. Counted for the model's step, and apart for what Composer's loop adds per batch (the
  training metrics' update and the FLOP count);
- `graph_breaks`: dynamo's breaks over the model's forward and loss (`torch._dynamo.explain`; the backward is
  traced by AOT autograd from the same graphs);
- `recompiles`: graphs compiled after the first batch, over `batches` batches of the real shards (each a new
  patch-length mix), with a counting backend around the chosen one;
- `loss_eager`, `loss_compiled`: the loss of the first batch both ways, in fp32.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Python reads of a tensor's value: each one is a device-to-host copy the host waits for
SYNC_METHODS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy"})
# ops whose output shape depends on tensor contents (the host must learn a size before it can go on)
DATA_DEPENDENT_OPS = frozenset(
    {"nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive", "bincount", "argwhere"}
)


class DispatchCounts(TorchDispatchMode):
    """Counts of the aten ops dispatched inside it: all, views, casts, matmuls, and data-dependent ones."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.views = self.casts = self.matmuls = 0
        self.data_dependent: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if func.is_view:
            self.views += 1
        else:
            self.ops += 1
        if name in ("_to_copy", "to") and kwargs.get("dtype") is not None:
            self.casts += 1
        if name in ("mm", "bmm", "addmm", "matmul", "linear", "_scaled_dot_product_flash_attention_for_cpu",
                    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention"):  # fmt: skip
            self.matmuls += 1
        if name in DATA_DEPENDENT_OPS or _bool_index(name, args) or _unsized_repeat(name, kwargs):
            self.data_dependent[name] = self.data_dependent.get(name, 0) + 1
        return func(*args, **kwargs)


def _bool_index(name: str, args: tuple) -> bool:
    """aten.index / index_put with a boolean mask: a nonzero under the hood."""
    if name not in ("index", "index_put", "index_put_", "_index_put_impl_") or len(args) < 2:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] or ())


def _unsized_repeat(name: str, kwargs: dict) -> bool:
    return name == "repeat_interleave" and kwargs.get("output_size") is None


class SyncCalls(TorchFunctionMode):
    """Counts of Python reads of tensor values (SYNC_METHODS) made inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in SYNC_METHODS:
            self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def count_step(model: Any, batch: dict[str, torch.Tensor], *, autocast: str = "fp32") -> dict[str, Any]:
    """Counts of one eager forward + loss + backward of a ComposerModel on `batch`, and of Composer's per-batch
    extras (the training metrics' update and the FLOP count). `autocast="bf16"`: the forward under CPU bf16
    autocast, as CUDA's amp_bf16 runs it (its casts are what a GPU step pays)."""
    dispatch, calls = DispatchCounts(), SyncCalls()
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast == "bf16")
    with calls, dispatch:
        with amp:
            outputs = model(batch)
        loss = model.loss(outputs, batch)
        loss.backward()
    model.zero_grad(set_to_none=True)
    extra_dispatch, extra_calls = DispatchCounts(), SyncCalls()
    with torch.no_grad():
        outputs = model(batch)
        if hasattr(model, "_flops_of"):
            del model._flops_of  # counted afresh, as for a new batch
        with extra_calls, extra_dispatch:
            for metric in model.get_metrics(is_train=True).values():
                model.update_metric(batch, outputs, metric)
                metric.compute()  # Composer computes (and logs) the train metrics after every batch
            model.flops_per_batch(batch)
    return {
        "aten_ops": dispatch.ops,
        "views": dispatch.views,
        "casts": dispatch.casts,
        "matmuls": dispatch.matmuls,
        "host_syncs": sum(calls.calls.values()) + sum(dispatch.data_dependent.values()),
        "host_sync_kinds": {**calls.calls, **dispatch.data_dependent},
        "loop_host_syncs": sum(extra_calls.calls.values()) + sum(extra_dispatch.data_dependent.values()),
        "loop_host_sync_kinds": {**extra_calls.calls, **extra_dispatch.data_dependent},
    }


def tensors(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The batch's tensors: what a compiled region takes. The loader's host counts (plain floats: training/data/
    schemes.py HostCounts) stay outside it, as the trainer keeps them (it compiles the blocks, which never see
    them); inside, dynamo would guard on each float's value and recompile for every batch."""
    return {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}


def graph_breaks(model: Any, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """dynamo's graph breaks over the model's forward and loss: {graph_breaks, graphs, reasons (first 10)}."""
    import torch._dynamo

    torch._dynamo.reset()

    def forward_loss(b: dict[str, torch.Tensor]) -> torch.Tensor:
        return model.loss(model(b), b)

    explained = torch._dynamo.explain(forward_loss)(tensors(batch))
    reasons = [str(getattr(r, "reason", r)).splitlines()[0] for r in explained.break_reasons]
    torch._dynamo.reset()
    return {"graph_breaks": explained.graph_break_count, "graphs": explained.graph_count, "break_reasons": reasons[:10]}


def compiled_losses(model: Any, batches: list[dict[str, torch.Tensor]], *, backend: str) -> dict[str, Any]:
    """Compile forward + loss with `backend` (counted), run every batch: {recompiles, graphs_first_batch,
    loss_eager, loss_compiled (first batch), compile_seconds (first batch)}."""
    import torch._dynamo

    torch._dynamo.reset()
    compiled: list[int] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        compiled.append(1)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    def forward_loss(b: dict[str, torch.Tensor]) -> torch.Tensor:
        return model.loss(model(b), b)

    step = torch.compile(forward_loss, backend=counting, dynamic=None)
    batches = [tensors(b) for b in batches]
    with torch.no_grad():
        eager = float(forward_loss(batches[0]))
        t = time.perf_counter()
        first = float(step(batches[0]))
        seconds = time.perf_counter() - t
        graphs_first = len(compiled)
        for b in batches[1:]:
            step(b)
    torch._dynamo.reset()
    return {"graphs_first_batch": graphs_first, "recompiles": len(compiled) - graphs_first,
            "loss_eager": eager, "loss_compiled": first, "compile_seconds": seconds,
            "loss_rel_diff": abs(first - eager) / max(abs(eager), 1e-30)}  # fmt: skip


def probe_step(cfg: Any, *, batches: int = 8, backend: str = "aot_eager", autocast: str = "fp32") -> dict[str, Any]:
    """`hbpe bench step`: the counts above for the model of train config `cfg` on its training shards (fp32, CPU)."""
    import tempfile
    from dataclasses import replace

    from hbpe.training.train.trainer import build_run

    with tempfile.TemporaryDirectory(prefix="hbpe-step-") as tmp:
        cfg = replace(
            cfg, save_folder=tmp, log_file=None, autoresume=False, load_path=None, max_duration=f"{batches}ba"
        )
        if cfg.model.packed_attention == "auto":  # the path `auto` takes on a GPU: the loader's tiles, where they apply
            cfg = replace(cfg, model=replace(cfg.model, packed_attention="tiles"))
        run = build_run(cfg, eval_enabled=False, save_enabled=False)
        try:
            model = run.trainer.state.model
            loader = iter(run.trainer.state.train_dataloader)
            data = [next(loader) for _ in range(batches)]
            counts = count_step(model, data[0], autocast=autocast)
            breaks = _or_failure(graph_breaks, model, data[0], keys=("graph_breaks", "graphs", "break_reasons"))
            compiled = _or_failure(compiled_losses, model, data, backend=backend, keys=COMPILED_KEYS)
        finally:
            run.close()
    return {
        "model_size": cfg.model_size,
        "io": cfg.model.io,
        "local_layout": run.info["model"].get("local_layout"),
        "packed_attention": run.info["model"].get("packed_attention"),
        "params": sum(p.numel() for p in model.parameters()),
        "batch": [int(v) for v in data[0]["tokens"].shape],
        "batches": batches,
        "autocast": autocast,  # of the counts; graph breaks, recompiles and the losses are fp32
        **counts,
        **breaks,
        "backend": backend,
        **compiled,
        "torch": torch.__version__,
    }


COMPILED_KEYS = ("graphs_first_batch", "recompiles", "loss_eager", "loss_compiled", "compile_seconds", "loss_rel_diff")


def _or_failure(measure: Any, *args: Any, keys: tuple[str, ...], **kwargs: Any) -> dict[str, Any]:
    """`measure(*args, **kwargs)`, or its keys as None and the reason when dynamo cannot trace the step at all (a
    finding to report, not a crash: e.g. a data-dependent branch it cannot guard on)."""
    import torch._dynamo

    try:
        return measure(*args, **kwargs)
    except Exception as e:  # dynamo's errors have no common public base class
        torch._dynamo.reset()
        first = " ".join(str(e).split())[:300]
        return {**dict.fromkeys(keys), f"{measure.__name__}_failed": f"{type(e).__name__}: {first}"}
