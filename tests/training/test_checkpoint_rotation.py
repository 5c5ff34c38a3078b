"""save_num_checkpoints_to_keep holds across autoresume (issue 35): the save folder keeps the run's newest N
checkpoints, not the newest N this process saved. Before: Composer's rotation deleted only the checkpoints of its
own process, so those saved before a kill (or any stop) and autoresume stayed for good (keep 3: 5 kept, then 6)."""

from __future__ import annotations

import os
import re

from composer import Callback

from hbpe.training.checkpoint.save_folder import earlier_checkpoints
from hbpe.training.train.trainer import build_run, train
from tests.helpers import train_cfg

SHORT = ("data.eval=null", "save_interval=1ba", "save_num_checkpoints_to_keep=3", "console=false")
RESUMED = ("autoresume=true", "optim.allow_new_duration=true")  # a longer run: its cosine over the new length


def _checkpoints(folder) -> list[int]:
    """The batches of the rank-0 checkpoint files in `folder`, in order."""
    found = (re.fullmatch(r"ep\d+-ba(\d+)-rank0\.pt", n) for n in os.listdir(folder))
    return sorted(int(m.group(1)) for m in found if m)


class _Listing(Callback):
    """The folder's checkpoints as each batch starts (the previous batch's checkpoint saved and rotated) and at the end."""

    def __init__(self, folder) -> None:
        self.folder, self.seen = folder, []

    def batch_start(self, state, logger) -> None:
        self.seen.append(_checkpoints(self.folder))

    def fit_end(self, state, logger) -> None:
        self.seen.append(_checkpoints(self.folder))


def test_autoresume_keeps_the_runs_newest_checkpoints(sample_shards, tmp_path):
    folder = tmp_path / "run"
    train(train_cfg(sample_shards, folder, *SHORT, "max_duration=4ba"))
    assert _checkpoints(folder) == [2, 3, 4]  # the first session's own rotation
    # what hbpe or the user left beside them is not Composer's to rotate
    keep = {"ep0-ba1-rank0.pt.incomplete": b"PK", "notes.pt": b"mine", "ep0-ba1-consolidated.pt": b"PK"}
    for name, data in keep.items():
        (folder / name).write_bytes(data)

    listing = _Listing(folder)
    run = build_run(train_cfg(sample_shards, folder, *SHORT, *RESUMED, "max_duration=7ba"), callbacks=[listing])
    try:
        assert int(run.trainer.state.timestamp.batch) == 4
        run.trainer.fit()
    finally:
        run.close()
    # before: [2, 3, 4], [2, 3, 4, 5], [2, 3, 4, 5, 6], [2, 3, 4, 5, 6, 7]
    assert listing.seen == [[2, 3, 4], [3, 4, 5], [4, 5, 6], [5, 6, 7]]
    assert os.readlink(folder / "latest-rank0.pt") == "ep0-ba7-rank0.pt"
    assert all((folder / name).read_bytes() == data for name, data in keep.items())


def test_earlier_checkpoints_are_composers_files_up_to_the_resume_point(tmp_path):
    for name in ("ep0-ba2-rank0.pt", "ep1-ba10-rank0.pt", "ep0-ba9-rank0.pt", "ep0-ba12-rank0.pt", "ep0-ba3-rank1.pt"):
        (tmp_path / name).write_bytes(b"PK")
    (tmp_path / "ep0-ba4").mkdir()  # a sharded checkpoint: Composer's own rotation
    os.symlink("ep0-ba9-rank0.pt", tmp_path / "latest-rank0.pt")
    os.symlink("ep0-ba9-rank0.pt", tmp_path / "ep0-ba5-rank0.pt")  # a symlink of the user's, whatever its name
    expected = [str(tmp_path / n) for n in ("ep0-ba2-rank0.pt", "ep0-ba9-rank0.pt", "ep1-ba10-rank0.pt")]
    assert earlier_checkpoints(str(tmp_path), 10) == expected  # by batch, not by name
    assert earlier_checkpoints(str(tmp_path / "none"), 10) == [] == earlier_checkpoints("s3://b/run", 10)
