"""optim.schedule=constant (issue 18, section 2): after the warm-up the learning rate stays where it is, so every
point of a training curve is the result of a run of that length; cosine decays over the run (its mid-run points are
not). Read from the optimizer Composer's scheduler drives, batch by batch, in a real run."""

from __future__ import annotations

import pytest
from composer import Callback

from hbpe.experiments.presets import PRESETS, load_spec
from hbpe.experiments.runner import train_config
from hbpe.schemas.errors import ConfigError
from hbpe.training.train.config_io import load_config
from hbpe.training.train.trainer import build_run


class _LearningRates(Callback):
    def __init__(self) -> None:
        self.lr: list[float] = []

    def batch_start(self, state, logger) -> None:  # the rate this batch's step uses
        self.lr.append(state.optimizers[0].param_groups[0]["lr"])


def _cfg(sample_shards, folder, *extra: str):
    train_dir, eval_dir = sample_shards
    return load_config(
        "tiny",
        [f"data.train={train_dir}", f"data.eval={eval_dir}", f"save_folder={folder}", "console=false",
         "max_duration=10ba", "eval_interval=10ba", "save_interval=10ba", "optim.lr=0.002", "optim.warmup=4ba",
         "model.latent_layers=1", "model.encoder_layers=1", "model.decoder_layers=1",
         # the rates do not depend on the batch's size or the evaluation: 2 samples a batch, 1 eval batch
         "global_batch_size=2", "eval_subset_num_batches=1", *extra],
    )  # fmt: skip


def _fit(cfg) -> list[float]:
    """The learning rate of each batch this session trains."""
    rates = _LearningRates()
    run = build_run(cfg, callbacks=[rates])
    run.trainer.fit()
    run.close()
    return rates.lr


def _rates(sample_shards, tmp_path, schedule: str) -> list[float]:
    return _fit(_cfg(sample_shards, tmp_path / schedule, f"optim.schedule={schedule}"))


def test_constant_schedule_holds_the_rate_after_the_warm_up(sample_shards, tmp_path):
    constant = _rates(sample_shards, tmp_path, "constant")
    assert len(constant) == 10
    # a linear warm-up over 4 batches (Composer steps its scheduler before it advances the clock, so batch k
    # trains at the rate of k - 1, and the first two at 0) ...
    assert constant[:5] == pytest.approx([0.0, 0.0, 0.0005, 0.001, 0.0015])
    assert constant[5:] == pytest.approx([0.002] * 5)  # ... then constant: any batch is a valid end of training
    cosine = _rates(sample_shards, tmp_path, "cosine")
    assert cosine[5] == pytest.approx(0.002) and cosine[-1] < 0.0015  # the default decays within the run


def test_an_experiment_passes_its_schedule_and_seed_to_every_run(tmp_path):
    from hbpe.experiments.data_prep import StageData

    stage = StageData(tmp_path / "tok", tmp_path / "train", tmp_path / "eval")
    spec = load_spec("crossover-mini")
    cfg = train_config(spec, spec.runs[0], stage, tmp_path / "run", tmp_path, seed=19)
    assert cfg["optim"]["schedule"] == "constant" and cfg["seed"] == 19 and cfg["data"]["shuffle_seed"] == 19
    for name in PRESETS:  # every preset takes both
        spec = load_spec(name, ["schedule=constant", "seeds=2"], train_corpus=("corpus.jsonl",))
        assert (spec.schedule, spec.seeds) == ("constant", 2)
    assert load_spec("table1-mini").schedule == "cosine"  # the published miniatures keep theirs


def test_resuming_with_another_max_duration_is_refused_unless_asked_for(sample_shards, tmp_path):
    """Before (issue 28): autoresume with another max_duration laid the cosine over the new length without a word,
    and the learning rate jumped at the checkpoint, where other settings that change a run's course are refused."""
    cosine = ("optim.schedule=cosine", "autoresume=true", "save_interval=4ba", "eval_interval=4ba")
    folder = tmp_path / "cosine"
    _fit(_cfg(sample_shards, folder, *cosine, "max_duration=4ba"))
    with pytest.raises(
        ConfigError,
        match=r"trained with max_duration=4ba, not 8ba: its learning-rate schedule \(optim.schedule=cosine\) spans "
        r"max_duration, .* resume with max_duration=4ba, or pass optim.allow_new_duration=true",
    ):
        build_run(_cfg(sample_shards, folder, *cosine, "max_duration=8ba"))
    asked = _fit(_cfg(sample_shards, folder, *cosine, "max_duration=8ba", "optim.allow_new_duration=true"))
    assert len(asked) == 4  # batches 5..8, on the cosine over 8 batches
    with pytest.raises(
        ConfigError, match=r"raise max_duration above 8ba to continue it \(with optim.allow_new_duration"
    ):
        build_run(_cfg(sample_shards, folder, *cosine, "max_duration=8ba"))  # a finished run: what to pass, at once
    # the constant schedule does not depend on the run's length: a longer run continues at the same rate
    constant = ("optim.schedule=constant", "autoresume=true", "save_interval=6ba", "eval_interval=6ba")
    first = _fit(_cfg(sample_shards, tmp_path / "constant", *constant, "max_duration=6ba"))
    assert _fit(_cfg(sample_shards, tmp_path / "constant", *constant, "max_duration=8ba")) == [first[-1]] * 2
