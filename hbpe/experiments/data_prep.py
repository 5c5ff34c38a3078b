"""An experiment's data: the held-out split, one tokenizer and one pair of shard sets per first stage.

Everything lands under OUT/data and is reused by a rerun (a finished conversion has its
COMPLETED marker; a tokenizer directory its spec file), so only the first run of an
experiment pays for it, as long as the inputs are the same bytes: OUT/data/inputs.json keeps
the key of the corpora and of each first stage's rank file (inputs.py), and what was made from
inputs that changed since is made again. Each first stage is converted once at the experiment's
S; runs that ask for another S derive it from the `tokens` column at load time.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from hbpe import api
from hbpe.experiments.inputs import combine, content_key, file_key
from hbpe.experiments.shared_data import resolve_shared
from hbpe.experiments.spec import ExperimentSpec, FirstStageSpec
from hbpe.pipeline import storage
from hbpe.pipeline.tokenizer import artifact, first_stage
from hbpe.pipeline.tokenizer.first_stage_train import count_pretokens, train_first_stage, write_encoding
from hbpe.pipeline.tokenizer.stats import read_texts
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.tokenizer_artifact import SPEC_FILENAMES

log = logging.getLogger(__name__)
INPUTS_FILE = "inputs.json"


@dataclass(frozen=True)
class StageData:
    tokenizer: Path
    train: Path
    eval: Path
    inputs: str = ""  # the key of the bytes it was made from (corpora, rank file): part of each run's record
    entropy_train: Path | None = None  # shards of the spec's entropy_corpus (the entropy model's training data)


def corpus_files(spec: ExperimentSpec) -> tuple[list[str], list[str]]:
    """The spec's (training, held-out) corpora with the shared data folder resolved; ConfigError when missing."""
    train = [resolve_shared(p) for p in spec.train_corpus]
    held = [resolve_shared(p, what="the preset's default held-out corpus") for p in spec.eval_corpus]
    for path in (*train, *held):
        if not storage.is_remote(path) and not Path(path).exists():
            raise ConfigError(
                f"corpus {path} does not exist; pass --train-input/--eval-input files (jsonl, jsonl.zst, txt)"
            )
    return train, held


def split_corpus(spec: ExperimentSpec, out: Path) -> tuple[list[str], list[str]]:
    """(train files, eval files): the spec's eval corpus, or every `holdout_every`-th document held out."""
    train_corpus, eval_corpus = corpus_files(spec)
    if eval_corpus:
        return train_corpus, eval_corpus
    folder = out / "corpus"
    train, held = folder / "train.jsonl", folder / "eval.jsonl"
    if not (train.is_file() and held.is_file()):
        texts, rejects = read_texts(train_corpus)
        if rejects:
            log.warning("corpus: %d documents set aside (%s)", sum(rejects.values()), dict(rejects))
        k = spec.holdout_every
        if len(texts) < k:
            raise ConfigError(
                f"the training corpus holds {len(texts)} documents: holding out every {k}th needs at least {k}; "
                f"pass --eval-input, or holdout_every={max(len(texts), 2)}"
            )
        folder.mkdir(parents=True, exist_ok=True)
        for path, keep in ((train, lambda i: i % k != k - 1), (held, lambda i: i % k == k - 1)):
            part = path.with_suffix(".partial")
            with part.open("w", encoding="utf-8") as f:
                for i, t in enumerate(texts):
                    if keep(i):
                        f.write(json.dumps({"id": str(i), "text": t}, ensure_ascii=False) + "\n")
            part.replace(path)
    return [str(train)], [str(held)]


def first_stage_tokenizer(fs: FirstStageSpec, *, max_patch_size: int, train_files: list[str], folder: Path):
    """The tokenizer of one first stage at S, trained in-house on the training split when asked."""

    if fs.encoding is not None:
        enc = first_stage.load_encoding(rank_file_of(fs) or fs.encoding, pattern=fs.pattern)
        return artifact.train_tokenizer(enc, max_patch_size=max_patch_size)

    pattern = first_stage.resolve_pattern(fs.pattern or "gpt2")
    texts, _ = read_texts(train_files)
    ranks = train_first_stage(count_pretokens(texts, pattern), fs.vocab_size)
    rank_file = write_encoding(ranks, folder / f"inhouse-{fs.vocab_size}.tiktoken", pattern=pattern)
    return artifact.train_tokenizer(first_stage.load_encoding(str(rank_file)), max_patch_size=max_patch_size)


