"""Text bytes and patches per second of training, the numbers `hbpe bench train` reports."""

from __future__ import annotations

import time

from composer import Callback, Logger, State


class ThroughputMeter(Callback):
    """Text bytes and patches per second of training (SpeedMonitor reports samples and FLOPs)."""

    def __init__(self) -> None:
        self.bytes = self.patches = self.batches = 0
        self.seconds = self.flops = self.pad_flops = self.paper_flops = 0.0
        self._t0: float | None = None

    def batch_start(self, state: State, logger: Logger) -> None:
        self._t0 = time.perf_counter()

    def batch_end(self, state: State, logger: Logger) -> None:
        dt = time.perf_counter() - (self._t0 or time.perf_counter())
        b = state.batch
        # predicted text positions: tokens, bytes or byte patches by scheme (training/data/schemes.py)
        nbytes, npatches = int(b["target_bytes"].sum()), int(b["text_positions"].sum())
        if self.batches > 0:  # the first batch pays warm-up costs
            flops = batch_flops(state)
            self.seconds += dt
            self.bytes += nbytes
            self.patches += npatches
            self.flops += flops["executed"]
            self.pad_flops += flops["pad"]
            self.paper_flops += flops["paper"]
        self.batches += 1
        if self.seconds > 0:
            logger.log_metrics(
                {
                    "throughput/bytes_per_sec": self.bytes / self.seconds,
                    "throughput/patches_per_sec": self.patches / self.seconds,
                }
            )

    def summary(self) -> dict[str, float]:
        s = max(self.seconds, 1e-9)
        return {
            "bytes_per_sec": self.bytes / s,
            "patches_per_sec": self.patches / s,
            "timed_batches": max(self.batches - 1, 0),
            "executed_flops_per_byte": self.flops / max(self.bytes, 1),
            "executed_flops_per_sec": self.flops / s,
            "paper_flops_per_byte": self.paper_flops / max(self.bytes, 1),
            "pad_share": self.pad_flops / self.flops if self.flops else 0.0,  # of the executed FLOPs
        }


def batch_flops(state: State) -> dict[str, float]:
    """{executed, pad, paper} FLOPs of the batch just trained (HierarchicalComposerModel.batch_flops), also
    where Composer has wrapped the model (DistributedDataParallel keeps it as `.module`)."""
    model = state.model
    return (model if hasattr(model, "batch_flops") else model.module).batch_flops(state.batch)
