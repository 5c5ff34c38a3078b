"""What an experiment is: corpora, first stages, one training budget, and a list of runs.

Every run of an experiment trains on the same samples for the same number of batches (the
byte schemes derive their input from the same `tokens`), so each sees the same training bytes:
an equal byte budget by construction. A spec is a preset (training/experiments/presets.py) or
a YAML file with the same keys; `ExperimentSpec.from_dict` checks it and names a wrong key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import IO_SCHEMES, ModelConfig

SHARED_EN = "../shared/data/en-sotu.jsonl.zst"
SHARED_ZH = "../shared/data/zh-kernel-docs.jsonl.zst"


@dataclass(frozen=True)
class FirstStageSpec:
    """A first-stage BPE: a tiktoken name, a rank file (+ pattern), or trained in-house to `vocab_size`."""

    encoding: str | None = None  # tiktoken name or .tiktoken rank file
    pattern: str | None = None  # split pattern for a rank file or the in-house trainer
    vocab_size: int | None = None  # in-house: trained on the experiment's training corpus

    def __post_init__(self) -> None:
        if (self.encoding is None) == (self.vocab_size is None):
            raise ConfigError("a first stage needs exactly one of encoding (tiktoken name or rank file) or vocab_size")
        if self.vocab_size is not None and self.vocab_size <= 256:
            raise ConfigError(f"first stage vocab_size={self.vocab_size}: must be more than the 256 bytes")


@dataclass(frozen=True)
class RunSpec:
    name: str  # a folder name under OUT/runs
    first_stage: str  # a key of ExperimentSpec.first_stages
    model: dict[str, Any]  # ModelConfig fields (io, sizes, entropy settings) over model_size
    max_patch_size: int | None = None  # S for BPE-patch (default: the first stage's tokenizer S)
    entropy_from: str | None = None  # io=entropy: the run whose final checkpoint is the entropy model

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"run name {self.name!r}: must be a plain folder name")
        io = self.model.get("io", "hierarchical")
        if io not in IO_SCHEMES:
            raise ConfigError(f"run {self.name}: model.io={io!r}, expected one of {', '.join(IO_SCHEMES)}")
        if (io == "entropy") != (self.entropy_from is not None or "entropy_model" in self.model):
            raise ConfigError(f"run {self.name}: io=entropy needs entropy_from (a bytes run) and only it takes one")


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    description: str
    first_stages: dict[str, FirstStageSpec]
    runs: tuple[RunSpec, ...]
    train_corpus: tuple[str, ...] = (SHARED_EN,)
    eval_corpus: tuple[str, ...] = ()  # empty: every `holdout_every`-th document of the training corpus
    holdout_every: int = 10
    max_patch_size: int = 10  # S of the shards (runs may derive smaller or larger S from `tokens`)
    seq_len: int = 128
    model_size: str = "tiny"
    global_batch_size: int = 8
    batches: int = 200
    lr: float = 3e-3
    warmup: int = 20
    eval_points: int = 5  # held-out evaluations along training: the training curve
    eval_batches: int = 8  # held-out batches per curve point
    final_eval_batches: int = 40  # held-out batches of the final BPB (the same samples for every run)
    plots: tuple[str, ...] = ("curve",)  # curve, vocab, s
    seed: int = 17
    extra: dict[str, Any] = field(default_factory=dict)  # train config overrides for every run

    def __post_init__(self) -> None:
        names = [r.name for r in self.runs]
        if len(set(names)) != len(names):
            raise ConfigError(f"experiment {self.name}: run names repeat ({names})")
        for r in self.runs:
            if r.first_stage not in self.first_stages:
                raise ConfigError(f"run {r.name}: first_stage {r.first_stage!r} is not in {sorted(self.first_stages)}")
            if r.entropy_from is not None:
                src = next((x for x in self.runs if x.name == r.entropy_from), None)
                if src is None or src.model.get("io") != "bytes" or names.index(src.name) > names.index(r.name):
                    raise ConfigError(f"run {r.name}: entropy_from={r.entropy_from!r} must name an earlier bytes run")
            ModelConfig.from_dict(
                {"entropy_model": "x.pt" if r.entropy_from else None, **r.model}
            )  # a wrong model key fails here, before anything trains
        if self.batches < self.eval_points or self.eval_points < 1:
            raise ConfigError(f"batches={self.batches} must be >= eval_points={self.eval_points} >= 1")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExperimentSpec:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown experiment keys {unknown}; known: {sorted(known)}")
        try:
            return cls(
                **{
                    **d,
                    "first_stages": {k: FirstStageSpec(**v) for k, v in d.get("first_stages", {}).items()},
                    "runs": tuple(RunSpec(**r) for r in d.get("runs", ())),
                    "train_corpus": tuple(d.get("train_corpus", (SHARED_EN,))),
                    "eval_corpus": tuple(d.get("eval_corpus", ())),
                    "plots": tuple(d.get("plots", ("curve",))),
                }
            )
        except TypeError as e:
            raise ConfigError(f"experiment spec: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def run_fingerprint(self, run: RunSpec) -> str:
        """What decides a run's result: its spec, its first stage, the data and the budget (not the other runs)."""
        d = self.to_dict()
        keep = {k: v for k, v in d.items() if k not in ("runs", "first_stages", "name", "description", "plots")}
        keep.update(run=asdict(run), first_stage=asdict(self.first_stages[run.first_stage]))
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]
