"""`hbpe eval`: BPB, loss per symbol, bytes and symbols per patch of a checkpoint on shards."""

from __future__ import annotations

import functools
import math
import tempfile
import time

import torch

from hbpe.pipeline.progress_line import ProgressLine, rate
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.training.checkpoint.load import load_model, scheme_for
from hbpe.training.data.loader import build_dataloader, check_compatible, read_manifest, stop_downloads
from hbpe.training.data.schemes import TiledScheme, symbols_per_patch, tiles_apply
from hbpe.training.data.shared_memory import release as release_shared_memory
from hbpe.training.model.patch_io import IGNORE, cross_entropy_sum
from hbpe.training.schemes.registry import scheme_spec


def check_finite_bpb(
    bpb: float,
    what: str,
    *,
    fix: str = "evaluate an earlier checkpoint, or train again (a lower optim.lr, more warmup)",
) -> None:
    """A NaN or infinite BPB is an error, never a result (damaged weights gave `BPB nan` with rc 0)."""
    if not math.isfinite(bpb):
        raise ArtifactError(
            f"{what}: bits per byte is {bpb}: the model's outputs are not finite, so its weights are damaged or "
            f"its training diverged; {fix}"
        )


# streaming pads its sample index to whole batches (8 bytes a slot per worker: batch_size=2**31 ran for minutes
# and 2**70 ended in its sampler's ValueError), and a batch is held in memory whole: 65536 samples is far past
# what any device evaluates at once
MAX_EVAL_BATCH_SIZE = 1 << 16


def check_eval_args(*, batch_size: int, max_batches: int | None) -> None:
    """batch_size and max_batches, checked before a model is loaded; one ConfigError each (max_batches=0 evaluated
    nothing and said "bits per byte is undefined")."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(
            f"batch_size={batch_size!r} ({type(batch_size).__name__}): must be an integer >= 1; e.g. batch_size=8 "
            "(--batch-size 8)"
        )
    if batch_size > MAX_EVAL_BATCH_SIZE:
        raise ConfigError(
            f"batch_size={batch_size}: at most {MAX_EVAL_BATCH_SIZE} samples per batch (a batch is held in memory "
            "whole, and the loader indexes every slot of it); e.g. batch_size=8 (--batch-size 8)"
        )
    if max_batches is not None and (
        isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1
    ):
        raise ConfigError(
            f"max_batches={max_batches!r} ({type(max_batches).__name__}): must be an integer >= 1, or None for every "
            "batch; e.g. max_batches=10 (--max-batches 10)"
        )


def _running(sums: torch.Tensor, t0: float) -> dict[str, str]:
    """The progress line's numbers: BPB of the batches so far and text KB/s."""
    nll, _, nbytes, _ = sums.tolist()
    return {"BPB": f"{nll / math.log(2) / max(nbytes, 1):.4f}", "": rate(nbytes, time.monotonic() - t0)}


@torch.inference_mode()
def evaluate(
    checkpoint: str,
    data: str,
    *,
    batch_size: int = 8,
    max_batches: int | None = None,
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> dict:
    """Every sample of `data` (or the first `max_batches` batches), in order, on `device` (see devices.py).

    `progress`: a progress line on stderr (batches done of the total, BPB so far, KB/s, time left), live on a
    terminal, else a line every HBPE_PROGRESS_INTERVAL seconds.
    """
    check_eval_args(batch_size=batch_size, max_batches=max_batches)
    model, tok, meta = load_model(checkpoint, device=device)
    device = next(model.parameters()).device
    manifest = read_manifest(data)
    # the model's own scheme (bytes, space, entropy patches, ... from the same `tokens` column)
    scheme = scheme_for(model.cfg, tok, derive=check_compatible(manifest, tok, where=data).derive)
    if tiles_apply(model.cfg, device=device.type, symbols_per_patch=symbols_per_patch(model.cfg, tok)):
        scheme = TiledScheme(scheme)  # on a GPU the loader lays out the packing: no host sync per batch
    with tempfile.TemporaryDirectory(prefix="hbpe-eval-") as cache:
        dl = build_dataloader(
            data,
            tok,
            batch_size=batch_size,
            cache_dir=cache,
            shuffle=False,
            shuffle_seed=0,
            drop_last=False,
            manifest=manifest,
            scheme=scheme,
        )
        total = len(dl) if max_batches is None else min(len(dl), max_batches)
        # sums stay on the device (fp64 NLL): no host sync per batch on a GPU (the line reads them when it draws)
        sums = torch.zeros(4, dtype=torch.float64, device=device)  # nll, symbols, bytes, text patches
        line = ProgressLine("eval", total) if progress else None
        numbers = functools.partial(_running, sums, time.monotonic())  # `sums +=` adds in place: the same tensor
        for i, batch in enumerate(dl):
            if max_batches is not None and i >= max_batches:
                break
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            logits, targets = model(batch)
            sums += torch.stack(
                [
                    cross_entropy_sum(logits, targets).double(),
                    (targets != IGNORE).sum().double(),
                    batch["target_bytes"].sum().double(),
                    batch["text_positions"].sum().double(),
                ]
            )
            if line is not None:
                line.update(1, numbers)
        if line is not None:
            line.close(numbers)
        stop_downloads(dl)  # before the cache is deleted
        release_shared_memory(dl.dataset)  # streaming would keep it until the process exits
        del dl
    nll, counts = float(sums[0]), [int(v) for v in sums[1:].tolist()]
    symbols, nbytes, text_patches = counts
    if nbytes == 0:
        # BPB divides by the bytes of text covered: over none it is undefined, not 0 or NLL/1
        raise ArtifactError(
            f"{data}: the evaluated samples cover 0 bytes of text ({symbols} symbols, "
            f"{'max_batches=' + str(max_batches) if max_batches is not None else 'all batches'}), so bits per byte "
            "is undefined; evaluate on shards of documents with text (`hbpe shards stats` shows their bytes)"
            + (" or raise --max-batches" if max_batches is not None else "")
        )
    bpb = nll / math.log(2) / nbytes
    check_finite_bpb(bpb, f"{checkpoint} on {data}")
    return {
        "bpb": bpb,
        "loss_per_symbol": nll / max(symbols, 1),
        "bytes_per_patch": nbytes / max(text_patches, 1),
        "symbols_per_patch": symbols / max(text_patches, 1),  # predicted symbols (EOD patches included)
        "bytes": nbytes,
        "symbols": symbols,
        "max_patch_size": tok.max_patch_size if scheme_spec(model.cfg).tokenizer_patches else None,
        "io": meta["model"]["io"],
        "device": str(device),
    }
