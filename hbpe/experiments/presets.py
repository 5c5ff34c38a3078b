"""The paper's experiments as presets: miniatures that run on 2 CPU cores, and the paper's sizes.

Mini sizes keep the paper's proportions rather than the `tiny` test config: a local width
about 2/3 of the latent's, 3 encoder + 3 decoder layers, a deeper latent (4 layers: the byte-level
row runs its latent over every byte, and 4 layers keep the preset near 30 minutes on 2 cores). With
`tiny` (local = latent width, 1 + 1 local layers) the local models are starved and the
comparison says more about them than about the method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hbpe.experiments.spec import SHARED_EN, SHARED_ZH, ExperimentSpec, FirstStageSpec, RunSpec
from hbpe.schemas.errors import ConfigError
from hbpe.training import load_yaml

MINI = dict(
    latent_layers=4,
    latent_dim=96,
    latent_ffn=256,
    latent_heads=4,
    local_dim=64,
    local_ffn=128,
    local_heads=4,
    encoder_layers=3,
    decoder_layers=3,
)
GPT2 = {"gpt2": FirstStageSpec(encoding="gpt2")}
LLAMA3 = {"llama3": FirstStageSpec(encoding="${HBPE_SHARED_DATA}/ranks/llama3.tiktoken", pattern="llama3")}


def _run(name: str, io: str, fs: str = "gpt2", sizes: dict | None = None, **kw: Any) -> RunSpec:
    model = {**(MINI if sizes is None else sizes), "io": io}
    extra = {k: kw.pop(k) for k in list(kw) if k.startswith("entropy_") and k != "entropy_from"}
    return RunSpec(name=name, first_stage=fs, model={**model, **extra}, **kw)


# The paper-setup presets run the space and entropy rows as the paper did (BLT's code): boundaries given by
# the patcher, and hash n-gram tables in the local encoder. 82,700 rows per n (6 tables x 82,700 x 512 =
# 254.05M parameters) bring those rows to the paper's counts: 97.02M + 254.05M = 351.08M at small (paper:
# 351M), 320.66M + 254.05M = 574.72M at medium (paper: 575M); the 254M gap is the same at both sizes, since
# the local width (512) is. The entropy thresholds target the paper's mean patch lengths: 3.45 bytes bounded
# (max 6), 4.49 unbounded. The mini presets keep their published setup (EOP, no hash tables, 4.0 / 4.5).
PAPER_HASH_BUCKETS = 82_700
PAPER_BYTE_SETUP = dict(patch_boundaries="given", hash_ngram_buckets=PAPER_HASH_BUCKETS)
PAPER_ENTROPY_TARGETS = (3.45, 4.49)  # bounded, unbounded
MINI_ENTROPY_TARGETS = (4.0, 4.5)


def _six_rows(fs: str, sizes: dict | None = None, *, paper_setup: bool = False) -> tuple[RunSpec, ...]:
    """Table 1's rows; `bytes` first: its final checkpoint is the entropy model of the entropy rows."""
    setup = PAPER_BYTE_SETUP if paper_setup else {}
    bounded, unbounded = PAPER_ENTROPY_TARGETS if paper_setup else MINI_ENTROPY_TARGETS
    sizes = {**(MINI if sizes is None else sizes)}
    byte_sizes = {**sizes, **setup}
    return (
        _run("bytes", "bytes", fs, sizes),
        _run("entropy-max6", "entropy", fs, byte_sizes, entropy_from="bytes", entropy_target_bytes=bounded),
        _run(
            "entropy-unbounded",
            "entropy",
            fs,
            byte_sizes,
            entropy_from="bytes",
            entropy_target_bytes=unbounded,
            entropy_bounded=False,
        ),  # fmt: skip
        _run("space-max6", "space", fs, byte_sizes),
        _run("bpe", "bpe", fs, sizes),
        _run("bpe-patch", "hierarchical", fs, sizes),
    )


