"""Training steps of a built model in plain PyTorch: for GPU machines that have torch but not the pinned stack.

`hbpe bench train` times the real Composer trainer. A lent GPU image may hold another torch and no
Composer (which pins torch < 2.7.1), so this module times and trains the same model, loss and FLOP
count with nothing but torch: AdamW, warm-up then cosine, bf16 autocast on CUDA, from token batches
saved by `save_token_batches` (the TokenScheme's columns: `patches` derived on the machine from a
[n_vocab + 2, S] table, so a 2M-token corpus travels as ~10 MB).

Numbers: text bytes/s, executed and paper-count FLOPs (training/model/flops.py), MFU against the
peak the caller names, peak memory (CUDA allocator); BPB on held-out batches (nats / ln 2 / bytes).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hbpe.schemas.symbols import TOKEN_EOD
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.data.schemes import tiles_apply
from hbpe.training.data.tile_layout import tile_batch
from hbpe.training.model.build import build_model
from hbpe.training.model.flops import batch_train_flops
from hbpe.training.model.patch_io import IGNORE, cross_entropy_sum
from hbpe.training.model.patch_lm import PatchLM, VocabSpec
from hbpe.training.schemes.registry import scheme_spec
from hbpe.training.train.compile_blocks import compile_blocks


def save_token_batches(tok: Any, token_rows: dict[str, np.ndarray], out: Path) -> None:
    """Token rows per split (name -> (n, seq_len) int32, EOD/PAD negative) and the tables that turn them
    into the TokenScheme's columns, as one .npz (e.g. {"train": rows, "eval": held_out}).
    """
    n = tok.encoding.max_token_value + 1
    ids = np.concatenate([np.arange(n), [-1, -2]]).astype(np.int64)  # every token, then EOD and PAD
    np.savez_compressed(
        out,
        patch_table=tok.patches(ids).astype(np.int16),  # (n + 2, S)
        nbytes_table=np.asarray(tok.token_nbytes, dtype=np.int64)[: n + 2],
        vocab=np.array([tok.vocab_size, tok.max_patch_size, n]),
        **{f"rows_{k}": v.astype(np.int32) for k, v in token_rows.items()},
    )


def token_rows(tok: Any, texts: list[str], seq_len: int) -> np.ndarray:
    """The documents' tokens, each followed by EOD, as one stream cut into (n, seq_len + 1) int32 rows (the last
    column is the shifted target); the tail that fills no row is dropped."""
    stream = np.concatenate([np.append(tok.encode(t), TOKEN_EOD) for t in texts]).astype(np.int32)
    n = len(stream) // (seq_len + 1)
    return stream[: n * (seq_len + 1)].reshape(n, seq_len + 1)


class TokenBatches:
    """The .npz of `save_token_batches`: batches of the TokenScheme's columns on a device."""

    def __init__(self, path: Path, device: torch.device) -> None:
        z = np.load(path)
        self.device = device
        self.patch_table = torch.from_numpy(z["patch_table"].astype(np.int64)).to(device)  # (n + 2, S)
        self.nbytes_table = torch.from_numpy(z["nbytes_table"]).to(device)  # (n + 2,)
        vocab_size, max_patch_size, n = (int(v) for v in z["vocab"])
        self.spec = VocabSpec(vocab_size, max_patch_size, n)
        self.rows = {
            k[5:]: torch.from_numpy(z[k].astype(np.int64)).to(device) for k in z.files if k.startswith("rows_")
        }

    def batch(self, split: str, index: torch.Tensor, *, tiles: bool = False) -> dict[str, torch.Tensor]:
        """Rows `index` of `split` -> the TokenScheme's columns (training/data/schemes.py); `tiles`: with the
        loader's packing (training/data/tile_layout.py), laid out on the host from a CPU copy as a loader's worker
        would (before the step is timed)."""
        tokens = self.rows[split].index_select(0, index)  # (B, N)
        ids = torch.where(tokens < 0, self.spec.n_vocab - 1 - tokens, tokens)  # EOD -> n, PAD -> n + 1
        B = tokens.shape[0]
        batch = {
            "tokens": tokens,
            "patches": self.patch_table[ids],  # (B, N, S)
            "target_bytes": self.nbytes_table[ids[:, 1:]].sum(1),
            "first_target": torch.ones(B, dtype=torch.long, device=self.device),
            "text_positions": (tokens[:, 1:] >= 0).sum(1),
        }
        if tiles:
            lay = tile_batch(batch["patches"].cpu().numpy(), batch["first_target"].cpu().numpy())
            batch.update({k: torch.from_numpy(v).to(self.device) for k, v in lay.items()})
        return batch

    def spread(self, split: str, count: int) -> torch.Tensor:
        """`count` row indices spread evenly over the whole split (an eval set that is not its first rows)."""
        n = self.rows[split].shape[0]
        return torch.linspace(0, n - 1, min(count, n), device=self.device).round().long()


