"""What an experiment is: corpora, first stages, one training budget, and a list of runs.

Every run of an experiment trains on the same samples for the same number of batches (the
byte schemes derive their input from the same `tokens`), so each sees the same training bytes:
an equal byte budget by construction. A spec is a preset (hbpe/experiments/presets.py) or
a YAML file with the same keys; `ExperimentSpec.from_dict` checks it and names a wrong key.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from hbpe.schemas.convert_config import MIN_SEQ_LEN
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.schemes import scheme_names
from hbpe.schemas.tokenizer_artifact import MAX_PATCH_SIZE_LIMIT
from hbpe.schemas.train_config import MAX_SEED, MODEL_SIZE_LIMITS, ModelConfig

# the shared data folder, wherever the command runs from (experiments/shared_data.py resolves it)
SHARED_EN = "${HBPE_SHARED_DATA}/en-sotu.jsonl.zst"
SHARED_ZH = "${HBPE_SHARED_DATA}/zh-kernel-docs.jsonl.zst"
SHARED_OPEN_DOCS = "${HBPE_SHARED_DATA}/en-open-docs.jsonl.zst"  # kernel and Python docs, the KJV Bible


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
    lr: float | None = None  # this run's learning rate (default: the spec's io_lr for its io, else its lr)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ConfigError(f"run name {self.name!r}: must be a plain folder name")
        if self.lr is not None and not _positive(self.lr):
            raise ConfigError(f"run {self.name}: lr={self.lr!r}, expected a finite number > 0, e.g. lr: 0.003")
        io = self.model.get("io", "hierarchical")
        if io not in scheme_names():
            raise ConfigError(f"run {self.name}: model.io={io!r}, expected one of {', '.join(scheme_names())}")
        named = "entropy_model" in self.model or "entropy_model" in (self.model.get("patching") or {})  # flat or nested
        if (io == "entropy") != (self.entropy_from is not None or named):
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
    # the learning rate per model kind (io: bpe, hierarchical, ...) for runs that set none of their own, over lr:
    # how a sweep's best values reach other experiments (lr-sweep-mini's table prints the override)
    io_lr: dict[str, float] = field(default_factory=dict)
    warmup: int = 20
    eval_points: int = 5  # held-out evaluations along training: the training curve
    # log-spaced evaluations before the first of eval_points (runner.early_eval_batches): k is read where BPE reaches
    # BPE-patch's BPB, which at k ~ 0.1 is long before the first regular point. Evaluation does not change training,
    # so it is not part of a run's fingerprint: runs with and without them are one result.
    early_eval_points: int = 0
    # the eval set: final_eval_batches blocks of one batch spread over the whole held-out split, the same samples
    # for every run (experiments/eval_noise.py); the final BPB reads all of it, curve points its first
    # eval_batches blocks (spread too; all of it when eval_batches >= final_eval_batches)
    eval_batches: int = 8
    final_eval_batches: int = 40
    plots: tuple[str, ...] = ("curve",)  # curve, vocab, s
    seed: int = 17
    extra: dict[str, Any] = field(default_factory=dict)  # train config overrides for every run
    # constant: linear warm-up then a constant LR, so every curve point is the result of a run of that length
    # (cosine: only the final point is; its curve points sit inside a schedule planned for the whole run)
    schedule: str = "cosine"
    seeds: int = 1  # each run trained with seeds seed, seed+1, ... (init and data order); tables show mean +- std
    # the entropy model's own corpus (the paper's came from other data): the entropy rows then read the entropy
    # model of a copy of their `entropy_from` run trained on these files (runner.py); empty: that run itself
    entropy_corpus: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_values(self)  # types and ranges first: the checks below compare them
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
        first_stages, runs = d.get("first_stages", {}), d.get("runs", ())
        if not isinstance(first_stages, dict) or not all(isinstance(v, dict) for v in first_stages.values()):
            raise ConfigError(
                f"experiment first_stages={first_stages!r}: expected a mapping of names to first stages, "
                "e.g. first_stages={gpt2: {encoding: gpt2}}"
            )
        if not isinstance(runs, (list, tuple)) or not all(isinstance(r, dict) for r in runs):
            raise ConfigError(
                f"experiment runs={runs!r}: expected a list of runs, e.g. runs=[{{name: a, first_stage: gpt2, model: {{}}}}]"
            )
        try:
            return cls(
                **{
                    **d,
                    "first_stages": {k: FirstStageSpec(**v) for k, v in first_stages.items()},
                    "runs": tuple(RunSpec(**r) for r in runs),
                    "train_corpus": _strings(d, "train_corpus", (SHARED_EN,)),
                    "eval_corpus": _strings(d, "eval_corpus", ()),
                    "plots": _strings(d, "plots", ("curve",)),
                    "entropy_corpus": _strings(d, "entropy_corpus", ()),
                }
            )
        except TypeError as e:
            raise ConfigError(f"experiment spec: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def run_lr(self, run: RunSpec) -> float:
        """The learning rate `run` trains with: its own, else io_lr's for its io, else the spec's lr."""
        if run.lr is not None:
            return run.lr
        return self.io_lr.get(run.model.get("io", "hierarchical"), self.lr)

    def run_fingerprint(self, run: RunSpec) -> str:
        """What decides a run's result: its spec, its first stage, the data and the budget (not the other runs)."""
        d = self.to_dict()
        keep = {k: v for k, v in d.items() if k not in ("runs", "first_stages", "name", "description", "plots",
                                                          "early_eval_points")}  # fmt: skip
        if not keep.get("entropy_corpus"):
            keep.pop("entropy_corpus", None)  # unset: the fingerprints of earlier experiments stay what they were
        keep.update(run=asdict(run), first_stage=asdict(self.first_stages[run.first_stage]))
        keep.pop("io_lr", None)
        keep["lr"] = self.run_lr(run)  # the rate it trains with, wherever it was set
        keep["eval_set"] = EVAL_SET  # results evaluated on the split's first batches are not mixed in
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


