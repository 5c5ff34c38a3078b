"""Training's own callbacks: text bytes and patches per second (the numbers `hbpe bench train` reports), the
progress line a run shows on stderr, and the rotation of a resumed run's earlier checkpoints."""

from __future__ import annotations

import time
from typing import Any

from composer import Callback, Logger, State

from hbpe.pipeline.progress_line import ProgressLine, progress_interval, rate
from hbpe.training.checkpoint.save_folder import earlier_checkpoints
from hbpe.training.train.host_counts import HOST_BYTES, HOST_TEXT_POSITIONS


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
        if HOST_BYTES in b:  # counted by the loader (HostCounts): no host sync
            nbytes, npatches = int(b[HOST_BYTES]), int(b[HOST_TEXT_POSITIONS])
        else:
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


class TrainProgress(Callback):
    """One progress line on stderr while a run trains (rank 0): batches done of the total, the last batch's loss
    and BPB, text KB/s, time left; a line of its own with each evaluation's BPB. It stands in for Composer's
    console logger, whose every-metric dumps (config key console_metrics) say little while a run goes."""

    def __init__(self, *, interval_s: float | None = None) -> None:
        # read now (build_run): a wrong HBPE_PROGRESS_INTERVAL is said before the run folder is touched
        self.interval_s = progress_interval() if interval_s is None else interval_s
        self._line: ProgressLine | None = None
        self._bytes: Any = 0  # a tensor on the run's device once a batch is seen: summed there, read when drawn
        self._t0 = 0.0

    def fit_start(self, state: State, logger: Logger) -> None:
        from composer.utils import dist

        if dist.get_global_rank() != 0:
            return
        done = int(state.timestamp.batch)  # a resumed run starts at its checkpoint's batch
        self._line = ProgressLine("train", total_batches(state), initial=done, interval_s=self.interval_s)
        self._t0 = time.monotonic()

    def batch_end(self, state: State, logger: Logger) -> None:
        if self._line is None:
            return
        self._bytes = self._bytes + state.batch["target_bytes"].sum()
        self._line.update(1, lambda: self._fields(state))

    def eval_end(self, state: State, logger: Logger) -> None:
        if self._line is None:
            return
        metrics = state.eval_metrics.get(state.dataloader_label or "eval", {})
        if "BitsPerByte" in metrics:
            bpb = float(metrics["BitsPerByte"].compute())
            self._line.write(f"eval at batch {int(state.timestamp.batch)}: BPB {bpb:.4f}")

    def fit_end(self, state: State, logger: Logger) -> None:
        if self._line is not None:
            self._line.close(lambda: self._fields(state))
            self._line = None

    def _fields(self, state: State) -> dict[str, str]:
        out = {}
        loss = state.loss
        if hasattr(loss, "item"):  # a tensor (Composer keeps a dict or tuple for some models: then no loss shown)
            out["loss"] = f"{float(loss.detach()):.3f}"  # detached: torch 2.15 warns on float() of a grad tensor
        bpb = state.train_metrics.get("BitsPerByte") if state.train_metrics else None
        if bpb is not None:
            out["BPB"] = f"{float(bpb.compute()):.3f}"
        out[""] = rate(float(self._bytes), time.monotonic() - self._t0)
        return out


class KeepNewestCheckpoints(Callback):
    """save_num_checkpoints_to_keep across a resumption: the newest N checkpoints of the run, not of this process.

    Composer's CheckpointSaver deletes only the checkpoints it saved itself (its list starts empty in each process),
    so those of the run before a kill and autoresume were never deleted (save_num_checkpoints_to_keep=3 kept 5). At the
    start of fit, rank 0 puts the run's earlier checkpoints at the front of that list, oldest first: Composer's own
    rotation then deletes them as the new ones arrive, the resume point last. Sharded checkpoints (a folder per
    checkpoint, written by every rank) are left to Composer as they are.
    """

    def __init__(self) -> None:
        self._done = False

    def fit_start(self, state: State, logger: Logger) -> None:
        from composer.callbacks import CheckpointSaver
        from composer.utils import dist, format_name_with_dist

        if self._done or dist.get_global_rank() != 0 or state.fsdp_sharded_state_dict_enabled:
            return
        self._done = True
        for saver in (cb for cb in state.callbacks if isinstance(cb, CheckpointSaver)):
            if saver.num_checkpoints_to_keep < 1:  # 0 keeps none of its own: the earlier ones are the only resume point
                continue
            folder = format_name_with_dist(saver.folder, state.run_name)
            known = set(saver.saved_checkpoints)
            earlier = [p for p in earlier_checkpoints(folder, int(state.timestamp.batch)) if p not in known]
            saver.saved_checkpoints[:0] = earlier


def total_batches(state: State) -> int | None:
    """The run's length in batches where max_duration says it (batches, or epochs of a known length)."""
    from composer.core import TimeUnit

    duration = state.max_duration
    if duration is None:
        return None
    if duration.unit == TimeUnit.BATCH:
        return int(duration.value)
    if duration.unit == TimeUnit.EPOCH and state.dataloader_len is not None:
        return int(duration.value) * int(state.dataloader_len)
    return None