def train_steps(
    cfg: ModelConfig,
    data: TokenBatches,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    warmup: int = 20,
    seed: int = 0,
    eval_rows: int = 0,
    peak_flops: float | None = None,
    timed_from: int = 3,
    compile: bool = False,
    compile_backend: str = "inductor",
    probe: bool = False,
) -> dict[str, Any]:
    """Train a fresh model for `steps` steps on `data`'s train split; time the steps after `timed_from`.

    `compile`: every transformer block and the loss compiled (training/train/compile_blocks.py, as `compile: true`).
    Batches carry the loader's tiles where `cfg` takes them on this device (training/data/schemes.py)."""
    torch.manual_seed(seed)
    dev = data.device
    model = build_model(cfg, data.spec).to(dev)
    tiles = tiles_apply(cfg, device="gpu" if dev.type == "cuda" else "cpu", symbols_per_patch=data.spec.max_patch_size)
    if compile:
        compile_blocks(model, backend=compile_backend)
    nll_sum = torch.compile(cross_entropy_sum, backend=compile_backend) if compile else cross_entropy_sum
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=dev.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _warmup_cosine(s, warmup, steps))
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = data.rows["train"].shape[0]
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    flops = {"executed": 0.0, "pad": 0.0, "paper": 0.0}
    nbytes, seconds, loss = 0, 0.0, float("nan")
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def step_once(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with amp:
            logits, targets = model(batch)
        nll = nll_sum(logits, targets)
        out = nll / (targets != IGNORE).sum().clamp_min(1)
        out.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        return out.detach()

    for step in range(steps):
        batch = data.batch("train", torch.randint(0, n, (batch_size,), generator=g).to(dev), tiles=tiles)
        t = time.perf_counter()
        out = step_once(batch)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if step >= timed_from:
            seconds += time.perf_counter() - t
            nbytes += int(batch["target_bytes"].sum())
            x = scheme_spec(cfg).latent_input(batch)
            for k, v in batch_train_flops(cfg, x, vocab_size=model.io.vocab_size).items():
                flops[k] += v
        loss = float(out)
    probes = {}
    if probe:
        batch = data.batch("train", torch.randint(0, n, (batch_size,), generator=g).to(dev), tiles=tiles)
        probes = probe_step(step_once, batch)
    result = {
        "io": cfg.io,
        "local_layout": cfg.local_layout,
        "packed_attention": ("tiles" if tiles else cfg.packed_attention) if cfg.local_layout == "packed" else None,
        "compiled": compile,
        "params": sum(p.numel() for p in model.parameters()),
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "train_loss": loss,
        "bytes_per_sec": nbytes / max(seconds, 1e-9),
        "executed_flops_per_sec": flops["executed"] / max(seconds, 1e-9),
        "executed_flops_per_byte": flops["executed"] / max(nbytes, 1),
        "paper_flops_per_byte": flops["paper"] / max(nbytes, 1),
        "pad_share": flops["pad"] / max(flops["executed"], 1.0),
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if dev.type == "cuda" else None,
        **probes,
    }
    if peak_flops:
        result["mfu"] = result["executed_flops_per_sec"] / peak_flops
    if eval_rows:
        result["bpb"] = eval_bpb(model, data, eval_rows, batch_size=batch_size)
    return result


def probe_step(step_once: Any, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """One more step, profiled: kernels (or CPU aten ops) launched; and one under CUDA's sync debug mode "error",
    which raises at the first host sync: {kernels_per_step, sync_free_step, sync_error}."""
    from torch.profiler import ProfilerActivity, profile

    cuda = batch["first_target"].device.type == "cuda"
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        step_once(batch)
        if cuda:
            torch.cuda.synchronize()
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    kernels = sum(e.count for e in prof.key_averages() if e.device_type == kind)
    result: dict[str, Any] = {"kernels_per_step": kernels, "sync_free_step": None, "sync_error": None}
    if cuda:
        torch.cuda.set_sync_debug_mode("error")
        try:
            step_once(batch)
            result["sync_free_step"] = True
        except RuntimeError as e:  # the first synchronizing call, named by CUDA's debug mode
            result["sync_free_step"], result["sync_error"] = False, " ".join(str(e).split())[:300]
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return result


@torch.no_grad()
def eval_bpb(model: PatchLM, data: TokenBatches, rows: int, *, batch_size: int) -> float:
    """Bits per byte on `rows` held-out rows spread over the whole eval split."""
    model.eval()
    index = data.spread("eval", rows)
    nll, nbytes = 0.0, 0
    for i in range(0, index.numel(), batch_size):
        batch = data.batch("eval", index[i : i + batch_size])
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=data.device.type == "cuda"):
            logits, targets = model(batch)
        nll += float(cross_entropy_sum(logits, targets))
        nbytes += int(batch["target_bytes"].sum())
    model.train()
    return nll / math.log(2) / max(nbytes, 1)


def _warmup_cosine(step: int, warmup: int, total: int) -> float:
    """LR factor: linear warm-up, then cosine to 10%.

    >>> [round(_warmup_cosine(s, 2, 10), 3) for s in (0, 1, 2, 10)]
    [0.5, 1.0, 1.0, 0.1]
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(total - warmup, 1))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