MAX_SEEDS = 1000  # the noise of a mean over n seeds shrinks as 1/sqrt(n): 1000 puts it at 3% of one seed's
EVAL_SET = "spread-blocks-1"  # how runs are evaluated (eval_noise.py): part of every run's fingerprint

# the budget's integers and their least values; an override arrives as YAML (`seq_len=abc` is a string)
_AT_LEAST = {
    "holdout_every": 2,  # 1 would hold out every document and train on none
    "max_patch_size": 2,  # one byte + EOP
    "seq_len": MIN_SEQ_LEN,  # hbpe convert's least
    "global_batch_size": 1,
    "batches": 1,
    "warmup": 0,
    "eval_points": 1,
    "early_eval_points": 0,
    "eval_batches": 1,
    "final_eval_batches": 1,
    "seed": 0,
    "seeds": 1,
}
# and greatest values, refused here rather than after converting the whole corpus: (value, why)
_AT_MOST = {
    "seq_len": (MODEL_SIZE_LIMITS["max_patches"], "a sample is one latent context: model.max_patches' limit"),
    # each seed trains every run again: 100,000,000 built every seed's configs for minutes before a word
    "seeds": (MAX_SEEDS, "each seed trains every run once more"),
    "seed": (MAX_SEED, "Composer's seeds are numpy's"),
}
_PLOTS = ("curve", "vocab", "s", "crossover", "ladder", "lr")  # ladder: gap and k vs size; lr: BPB vs lr
SCHEDULES = ("cosine", "constant")  # optim.schedule of every run


