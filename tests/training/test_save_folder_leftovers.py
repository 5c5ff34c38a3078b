"""A save folder after a crash or in a user's hands (issue 20): autoresume continues from the newest
complete checkpoint whatever a kill left, save_overwrite deletes only what hbpe wrote, and autoresume
refuses settings that change the order of the samples."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.errors import ConfigError
from hbpe.training.train.trainer import build_run, train
from tests.helpers import cli_fails as _fails
from tests.helpers import train_cfg as _cfg

EACH_BATCH = ("eval_interval=100ba", "save_interval=1ba", "console=false")
LONGER = ("optim.allow_new_duration=true",)  # resumed with a longer max_duration: its cosine over the new length


def _train_cli(sample_shards, folder, *extra: str) -> dict:
    train_dir, eval_dir = sample_shards
    args = [f"data.train={train_dir}", "data.eval=null", f"save_folder={folder}", "log_interval=100ba", *extra]
    r = CliRunner().invoke(main, ["train", "tiny", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout[r.stdout.index("{") :])


def test_autoresume_after_a_kill_between_checkpoint_and_symlink(sample_shards, tmp_path, caplog):
    """Composer writes ep0-ba2-rank0.pt, then moves latest-rank0.pt: a kill in between left a checkpoint newer
    than the symlink (or no symlink), and a kill during the write a truncated one. Before: the rerun refused
    every time with Composer's internal FileExistsError ("may conflict with a future checkpoint")."""
    folder = tmp_path / "run"
    assert _train_cli(sample_shards, folder, "max_duration=2ba", *EACH_BATCH)["batches"] == 2
    (folder / "latest-rank0.pt").unlink()
    os.symlink("ep0-ba1-rank0.pt", folder / "latest-rank0.pt")  # killed before the symlink moved to ba2
    out = _train_cli(sample_shards, folder, "max_duration=3ba", "autoresume=true", *EACH_BATCH, *LONGER)
    assert (out["resumed_at_batch"], out["batches"]) == (2, 3)
    assert "ep0-ba2-rank0.pt is newer than the checkpoint latest-rank0.pt names" in caplog.text
    assert os.readlink(folder / "latest-rank0.pt") == "ep0-ba3-rank0.pt"

    (folder / "latest-rank0.pt").unlink()  # killed before the first symlink
    whole = (folder / "ep0-ba3-rank0.pt").read_bytes()
    (folder / "ep0-ba4-rank0.pt").write_bytes(whole[: len(whole) // 2])  # killed while writing ba4
    out = _train_cli(sample_shards, folder, "max_duration=5ba", "autoresume=true", *EACH_BATCH, *LONGER)
    assert (out["resumed_at_batch"], out["batches"]) == (3, 5)
    # the cut checkpoint is kept aside (nothing hbpe did not write is deleted), out of Composer's way
    assert (folder / "ep0-ba4-rank0.pt.incomplete").read_bytes() == whole[: len(whole) // 2]
    assert "ep0-ba4-rank0.pt is incomplete" in caplog.text
    assert os.readlink(folder / "latest-rank0.pt") == "ep0-ba5-rank0.pt"


def test_save_overwrite_deletes_only_what_hbpe_wrote(sample_shards, tmp_path):
    """Before: save_overwrite=true removed a tokenizer/ folder holding the user's my-notes.md."""
    folder = tmp_path / "run"
    short = ("max_duration=1ba", "eval_interval=1ba", "save_interval=1ba", "console=false", "eval_subset_num_batches=1")
    train(_cfg(sample_shards, folder, *short))
    notes = folder / "tokenizer" / "my-notes.md"
    notes.write_text("keep me")
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(ConfigError, match=r"tokenizer, which holds files hbpe did not write \(my-notes\.md\)"):
        build_run(_cfg(sample_shards, folder, *short, "save_overwrite=true"))
    assert notes.read_text() == "keep me" and sorted(p.name for p in folder.iterdir()) == before
    notes.unlink()
    (folder / "ep0-ba7").mkdir()  # a sharded checkpoint's folder with the user's file in it
    (folder / "ep0-ba7" / ".metadata").write_bytes(b"")
    (folder / "ep0-ba7" / "plan.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"ep0-ba7, which holds files hbpe did not write \(plan\.txt\)"):
        build_run(_cfg(sample_shards, folder, *short, "save_overwrite=true"))
    (folder / "ep0-ba7" / "plan.txt").unlink()
    (folder / "ep0-ba9-rank0.pt.incomplete").write_bytes(b"PK")  # one autoresume set aside
    assert train(_cfg(sample_shards, folder, *short, "save_overwrite=true"))["batches"] == 1
    assert not (folder / "ep0-ba7").exists() and not (folder / "ep0-ba9-rank0.pt.incomplete").exists()
    assert (folder / "tokenizer" / "hbpe_tokenizer.json").is_file()


def test_cli_save_overwrite_names_the_foreign_file(sample_shards, tmp_path):
    folder = tmp_path / "run"
    short = ("max_duration=1ba", "eval_interval=1ba", "save_interval=1ba", "console=false")
    _train_cli(sample_shards, folder, *short)
    (folder / "tokenizer" / "my-notes.md").write_text("keep me")
    train_dir, _ = sample_shards
    args = [f"data.train={train_dir}", "data.eval=null", f"save_folder={folder}", *short, "save_overwrite=true"]
    r = CliRunner().invoke(main, ["train", "tiny", *args])
    _fails(r, 2, f"save_overwrite=true would delete {folder}/tokenizer, which holds files hbpe did not write")
    assert "(my-notes.md)" in r.output and (folder / "tokenizer" / "my-notes.md").read_text() == "keep me"


@pytest.mark.parametrize(
    "override,message",
    [
        ("global_batch_size=4", "global_batch_size 8 -> 4"),
        ("data.shuffle_seed=5", "data.shuffle_seed 17 -> 5"),
        ("data.shuffle_algo=py1s", "data.shuffle_algo py1e -> py1s"),
    ],
)
def test_autoresume_refuses_another_sample_order(sample_shards, tmp_path, override, message):
    """Before: autoresume=true with another global_batch_size trained on, with another order than the run's."""
    folder = tmp_path / "run"
    short = ("eval_interval=1ba", "save_interval=1ba", "console=false", "autoresume=true", "eval_subset_num_batches=1")
    train(_cfg(sample_shards, folder, "max_duration=1ba", *short))
    train_dir, eval_dir = sample_shards
    args = [f"data.train={train_dir}", f"data.eval={eval_dir}", f"save_folder={folder}", "max_duration=2ba", *short]
    r = CliRunner().invoke(main, ["train", "tiny", *args, override])
    _fails(r, 2, f"autoresume=true but the run in save_folder {folder} was trained with another sample order")
    assert f"({message})" in r.output and "resume with the run's settings" in r.output
    assert sorted(p.name for p in folder.glob("ep*")) == ["ep0-ba1-rank0.pt"]
