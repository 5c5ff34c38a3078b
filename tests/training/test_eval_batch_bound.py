"""`evaluate`'s batch_size is bounded where it enters (issue 35): batch_size=2**70 ran the streaming sampler for
minutes and ended in its ValueError ("Stop argument for islice() must be ..."); now one ConfigError, before a
model or a shard is read (the paths need not hold a run)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import hbpe
from hbpe.cli import main
from hbpe.schemas.errors import ConfigError
from hbpe.training.inference.evaluate import MAX_EVAL_BATCH_SIZE, check_eval_args
from tests.helpers import cli_fails


@pytest.mark.parametrize("batch_size", [2**70, MAX_EVAL_BATCH_SIZE + 1])
def test_a_batch_size_past_the_bound_is_one_config_error(tmp_path, batch_size):
    with pytest.raises(
        ConfigError, match=rf"^batch_size={batch_size}: at most 65536 samples per batch .* batch_size=8"
    ):
        hbpe.evaluate(tmp_path / "run", tmp_path / "shards", batch_size=batch_size)


def test_the_cli_says_it_in_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "shards").mkdir()
    args = ["eval", "--checkpoint", str(tmp_path / "run"), "--data", str(tmp_path / "shards")]
    r = CliRunner().invoke(main, [*args, "--batch-size", str(2**70)])
    cli_fails(r, 2, "batch_size=1180591620717411303424: at most 65536 samples per batch")


def test_the_bound_itself_is_accepted():
    check_eval_args(batch_size=MAX_EVAL_BATCH_SIZE, max_batches=None)
