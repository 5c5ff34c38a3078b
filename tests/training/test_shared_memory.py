"""A process that trains run after run gives back each run's shared memory and stream cache (training/data/
shared_memory.py): streaming would hold six /dev/shm segments per dataset, and their file descriptors, until
the process exits, and each new dataset's prefix probe kept one more per live segment. Measured before the
fix: 37-42 descriptors more per run; a test worker reached its 20,000-descriptor limit."""

from __future__ import annotations

import contextlib
import os

from hbpe.training.data.shared_memory import _segments, release
from hbpe.training.train.config_io import load_config
from hbpe.training.train.trainer import build_run, run_datasets


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _open_files_under(folder) -> list[str]:
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since it was listed (the listing's own descriptor)
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [p for p in paths if p.startswith(str(folder))]


def _cfg(sample_shards, folder):
    train_dir, eval_dir = sample_shards
    return load_config(
        "tiny",
        [f"data.train={train_dir}", f"data.eval={eval_dir}", f"save_folder={folder}", "console=false",
         "max_duration=2ba", "eval_interval=2ba", "save_interval=2ba", "global_batch_size=2",
         "eval_subset_num_batches=1", "model.latent_layers=1", "model.encoder_layers=1", "model.decoder_layers=1"],
    )  # fmt: skip


def test_run_after_run_in_one_process_holds_no_more_descriptors_segments_or_cache_locks(sample_shards, tmp_path):
    counts, names = [], []
    for i in range(4):
        run = build_run(_cfg(sample_shards, tmp_path / f"run{i}"))
        run.trainer.fit()
        datasets = run_datasets(run.trainer)
        assert len(datasets) == 2  # training and eval
        segments = [s for d in datasets for v in vars(d).values() for s in _segments(v)]
        assert len(segments) == 12  # six a dataset
        names += [shm.name for s in segments for shm in s.created_shms]
        run.close()
        counts.append(_descriptors())
        assert _open_files_under(tmp_path) == []  # the stream cache's lock no longer held, nothing of the run open
    assert counts[-1] - counts[0] <= 1, counts  # was +37-42 a run
    assert names and not [n for n in names if os.path.exists(f"/dev/shm/{n.lstrip('/')}")]  # every segment unlinked


def test_release_is_idempotent_and_counts_what_it_gave_back(sample_shards, tmp_path):
    run = build_run(_cfg(sample_shards, tmp_path / "run"))
    run.trainer.close()
    dataset = run_datasets(run.trainer)[0]
    assert release(dataset) == 6
    assert release(dataset) == 6  # a second release closes nothing twice and raises nothing
    run.close()