def _check_values(spec: ExperimentSpec) -> None:
    """Each field of `spec` against its type and range: one ConfigError naming the key, as its override is spelled."""

    def bad(key: str, expected: str) -> ConfigError:
        default = ExperimentSpec.__dataclass_fields__[key].default
        example = f"; e.g. {key}={default}" if isinstance(default, (int, float, str)) else ""
        value = getattr(spec, key)
        shown = list(value) if isinstance(value, tuple) else value  # as the YAML list it was given as
        return ConfigError(f"experiment {key}={shown!r}: expected {expected}{example}")

    for key, least in _AT_LEAST.items():
        value, (most, why) = getattr(spec, key), _AT_MOST.get(key, (None, ""))
        if isinstance(value, bool) or not isinstance(value, int) or value < least or (most and value > most):
            raise bad(key, f"an integer from {least} to {most} ({why})" if most else f"an integer >= {least}")
    if spec.seed + spec.seeds - 1 > MAX_SEED:
        raise bad("seed", f"at most {MAX_SEED - spec.seeds + 1}, so that its seeds={spec.seeds} stay <= {MAX_SEED}")
    if spec.max_patch_size > MAX_PATCH_SIZE_LIMIT:
        raise bad("max_patch_size", f"an integer <= {MAX_PATCH_SIZE_LIMIT}")
    if not _positive(spec.lr):
        raise bad("lr", "a finite number > 0")
    if not isinstance(spec.io_lr, dict) or not all(k in scheme_names() and _positive(v) for k, v in spec.io_lr.items()):
        raise bad("io_lr", f"a mapping of model kinds ({', '.join(scheme_names())}) to learning rates > 0, "
                  "e.g. io_lr={bpe: 0.003, hierarchical: 0.01}")  # fmt: skip
    for key in ("name", "model_size"):
        if not isinstance(getattr(spec, key), str) or not getattr(spec, key):
            raise bad(key, "a non-empty string")
    if not isinstance(spec.description, str):
        raise bad("description", "a string")
    for key in ("train_corpus", "eval_corpus", "plots", "entropy_corpus"):
        value = getattr(spec, key)
        if not isinstance(value, tuple) or not all(isinstance(v, str) and v for v in value):
            raise bad(key, "a list of names")
    if not spec.train_corpus:
        raise bad("train_corpus", "at least one corpus file")
    if spec.entropy_corpus and not any(r.entropy_from for r in spec.runs):
        raise bad("entropy_corpus", "no entropy_corpus: no run has an entropy model (entropy_from) to train on it")
    unknown = [p for p in spec.plots if p not in _PLOTS]
    if unknown:
        raise bad("plots", f"a list of {', '.join(_PLOTS)} (not {', '.join(unknown)})")
    for plot in ("crossover", "ladder"):
        if plot in spec.plots and not {"bpe", "hierarchical"} <= {r.model.get("io") for r in spec.runs}:
            raise bad("plots", f"a BPE run (io=bpe) and a BPE-patch run (io=hierarchical) for the {plot} plot")
    if spec.schedule not in SCHEDULES:
        raise bad("schedule", f"one of {', '.join(SCHEDULES)}")
    if not spec.runs:
        raise bad("runs", "at least one run, e.g. runs=[{name: a, first_stage: gpt2, model: {}}]")
    if not isinstance(spec.extra, dict):
        raise bad("extra", "a mapping of train config overrides, e.g. extra={data: {shuffle: false}}")
    _check_extra(spec.extra)


# the train config keys the experiment sets for every run itself (runner.train_config), and where each comes
# from: in `extra` one would contradict the spec, or train outside --out (save_folder, data.train)
OWNED_KEYS = {
    "run_name": "from its name and the run's",
    "seed": "its key seed (and seeds)",
    "model_size": "its key model_size",
    "model": "each run's model; model.KEY=value sets a key of every run's",
    "data.train": "the shards it makes under --out from --train-input",
    "data.eval": "the shards it makes under --out from --eval-input",
    "data.streams": "the shards it makes under --out from --train-input",
    "data.tokenizer": "its first_stages",
    "data.shuffle_seed": "its key seed (and seeds)",
    "data.max_patch_size": "each run's max_patch_size",
    "data.eval_samples": "one eval set spread over the held-out split, the same for every run",
    "optim.lr": "its key lr",
    "optim.warmup": "its key warmup",
    "optim.schedule": "its key schedule",
    "global_batch_size": "its key global_batch_size",
    "max_duration": "its key batches",
    "eval_interval": "its keys batches and eval_points",
    "eval_subset_num_batches": "its key eval_batches",
    "save_folder": "each run trains in --out/runs/NAME/train",
    "save_interval": "one checkpoint, at the end",
    "save_num_checkpoints_to_keep": "one checkpoint, at the end",
    "save_overwrite": "an interrupted run is trained again",
    "console": "its own progress lines",
}


def _check_extra(extra: dict[str, Any]) -> None:
    """ConfigError naming the first key of `extra` that the experiment sets itself (OWNED_KEYS)."""
    for key, value in extra.items():
        nested = [f"{key}.{k}" for k in value] if isinstance(value, dict) else []
        for owned in (key, *nested):
            if owned in OWNED_KEYS:
                raise ConfigError(
                    f"experiment extra.{owned}: set by the experiment for every run ({OWNED_KEYS[owned]}); "
                    "remove it from extra"
                )


def _positive(x: Any) -> bool:
    """A finite number > 0 (a learning rate), not a bool."""
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _strings(d: dict[str, Any], key: str, default: tuple[str, ...]) -> Any:
    """A list of names from a spec mapping as a tuple (one name alone as a list of one); other values as they are,
    for `_check_values` to name."""
    value = d.get(key, default)
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, (list, tuple)) else value
