"""Sizes `hbpe convert` takes with no upper bound (issue 35), refused up front with one line, nothing written:

- `--workers` (before: `--workers 10000` hung starting a Dask LocalCluster, and `--workers 1000000000` or
  `hbpe.convert(..., workers=2**70)` grew to 24 GB until the OOM killer took the caller): at most
  WORKERS_PER_CORE per core of this machine where they are its processes, and refused as meaningless where a
  cluster runs them (`--dask-address`);
- `--seq-len` (before: 100000000000 "succeeded" with 0 samples and a manifest of seq_len 1180591620717411303424
  for 2**70, refused only by training): at most model.max_patches' limit.

No cluster is started: every refusal comes before one would be.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import hbpe
from hbpe.cli import main
from hbpe.pipeline.beam.options import WORKERS_PER_CORE, choose_runner, local_cores
from hbpe.schemas.convert_config import MAX_SEQ_LEN, ConvertConfig
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import MODEL_SIZE_LIMITS
from tests.conftest import SAMPLE_EN
from tests.helpers import cli_fails


def most_workers() -> int:
    return WORKERS_PER_CORE * local_cores()


def convert_cli(tok_dir, out, *args: str):
    cmd = ["convert", "--tokenizer", str(tok_dir), "--input", str(SAMPLE_EN), "--out", str(out), *args]
    return CliRunner().invoke(main, cmd)


@pytest.mark.parametrize("workers", ["10000", "1000000000"])
def test_cli_refuses_more_dask_workers_than_this_machine_holds(tmp_path, gpt2_tokenizer_dir, workers):
    r = convert_cli(gpt2_tokenizer_dir, tmp_path / "out", "--runner", "dask", "--workers", workers)
    cores = local_cores()
    cli_fails(
        r, 2,
        f"error: --workers {workers}: at most {most_workers()} worker processes here ({WORKERS_PER_CORE} per core, "
        f"{cores} core(s)): each is a process with its own tokenizer, and more than the cores only share them; pass "
        f"--workers {cores} (the default), or a Dask cluster (--runner dask --dask-address) for more",
    )  # fmt: skip
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("runner", ["inprocess", "dask", "auto", "DirectRunner"])
def test_every_local_runner_bounds_workers_by_cores(runner):
    assert choose_runner(runner, [], output="/o", files=[], workers=most_workers()).workers == most_workers()
    with pytest.raises(ConfigError, match=rf"^--workers {most_workers() + 1}: at most {most_workers()} worker "):
        choose_runner(runner, [], output="/o", files=[], workers=most_workers() + 1)


def test_api_refuses_workers_2_to_the_70(tmp_path, gpt2_tokenizer_dir):
    with pytest.raises(ConfigError, match=rf"^--workers {2**70}: at most {most_workers()} worker processes here"):
        hbpe.convert(SAMPLE_EN, tmp_path / "out", tokenizer=gpt2_tokenizer_dir, runner="dask", workers=2**70)
    assert not (tmp_path / "out").exists()


def test_workers_with_a_remote_cluster_are_refused_as_meaningless():
    """A remote cluster's size is not this machine's to bound (its workers are started on its machines), so any
    --workers, small or huge, is refused there rather than silently ignored."""
    for workers in (2, 10**9):
        with pytest.raises(
            ConfigError, match=rf"^--workers {workers} has no effect with --dask-address tcp://h:8786: that cluster's"
        ):
            choose_runner("dask", [], output="/o", files=[], workers=workers, dask_address="tcp://h:8786")
        with pytest.raises(ConfigError, match=rf"^--workers {workers} has no effect with --runner DataflowRunner: "):
            choose_runner("DataflowRunner", [], output="gs://b/o", files=[], workers=workers)
    assert choose_runner("dask", [], output="/o", files=[], dask_address="tcp://h:8786").dask_address


SEQ_LEN_TOO_LONG = (
    rf"seq_len must be <= {MAX_SEQ_LEN}, got {{}}: a sample is one latent context, and no model trains on one longer "
    rf"\(model\.max_patches is at most {MAX_SEQ_LEN}\); pass e\.g\. --seq-len 1024"
)


def test_seq_len_past_the_models_latent_context_is_refused(tmp_path, gpt2_tokenizer_dir):
    assert MODEL_SIZE_LIMITS["max_patches"] == MAX_SEQ_LEN
    assert ConvertConfig(inputs=("x",), output="o", tokenizer="t", seq_len=MAX_SEQ_LEN).seq_len == MAX_SEQ_LEN
    with pytest.raises(ConfigError, match="^" + SEQ_LEN_TOO_LONG.format(MAX_SEQ_LEN + 1)):
        ConvertConfig(inputs=("x",), output="o", tokenizer="t", seq_len=MAX_SEQ_LEN + 1)
    with pytest.raises(ConfigError, match="^" + SEQ_LEN_TOO_LONG.format(2**70)):
        hbpe.convert(SAMPLE_EN, tmp_path / "api", tokenizer=gpt2_tokenizer_dir, seq_len=2**70)
    r = convert_cli(gpt2_tokenizer_dir, tmp_path / "cli", "--seq-len", "100000000000")
    cli_fails(r, 2, "error: " + SEQ_LEN_TOO_LONG.format(100000000000).replace("\\", ""))
    assert not (tmp_path / "api").exists() and not (tmp_path / "cli").exists()