def prepare(
    spec: ExperimentSpec, out: Path, *, progress: bool = True, pipeline_args: list[str] | None = None
) -> dict[str, StageData]:
    """Tokenizers and shards for every first stage the runs use; reused when already complete.

    `pipeline_args` go to Beam as `hbpe convert` passes them (default: its local runner).
    """

    used = sorted({r.first_stage for r in spec.runs})
    keys, stale = _input_keys(spec, used, out / "data")
    train_files, eval_files = split_corpus(spec, out / "data")
    data = {}
    for key in used:
        folder = out / "data" / key
        tok_dir = folder / "tokenizer"
        if not any((tok_dir / name).is_file() for name in SPEC_FILENAMES):  # also one written before issue 19
            log.info("first stage %s: training the tokenizer (S=%d)", key, spec.max_patch_size)
            folder.mkdir(parents=True, exist_ok=True)
            tok = first_stage_tokenizer(
                spec.first_stages[key], max_patch_size=spec.max_patch_size, train_files=train_files, folder=folder
            )
            artifact.save(tok, tok_dir)
        shards = {}
        splits = [("train", train_files), ("eval", eval_files)]
        if spec.entropy_corpus:  # every document of it trains the entropy model: none held out
            splits.append(("entropy", [resolve_shared(p) for p in spec.entropy_corpus]))
        for split, files in splits:
            dest = folder / f"shards-{split}"
            if key in stale or not (dest / "COMPLETED").is_file():
                log.info("first stage %s: converting the %s corpus", key, split)
                api.convert(
                    files,
                    dest,
                    tokenizer=tok_dir,
                    seq_len=spec.seq_len,
                    overwrite=dest.exists(),
                    progress=progress,
                    beam_args=list(pipeline_args or []),
                )
            shards[split] = dest
        data[key] = StageData(
            tok_dir, shards["train"], shards["eval"], inputs=keys["stages"][key], entropy_train=shards.get("entropy")
        )
    (out / "data" / INPUTS_FILE).write_text(json.dumps(keys, indent=2, sort_keys=True) + "\n")
    return data


def rank_file_of(fs: FirstStageSpec) -> str | None:
    """The first stage's rank file (shared data folder resolved), or None for a tiktoken name or in-house BPE."""
    if fs.encoding is None:
        return None
    path = resolve_shared(fs.encoding, what="the preset's default rank file")
    return path if storage.is_remote(path) or Path(path).is_file() else None


def _input_keys(spec: ExperimentSpec, used: list[str], folder: Path) -> tuple[dict, set[str]]:
    """({corpus: key, stages: {first stage: key}}, the first stages whose data was made from other bytes).

    What was made from other bytes goes now: the held-out split when the corpus changed, a first
    stage's tokenizer (in-house: trained on the split) when its key did; its shards are converted
    again over the old ones. Data without a record (an older hbpe's) counts as made from other bytes.
    """
    train, held = corpus_files(spec)
    corpus = combine(content_key(train), content_key(held) if held else "")
    if spec.entropy_corpus:  # its shards are made per first stage like the others: a change remakes them
        corpus = combine(corpus, content_key([resolve_shared(p) for p in spec.entropy_corpus]))
    stages = {}
    for key in used:
        fs = spec.first_stages[key]
        rank = rank_file_of(fs)
        stages[key] = combine(corpus, file_key(rank) if rank else "")
    record = folder / INPUTS_FILE
    try:
        before = json.loads(record.read_text()) if record.is_file() else {}
    except (OSError, ValueError):
        before = {}
    before = before if isinstance(before, dict) else {}
    if before.get("corpus") != corpus:
        for name in ("train.jsonl", "eval.jsonl"):
            (folder / "corpus" / name).unlink(missing_ok=True)
    old_stages = before.get("stages") if isinstance(before.get("stages"), dict) else {}
    stale = {key for key in used if old_stages.get(key) != stages[key] and (folder / key).exists()}
    for key in sorted(stale):
        log.info("first stage %s: its inputs changed since its data was made; making it again", key)
        shutil.rmtree(folder / key / "tokenizer", ignore_errors=True)
        for made in (folder / key).glob("inhouse-*"):  # the in-house rank file and its pattern
            made.unlink()
    record.unlink(missing_ok=True)  # written again once everything is made from these bytes
    return {"corpus": corpus, "stages": stages}, stale