def table1_mini(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    return ExperimentSpec(
        name="table1-mini",
        description="The paper's Table 1 rows at mini size on one set of shards (gpt2 first stage, S=10)",
        first_stages=GPT2,
        runs=_six_rows("gpt2"),
        train_corpus=train_corpus or (SHARED_EN,),
        eval_corpus=eval_corpus,
        batches=200,
        eval_points=5,
        plots=("curve",),
    )


def chinese_mini(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    rows = {r.name: r for r in _six_rows("llama3")}
    return ExperimentSpec(
        name="chinese-mini",
        description="Space, entropy and BPE-patch on Chinese text with LLaMA-3's first stage (the paper's Chinese table)",
        first_stages=LLAMA3,
        runs=(rows["bytes"], rows["entropy-max6"], rows["space-max6"], rows["bpe-patch"]),
        train_corpus=train_corpus or (SHARED_ZH,),
        eval_corpus=eval_corpus,
        batches=160,
        eval_points=4,
    )


VOCAB_MINI_SIZES = (1024, 4096, 16384)


def vocab_mini(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    stages = {f"v{v}": FirstStageSpec(vocab_size=v, pattern="gpt2") for v in VOCAB_MINI_SIZES}
    runs = tuple(
        _run(f"{kind}-v{v}", io, f"v{v}")
        for v in VOCAB_MINI_SIZES
        for kind, io in (("bpe", "bpe"), ("bpe-patch", "hierarchical"))
    )
    return ExperimentSpec(
        name="vocab-mini",
        description="BPE vs BPE-patch over in-house first stages of three vocabulary sizes (the paper's 50K/200K/500K, scaled down)",
        first_stages=stages,
        runs=runs,
        train_corpus=train_corpus or (SHARED_EN,),
        eval_corpus=eval_corpus,
        batches=160,
        eval_points=4,
        plots=("curve", "vocab"),
    )


S_ABLATION = (4, 6, 8, 10)


def s_ablation_mini(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    runs = tuple(_run(f"bpe-patch-s{s}", "hierarchical", max_patch_size=s) for s in S_ABLATION)
    return ExperimentSpec(
        name="s-ablation-mini",
        description="BPE-patch with S in {4, 6, 8, 10} from one set of shards (S=10), patches derived at load time",
        first_stages=GPT2,
        runs=runs,
        train_corpus=train_corpus or (SHARED_EN,),
        eval_corpus=eval_corpus,
        batches=160,
        eval_points=4,
        plots=("curve", "s"),
    )


CROSSOVER_VOCAB = 4096


def crossover_mini(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    """Does the gap between BPE and BPE-patch close with data? Curves long enough to fit its trend.

    An in-house 4K first stage trained on the en-sotu split: its embedding (4,098 x 96 = 0.39M)
    is 0.89 of the 0.44M latent, where gpt2's 50K at mini width would be 11x the latent (the
    paper's small model: 38.6M against 85M, 0.45), at 4.5 bytes per token (the paper's 4.1).
    The mini latent and local sizes, the constant schedule (every curve point a valid budget),
    3 seeds, 20 curve points. 1,200 batches of 8 x 128 tokens = 1.2M tokens, about 5.3 MB of
    text (4.3 bytes per token on this split): 0.55 of a pass over the 9.7 MB training split.
    1,200 rather than a full pass (2,000) for the wall time: measured on 2 shared cores with one
    torch thread (OMP_NUM_THREADS=1; two threads on busy cores ran 2.5-14x slower), BPE takes
    0.23 s and BPE-patch 0.99 s per batch, evaluations included: 3 x 1,200 x 1.22 s = 73
    minutes, against 2 hours for 2,000. The fit's range in decades of bytes does not depend on
    the length (it skips the first 20% of every run); `batches=2000` restores the full pass.
    """
    fs = f"v{CROSSOVER_VOCAB}"
    return ExperimentSpec(
        name="crossover-mini",
        description=f"BPE vs BPE-patch over one pass of the data (in-house {CROSSOVER_VOCAB // 1024}K first stage)",
        first_stages={fs: FirstStageSpec(vocab_size=CROSSOVER_VOCAB, pattern="gpt2")},
        runs=(_run("bpe", "bpe", fs), _run("bpe-patch", "hierarchical", fs)),
        train_corpus=train_corpus or (SHARED_EN,),
        eval_corpus=eval_corpus,
        batches=1200,
        schedule="constant",
        seeds=3,
        eval_points=20,
        eval_batches=4,
        final_eval_batches=40,
        plots=("curve", "crossover"),
    )


# the paper's medium models are trained on 15B tokens (its Table 3): at 256 x 2,048 = 524,288 tokens per batch
# that is ceil(15e9 / 524,288) = 28,611 batches (15.0004B tokens); 13.5K batches, Table 1's small runs, give 7.1B
MEDIUM_BATCHES = 28_611


def _paper(
    name: str, size: str, lr: float, description: str, *, batches: int = 13_500, eval_points: int = 27
) -> Callable[..., ExperimentSpec]:
    def build(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
        if not train_corpus:
            raise ConfigError(f"{name} is the paper's scale: pass --train-input (e.g. SlimPajama jsonl.zst files)")
        return ExperimentSpec(
            name=name,
            description=description,
            first_stages=GPT2,
            runs=_six_rows("gpt2", sizes={}, paper_setup=True),
            train_corpus=train_corpus,
            eval_corpus=eval_corpus,
            model_size=size,
            seq_len=2048,  # ~8,192 bytes at gpt2's ~4 bytes per token, the paper's context
            global_batch_size=256,
            batches=batches,
            lr=lr,
            warmup=500,
            eval_points=eval_points,  # one every ~500 batches
            eval_batches=20,
            final_eval_batches=200,
            extra={"fsdp": {"version": 2}, "data": {"num_workers": 4}},
        )

    return build


PRESETS: dict[str, Callable[..., ExperimentSpec]] = {
    "table1-mini": table1_mini,
    "chinese-mini": chinese_mini,
    "vocab-mini": vocab_mini,
    "s-ablation-mini": s_ablation_mini,
    "crossover-mini": crossover_mini,
    # the paper's sizes and steps, for a GPU cluster (documented; not run here)
    "table1-small": _paper(
        "table1-small", "small", 4e-4, "Table 1 at the paper's small size (123M-class), 13.5K steps"
    ),
    "table3-medium": _paper(
        "table3-medium",
        "medium",
        6e-4,
        "The paper's medium models (359M-class) for Table 3, 15B tokens",
        batches=MEDIUM_BATCHES,
        eval_points=57,
    ),
}


def preset(name: str, *, train_corpus: tuple[str, ...] = (), eval_corpus: tuple[str, ...] = ()) -> ExperimentSpec:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)} (or a YAML file)")
    return PRESETS[name](tuple(train_corpus), tuple(eval_corpus))


def load_spec(
    name_or_file: str, overrides: list[str] | tuple[str, ...] = (), *, train_corpus=(), eval_corpus=()
) -> ExperimentSpec:
    """A preset name or a YAML file, with `key=value` overrides of the spec (`model.KEY=value`: every run's model)."""
    import dataclasses
    from pathlib import Path

    import yaml

    if name_or_file.endswith((".yaml", ".yml")) or Path(name_or_file).is_file():
        path = Path(name_or_file)
        if not path.is_file():
            raise ConfigError(
                f"experiment file {path} does not exist; pass a preset ({', '.join(PRESETS)}) or a YAML file"
            )
        try:
            d = load_yaml(path.read_text(encoding="utf-8"), str(path))  # aliases bounded (config_io.py)
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not a readable YAML experiment ({type(e).__name__}); fix the file") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{path}: an experiment is a mapping of keys (name, first_stages, runs, ...)")
        if train_corpus:
            d["train_corpus"] = list(train_corpus)
        if eval_corpus:
            d["eval_corpus"] = list(eval_corpus)
        spec = ExperimentSpec.from_dict(d)
    else:
        spec = preset(name_or_file, train_corpus=tuple(train_corpus), eval_corpus=tuple(eval_corpus))
    top, model = {}, {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. batches=100 or model.latent_layers=4")
        value = load_yaml(raw, f"override {item!r}") if raw else ""
        if key.startswith("model."):
            model[key[len("model.") :]] = value
        else:
            top[key] = value
    if model:  # onto the runs given as an override too
        runs = top.get("runs", [dataclasses.asdict(r) for r in spec.runs])
        if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
            raise ConfigError(
                "override runs=...: expected a list of runs, e.g. runs=[{name: a, first_stage: gpt2, model: {}}]"
            )
        top["runs"] = [r | {"model": {**r.get("model", {}), **model}} for r in runs]
    if not top:
        return spec
    d = spec.to_dict()
    d.update(top)
    return ExperimentSpec.from_dict(d)
