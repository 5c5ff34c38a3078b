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

from hbpe.experiments.spec import SHARED_EN, SHARED_OPEN_DOCS, SHARED_ZH, ExperimentSpec, FirstStageSpec, RunSpec
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
# One training objective and one weight-decay rule for every scheme (issue 29): the loss is the NLL per byte of
# text (a per-symbol mean weighs a BPE token and a BPE-patch symbol alike, and gradient clipping then acts on
# different scales), and every matrix decays, embedding tables and output heads included (with embeddings exempt,
# BPE's tied table, half of a mini BPE model, was never decayed while BPE-patch's untied head was).
FAIR_TRAINING = {"optim": {"loss_normalization": "byte", "decay_embeddings": True}}
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
        extra=FAIR_TRAINING,
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
        extra=FAIR_TRAINING,
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
        extra=FAIR_TRAINING,
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
        extra=FAIR_TRAINING,
    )


CROSSOVER_VOCAB = 4096


def crossover_mini(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    """Does the gap between BPE and BPE-patch close with data? Curves long enough to fit its trend.

    An in-house 4K first stage trained on the en-sotu split: its embedding (4,098 x 96 = 0.39M)
    is 0.89 of the 0.44M latent, where gpt2's 50K at mini width would be 11x the latent (the
    paper's small model: 38.6M against 85M, 0.45), at 4.5 bytes per token (the paper's 4.1).
    The mini latent and local sizes, the constant schedule (every curve point a valid budget),
    3 seeds, 20 curve points, every one and the final BPB on one eval set of 40 blocks of 8
    samples (about 176 KB) spread over the whole held-out split (eval_noise.py), the fair
    objective and decay (FAIR_TRAINING). 1,200 batches of 8 x 128 tokens = 1.2M tokens, about
    5.3 MB of text (4.3 bytes per token on this split): 0.55 of a pass over the 9.7 MB training
    split. 1,200 rather than a full pass (2,150) for the wall time: measured on 2 shared cores
    with one torch thread (OMP_NUM_THREADS=1; two threads on busy cores ran 2.5-14x slower), BPE
    takes 0.19 s and BPE-patch 0.91 s per training batch (31 and 22 executed GFLOP/s); an eval
    batch costs about a third of a training batch, so the 21 evaluations of 40 blocks add 0.28 s
    per training batch: 3 x 1,200 x (1.10 + 0.28) s = about 81 minutes. The fit's range in
    decades of bytes does not depend on the length (it skips the first 20% of every run);
    `batches=2150` gives 0.98 of a pass.
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
        eval_batches=40,  # the curve points read the whole eval set too: one set for every number
        final_eval_batches=40,
        plots=("curve", "crossover"),
        extra=FAIR_TRAINING,
    )


# The ladders (issue 29): how the gap and the data factor k (crossover.py) move with size, data and S. Each pairs
# BPE and BPE-patch runs of one width (report.crossover_pairs), on crossover-mini's in-house 4K first stage, with
# its constant schedule, 2 or more seeds, the fair objective and decay, and an eval set of 24 blocks (about 106 KB)
# spread over the held-out split that every curve point reads too. The learning rate is 3e-3 for every run unless
# `io_lr=...` passes lr-sweep-mini's best per model (its table prints the override).
#
# Wall-time estimates (one torch thread per run on this 2-core machine, two experiments at a time, as measured for
# crossover-mini): executed training FLOPs at 31 GFLOP/s for BPE and 22 for BPE-patch, an eval batch a third of a
# training batch. Small widths may run below these rates (per-operation overhead), wide ones above.
LADDER_EVAL_BLOCKS = 24
FULL_PASS = 2150  # batches of 8 x 128 tokens: 0.98 of a pass over en-sotu's 9.7 MB training split (2.2M tokens)


def scaled(f: float, *, latent_layers: int = 4) -> dict[str, int]:
    """The mini's shape at f times its widths (latent 96, FFN 256; local 64, FFN 128), 4 heads, 3 + 3 local layers."""
    return {**MINI, "latent_layers": latent_layers, "latent_dim": round(96 * f), "latent_ffn": round(256 * f),
            "local_dim": round(64 * f), "local_ffn": round(128 * f)}  # fmt: skip


# the paper's proportions at mini width: 8 latent layers (0.88M), so the 4K embedding (4,098 x 96) is 0.44 of the
# latent (the paper's small model: 0.45), and local models of width 48 / FFN 96, 0.2 of the latent
PAPER_MINI = {**scaled(1, latent_layers=8), "local_dim": 48, "local_ffn": 96}
WIDTHS = (0.5, 1, 2, 4)


def _pair(suffix: str, fs: str, sizes: dict[str, int]) -> tuple[RunSpec, RunSpec]:
    return _run(f"bpe{suffix}", "bpe", fs, sizes), _run(f"bpe-patch{suffix}", "hierarchical", fs, sizes)


def _ladder(name: str, description: str, runs: tuple[RunSpec, ...], train_corpus: tuple[str, ...],
            eval_corpus: tuple[str, ...], **budget: Any) -> ExperimentSpec:  # fmt: skip
    fs = f"v{CROSSOVER_VOCAB}"
    blocks = budget.pop("eval_blocks", LADDER_EVAL_BLOCKS)
    return ExperimentSpec(
        name=name,
        description=description,
        first_stages={fs: FirstStageSpec(vocab_size=CROSSOVER_VOCAB, pattern="gpt2")},
        runs=runs,
        train_corpus=train_corpus or (SHARED_EN,),
        eval_corpus=eval_corpus,
        schedule="constant",
        eval_batches=blocks,  # every curve point reads the whole eval set, as the final BPB
        final_eval_batches=blocks,
        extra=FAIR_TRAINING,
        **{"seeds": 2, "plots": ("curve", "crossover", "ladder"), **budget},
    )


def ladder_paper_mini(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    """BPE vs BPE-patch at the paper's proportions in miniature, over a full pass of the data.

    PAPER_MINI: embedding / latent 0.44 (paper 0.45), local models / latent 0.20, 1.28M (BPE) and 1.06M
    (BPE-patch) parameters. 2,150 batches (0.98 of a pass, 2.2M tokens), 2 seeds, 20 curve points.
    Estimate: 9.0 and 16.4 executed GFLOPs per batch = 0.29 + 0.75 s, evaluations included about 40 minutes a
    seed, 80 minutes in all (`seeds=3`: 2 hours).
    """
    fs = f"v{CROSSOVER_VOCAB}"
    return _ladder("ladder-paper-mini", "BPE vs BPE-patch at the paper's proportions (8 latent layers, local width "
                   "48), one pass", _pair("", fs, PAPER_MINI), train_corpus, eval_corpus, batches=FULL_PASS,
                   eval_points=20)  # fmt: skip


def ladder_width(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    """A capacity ladder at fixed data: the mini at x0.5, x1, x2 and x4 widths, BPE and BPE-patch at each.

    0.31 / 0.84 / 2.56 / 8.66M parameters (BPE) and 0.20 / 0.74 / 2.88 / 11.37M (BPE-patch), every run 160
    batches (164K tokens, 0.7 MB, as vocab-mini: 0.8 to 0.014 tokens per parameter), 2 seeds, 4 curve points.
    The gap is reported at equal width (each pair) and best against best (ladder.py). Estimate: 2.2 + 5.6,
    5.7 + 20, 17 + 76 and 55 + 293 executed GFLOPs per batch (BPE + BPE-patch), the x4 BPE-patch 13 s a batch
    at 22 GFLOP/s: about 64 minutes a seed, 2.1 hours in all, two thirds of it the x4 pair.
    """
    fs = f"v{CROSSOVER_VOCAB}"
    runs = tuple(r for f in WIDTHS for r in _pair(f"-x{f:g}", fs, scaled(f)))
    return _ladder("ladder-width", "BPE vs BPE-patch at four widths of the mini (x0.5 to x4), fixed data", runs,
                   train_corpus, eval_corpus, batches=160, eval_points=4, eval_blocks=16)  # fmt: skip


def ladder_data(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    """The mini at x0.5 width over a full pass: 7 (BPE, 0.31M) to 11 (BPE-patch, 0.20M) tokens per parameter.

    2,150 batches (0.98 of a pass), 3 seeds, 20 curve points: the gap and k along tokens per parameter up to where
    the small models are near their data-limited loss. Estimate: 2.2 + 5.6 executed GFLOPs per batch, about 13
    minutes a seed, 40 minutes in all (up to twice that if the small matrices run below the measured rates).
    """
    fs = f"v{CROSSOVER_VOCAB}"
    return _ladder("ladder-data", "BPE vs BPE-patch at half the mini's width over a full pass (7-11 tokens per "
                   "parameter)", _pair("-x0.5", fs, scaled(0.5)), train_corpus, eval_corpus, batches=FULL_PASS,
                   eval_points=20, seeds=3)  # fmt: skip


LADDER_S = (4, 6, 10)


def ladder_s(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    """BPE-patch at S = 4, 6 and 10 on the 4K first stage (V' = 810, 464, 299), each against one BPE run.

    One set of shards at S=10; S=4 and 6 derived at load time. 1,200 batches (crossover-mini's data), 2 seeds,
    10 curve points. Estimate: 5.7 (BPE), 10.7, 13.6 and 20.0 executed GFLOPs per batch (BPE-patch at S=4, 6,
    10: its local models run S positions per patch), about 48 minutes a seed, 95 minutes in all.
    """
    fs = f"v{CROSSOVER_VOCAB}"
    runs = (_run("bpe", "bpe", fs),) + tuple(
        _run(f"bpe-patch-s{s}", "hierarchical", fs, max_patch_size=s) for s in LADDER_S
    )
    return _ladder("ladder-s", "BPE vs BPE-patch at S = 4, 6, 10 (in-house 4K first stage)", runs, train_corpus,
                   eval_corpus, batches=1200, eval_points=10, plots=("curve", "crossover", "ladder", "s"))  # fmt: skip


LR_SWEEP = (1e-3, 3e-3, 1e-2)


def lr_sweep_mini(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    """BPE and BPE-patch (mini) at lr 1e-3, 3e-3 and 1e-2, 400 batches, 2 seeds: the best rate per model.

    The table ends with the override that passes the best rate per model to the ladders
    (`io_lr={bpe: ..., hierarchical: ...}`); they are chosen at the mini's width, so at x4 they may be high.
    Estimate: 6 runs of 400 x (0.19 or 0.91) s, about 24 minutes a seed, 47 minutes in all.
    """
    fs = f"v{CROSSOVER_VOCAB}"
    runs = tuple(
        _run(f"{name}-lr{lr:g}", io, fs, lr=lr) for name, io in (("bpe", "bpe"), ("bpe-patch", "hierarchical"))
        for lr in LR_SWEEP
    )  # fmt: skip
    return _ladder("lr-sweep-mini", "BPE and BPE-patch (mini) at three learning rates", runs, train_corpus,
                   eval_corpus, batches=400, eval_points=5, eval_blocks=16, plots=("curve", "lr"))  # fmt: skip


# the rates lr-sweep-mini chose at the mini's width (x1), the centre of lr-sweep-width's sweep at every width
SWEPT_IO_LR = {"bpe": 3e-3, "hierarchical": 1e-3}
SWEPT_FLANKS = {"bpe": (3e-4, 1e-3, 1e-2), "hierarchical": (3e-4, 3e-3, 1e-2)}  # with the centre: 3e-4 to 1e-2 for both


def lr_sweep_width(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    """ladder-width's learning rates tuned at each width: every model at 3e-4, 1e-3, 3e-3 and 1e-2.

    The centre runs are ladder-width's own (same names, rate and budget: a copy of its seed-17 results is
    recognised and not trained again); the others add BPE at 3e-4, 1e-3 and 1e-2 and BPE-patch at 3e-4, 3e-3
    and 1e-2. 160 batches, 1 seed (`seeds=2` doubles it), 4 curve points. The table gives the best rate per
    model and width and the gap between the tuned models at each width. Estimate: 24 new runs, about 90 minutes
    at two experiments on the 2-core machine, two thirds of it the x4 BPE-patch runs.
    """
    fs = f"v{CROSSOVER_VOCAB}"
    runs: list[RunSpec] = []
    for f in WIDTHS:
        for name, io in (("bpe", "bpe"), ("bpe-patch", "hierarchical")):
            runs.append(_run(f"{name}-x{f:g}", io, fs, scaled(f)))
            for lr in SWEPT_FLANKS[io]:
                runs.append(_run(f"{name}-x{f:g}-lr{lr:g}", io, fs, scaled(f), lr=lr))
    return _ladder("lr-sweep-width", "ladder-width's models at three learning rates per width", tuple(runs),
                   train_corpus, eval_corpus, batches=160, eval_points=4, eval_blocks=16, seeds=1,
                   io_lr=dict(SWEPT_IO_LR), plots=("curve", "lr"))  # fmt: skip


# k along one long run: does BPE-patch's data factor k rise toward 1 as tokens per parameter grow at a
# fixed model (under-training), or stay flat or fall (structural at this size)? ladder-data's x0.5 pair (BPE 0.31M,
# BPE-patch 0.20M parameters) on fresh text: en-sotu + en-open-docs (34 MB; kernel and Python documentation, the KJV
# Bible), every 20th document held out (the documents lie grouped by source in file order, so the held-out split is
# a systematic sample stratified by source: 133 documents, 1.5 MB), the 4K first stage trained on the training split
# (3.54 bytes per token). 7,650 batches of 8 x 128 tokens = 7.83M tokens: 40.1 tokens per BPE-patch parameter (25.4
# per BPE parameter), 0.85 of a pass over the 32.7 MB training split (9.24M tokens). Constant rate (every curve point
# a valid budget, none annealed), 40 curve points on an eval set of 58 blocks of 8 samples (about 210 KB) spread over
# the held-out split, each
# point storing its per-block NLL (runner.EvalCurve) so k, its slope and the gap get document-bootstrap intervals
# (k_along.py). 8 more points spaced in log before the first (batches 20 to 179): at k ~ 0.1 BPE reaches BPE-patch's
# BPB of batch 382 (2 tokens per parameter) near batch 40. Both at ladder-data's 3e-3; k-along-training-lr checks
# 1e-2 on a shorter budget.
K_ALONG_BATCHES = 7650
K_ALONG_CORPUS = (SHARED_EN, SHARED_OPEN_DOCS)
K_ALONG_BUDGET = dict(holdout_every=20, eval_points=40, eval_blocks=58, early_eval_points=8)


def k_along_training(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    """ladder-data's x0.5 pair over 40 tokens per BPE-patch parameter of fresh text, 40 curve points.

    Estimate (one torch thread, measured rates of ladder-data: BPE 25-40 KB/s, BPE-patch 6-19 KB/s on shared
    cores): 33 MB of training text, 15-25 minutes for BPE and 30-90 for BPE-patch a seed, evaluations included.
    """
    fs = f"v{CROSSOVER_VOCAB}"
    return _ladder("k-along-training", "BPE vs BPE-patch (x0.5) to 40 tokens per BPE-patch parameter: k along "
                   "training", _pair("-x0.5", fs, scaled(0.5)), train_corpus or K_ALONG_CORPUS, eval_corpus,
                   batches=K_ALONG_BATCHES, seeds=1, **K_ALONG_BUDGET)  # fmt: skip


K_ALONG_RATE_CHECK = 2870  # batches: 15 tokens per BPE-patch parameter (195,120 x 15 / 1,024)
K_ALONG_RATES = (1e-2, 1e-3)  # either side of the main runs' 3e-3


def k_along_training_lr(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    """k-along-training's pair at 1e-2 and 1e-3 to 15 tokens per BPE-patch parameter: is 3e-3 the better rate there?

    The same data, eval set and curve-point spacing (every 191 batches, as k-along-training's), so the two rates are
    compared at the same training bytes (k_along.py). Estimate: 6-35 minutes.
    """
    fs = f"v{CROSSOVER_VOCAB}"
    runs = tuple(
        _run(f"{r.name}-lr{lr:g}", r.model["io"], fs, scaled(0.5), lr=lr)
        for lr in K_ALONG_RATES
        for r in _pair("-x0.5", fs, {})
    )
    budget = {**K_ALONG_BUDGET, "eval_points": K_ALONG_RATE_CHECK // (K_ALONG_BATCHES // 40)}
    return _ladder("k-along-training-lr", "k-along-training's pair at lr 1e-2 and 1e-3 to 15 tokens per BPE-patch parameter",
                   runs, train_corpus or K_ALONG_CORPUS, eval_corpus, batches=K_ALONG_RATE_CHECK, seeds=1,
                   **budget)  # fmt: skip


# ladder-gpu: four sizes on one GPU, through `hbpe experiment` (so a machine with the full stack: Composer,
# streaming, Beam; infra/gpu/ holds the plain-PyTorch route for an image without them). Measured on an H100 (bf16,
# the model's training step alone with AdamW and clipping, batch 32 x 128, a symbol in every one of the S positions
# of every patch, 2026-11-27): BPE 17, 18, 20, 23 ms and BPE-patch 48, 56, 57, 58 ms per step at x1, x2, x3, x5 (1.4 to 31 TFLOP/s:
# these sizes are bound by per-kernel overhead, not FLOPs; 5.5 PFLOPs for all eight runs at 1,600 steps would be
# a minute at 100 TFLOP/s), 298 ms per step of all eight. 1,600 steps would be 8.0 minutes of steps alone; 1,000
# steps are 5.0, plus about a minute of data (the 4K first stage takes 11 s, then the Beam conversion), and
# Composer, start-ups and 9 evaluations of 16 blocks (6-23 ms a block): about 7-7.5 minutes in all. Data: en-sotu
# is the corpus that ships (/work/shared/data), 2.2M tokens a pass; 1,000 x 32 x 128 = 4.1M tokens is 1.9 passes,
# and that is its ceiling: more steps repeat the same text again (held-out BPB then measures memorisation too).
GPU_WIDTHS = (1, 2, 3, 5)  # BPE 0.84 / 2.56 / 5.16 / 13.0M, BPE-patch 0.74 / 2.88 / 6.42 / 17.7M parameters


def ladder_gpu(train_corpus: tuple[str, ...], eval_corpus: tuple[str, ...]) -> ExperimentSpec:
    """BPE vs BPE-patch at four sizes up to 17.7M parameters on one GPU in under 8 minutes (see above): x1, x2,
    x3 and x5 of the mini, 1,000 steps of 32 x 128 tokens, 1 seed (`seeds=2` doubles the time), 8 curve points."""
    fs = f"v{CROSSOVER_VOCAB}"
    runs = tuple(r for f in GPU_WIDTHS for r in _pair(f"-x{f:g}", fs, scaled(f)))
    return _ladder("ladder-gpu", "BPE vs BPE-patch at four sizes up to 18M parameters, on one GPU", runs,
                   train_corpus, eval_corpus, batches=1000, global_batch_size=32, warmup=100, eval_points=8,
                   eval_blocks=16, seeds=1)  # fmt: skip


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
            extra={**FAIR_TRAINING, "fsdp": {"version": 2}, "data": {"num_workers": 4}},
        )

    return build


PRESETS: dict[str, Callable[..., ExperimentSpec]] = {
    "table1-mini": table1_mini,
    "chinese-mini": chinese_mini,
    "vocab-mini": vocab_mini,
    "s-ablation-mini": s_ablation_mini,
    "crossover-mini": crossover_mini,
    "ladder-paper-mini": ladder_paper_mini,
    "ladder-width": ladder_width,
    "ladder-data": ladder_data,
    "ladder-s": ladder_s,
    "lr-sweep-mini": lr_sweep_mini,
    "lr-sweep-width": lr_sweep_width,
    "k-along-training": k_along_training,
    "k-along-training-lr": k_along_training_lr,
    "ladder-gpu": ladder_gpu,  # one GPU, under 8 minutes
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


def describe_presets() -> dict[str, str]:
    """Each preset's name -> the first line of its description (`hbpe experiment list`)."""
    # the paper-scale presets need a training corpus to be built: a placeholder, never read
    specs = {name: build(("CORPUS.jsonl",), ()) for name, build in PRESETS.items()}
    return {name: spec.description.strip().splitlines()[0] for name, spec in specs.items()}


def load_spec(
    name_or_file: str,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    train_corpus=(),
    eval_corpus=(),
    entropy_corpus=(),
) -> ExperimentSpec:
    """A preset name or a YAML file, with `key=value` overrides of the spec (`model.KEY=value`: every run's model);
    `entropy_corpus` (files), when given, replaces the spec's, after the overrides."""
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
    if entropy_corpus:
        top["entropy_corpus"] = list(entropy_corpus)
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


def only_runs(spec: ExperimentSpec, names: tuple[str, ...] | list[str]) -> ExperimentSpec:
    """`spec` with only the named runs (and the bytes runs their entropy rows read); ConfigError naming an unknown one.

    A run's result does not depend on the other runs of its spec (spec.run_fingerprint), so runs trained apart
    (`hbpe experiment ... --only NAME`, each in its own --out) can be gathered into one folder and reported together.
    """
    import dataclasses

    known = {r.name for r in spec.runs}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"--only {', '.join(unknown)}: not a run of {spec.name}; its runs: {', '.join(known)}")
    wanted = set(names) | {r.entropy_from for r in spec.runs if r.name in names and r.entropy_from}
    runs = tuple(r for r in spec.runs if r.name in wanted)
    both = {"bpe", "hierarchical"} <= {r.model.get("io") for r in runs}
    plots = tuple(p for p in spec.plots if both or p not in ("crossover", "ladder"))  # those need a pair
    return dataclasses.replace(spec, runs=runs, plots=plots)
