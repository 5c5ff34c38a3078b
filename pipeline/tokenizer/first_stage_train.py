r"""Train a first-stage byte-level BPE in-house, written as a tiktoken rank file.

The paper's vocabulary ablation needs 50K/200K/500K-token first stages. Words are
the split pattern's pieces (cl100k's pattern by default), weighted by corpus
count; merges use the same incremental engine as the second stage. Ranks are
byte strings (tiktoken's model), so a merge whose bytes already exist reuses that
token instead of adding a duplicate.

Two trainers learn the same ranks from the same word counts (`hbpe bench first-stage`
compares them): `hbpe`, the pure-Python incremental loop, and `hf`, HuggingFace
`tokenizers`' Rust BpeTrainer fed those counts. HF's trainer has the same rules (most
frequent pair, ties to the smallest (left, right) id pair, a merge that rebuilds an
existing token reuses it, stop at `min_count` or the vocabulary size); what makes its
ids equal ours is the alphabet: byte b is the character U+0100+b, so HF's alphabet,
sorted by code point, gives byte b the id b and ties break on the same ids.
HF is fed our word counts, not the text: its Split(Regex) runs Oniguruma, which reads
cl100k's `\p{N}{1,3}+` as a repeated group ("1947" one piece, not "194" + "7").
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath

import regex

from hbpe.pipeline import storage
from hbpe.pipeline.tokenizer.first_stage import DEFAULT_SPECIAL_TOKEN, format_rank_file, resolve_pattern
from hbpe.pipeline.tokenizer.pair_merges import learn_merges
from hbpe.schemas.errors import ConfigError


def count_pretokens(texts: Iterable[str], pattern: str) -> Counter[bytes]:
    """How often each pre-token (a match of the split pattern, as UTF-8) occurs: BPE's training input.

    Not `count_words` (whitespace-separated words, fertility's denominator): the pattern splits
    "hello, world" into "hello", ",", " world".
    """
    pat = regex.compile(resolve_pattern(pattern))
    words: Counter[bytes] = Counter()
    for text in texts:
        words.update(m.encode("utf-8") for m in pat.findall(text))
    return words


def train_ranks(
    words: Counter[bytes], vocab_size: int, *, min_count: int = 2, on_merge: Callable[[int], None] | None = None
) -> dict[bytes, int]:
    """Ranks (token bytes -> id) of a BPE with at most `vocab_size` tokens, 256 single bytes first."""
    if vocab_size < 256:
        raise ConfigError(f"vocab_size must be >= 256 (all single bytes), got {vocab_size}")
    id_bytes = [bytes([b]) for b in range(256)]
    ranks = {b: i for i, b in enumerate(id_bytes)}

    def next_id(pair: tuple[int, int]) -> int:
        merged = id_bytes[pair[0]] + id_bytes[pair[1]]
        if merged not in ranks:
            ranks[merged] = len(id_bytes)
            id_bytes.append(merged)
        return ranks[merged]

    ordered = sorted(words.items())  # deterministic, whatever the Counter's insertion order
    learn_merges(
        [list(w) for w, _ in ordered],
        [c for _, c in ordered],
        next_id=next_id,
        is_active=lambda s: len(s) > 1,
        min_count=min_count,
        stop=lambda: len(id_bytes) >= vocab_size,
        on_merge=on_merge,
    )
    return ranks


FIRST_STAGE_TRAINERS = ("hbpe", "hf")
# hf: the same ranks byte for byte, and 3.5-7x faster where long pre-tokens make merges dominate
# (zh-kernel-docs, en-sotu + zh); on en-sotu alone both take under 1.7 s (`hbpe bench first-stage`)
DEFAULT_FIRST_STAGE_TRAINER = "hf"
_HF_BYTE_BASE = 0x100  # U+0100..U+01FF: 256 letters, no whitespace, NFC-stable, in byte order
_HF_CHUNK = 4096  # repetitions of one word per string handed to HF (bounds one string's size)


def train_ranks_hf(words: Counter[bytes], vocab_size: int, *, min_count: int = 2) -> dict[bytes, int]:
    """The ranks `train_ranks` learns, computed by HF `tokenizers`' Rust BpeTrainer on the same word counts.

    HF's trainer only counts what it is fed, so each word is fed `count` times (whitespace-separated,
    split back by WhitespaceSplit): about as many strings as the corpus has pre-tokens.
    """
    if vocab_size < 256:
        raise ConfigError(f"vocab_size must be >= 256 (all single bytes), got {vocab_size}")
    # HF sums pair counts in an i32: refuse rather than let a huge corpus wrap around
    bound = sum(c * (len(w) - 1) for w, c in words.items())
    if bound >= 2**31:
        raise ConfigError(
            f"the corpus has up to {bound} adjacent byte pairs, past the i32 pair counts of HF's trainer; "
            "use --first-stage-trainer hbpe"
        )
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    alphabet = [chr(_HF_BYTE_BASE + b) for b in range(256)]

    def feed():  # sorted: the same input order every run
        for word, count in sorted(words.items()):
            spelled = "".join(alphabet[b] for b in word) + " "
            for start in range(0, count, _HF_CHUNK):
                yield spelled * min(_HF_CHUNK, count - start)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_count, show_progress=False, initial_alphabet=alphabet
    )
    tok.train_from_iterator(feed(), trainer)
    ranks = {bytes(ord(ch) - _HF_BYTE_BASE for ch in token): i for token, i in tok.get_vocab().items()}
    if sorted(ranks.values()) != list(range(len(ranks))) or any(ranks.get(bytes([b])) != b for b in range(256)):
        raise RuntimeError("HF's BpeTrainer did not give byte b the id b; its alphabet order changed")
    return ranks


def train_first_stage(
    words: Counter[bytes], vocab_size: int, *, min_count: int = 2, trainer: str = DEFAULT_FIRST_STAGE_TRAINER
) -> dict[bytes, int]:
    """Ranks from the chosen trainer (`hbpe` in-house, `hf` HuggingFace tokenizers); both learn the same BPE."""
    if trainer == "hbpe":
        return train_ranks(words, vocab_size, min_count=min_count)
    if trainer == "hf":
        return train_ranks_hf(words, vocab_size, min_count=min_count)
    raise ConfigError(f"unknown first-stage trainer {trainer!r}; use one of {', '.join(FIRST_STAGE_TRAINERS)}")


def check_out(out_path: str | Path) -> None:
    """Before training: the bucket of a URI `out_path` exists (a local folder is made when written)."""
    if storage.is_remote(out_path):
        storage.check_bucket(str(out_path))


def write_encoding(
    ranks: dict[bytes, int], out_path: str | Path, *, pattern: str, name: str | None = None
) -> Path | str:
    """Write `NAME.tiktoken` plus a sidecar `NAME.json` (pattern, special tokens) that loading reads.

    A URI (s3://, gs://, ...) is written locally and uploaded: see `_upload_encoding`.
    """
    if storage.is_remote(out_path):
        return _upload_encoding(ranks, str(out_path), pattern=pattern, name=name)
    out = Path(out_path)
    if out.suffix != ".tiktoken":
        out = out / "encoding.tiktoken" if out.is_dir() or not out.suffix else out.with_suffix(".tiktoken")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(format_rank_file(ranks))
    meta = {
        "name": name or out.stem,
        "pattern": resolve_pattern(pattern),
        "special_tokens": {DEFAULT_SPECIAL_TOKEN: len(ranks)},
        "n_vocab": len(ranks) + 1,
    }
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


def rank_file_uri(uri: str) -> str:
    """Where `write_encoding` puts the rank file for an `--out` URI, named as for a local path.

    >>> rank_file_uri("s3://b/bpe.tiktoken"), rank_file_uri("s3://b/first/"), rank_file_uri("gs://b/x.txt")
    ('s3://b/bpe.tiktoken', 's3://b/first/encoding.tiktoken', 'gs://b/x.tiktoken')
    """
    parent, _, name = uri.rpartition("/")
    suffix = PurePosixPath(name).suffix
    if suffix == ".tiktoken":
        return uri
    if not suffix:  # a prefix, like a local directory
        return storage.join(uri, "encoding.tiktoken")
    return f"{parent}/{PurePosixPath(name).with_suffix('.tiktoken')}"


def _upload_encoding(ranks: dict[bytes, int], uri: str, *, pattern: str, name: str | None) -> str:
    """Write both files locally, then upload the sidecar first and the rank file last.

    A reader that finds the rank file finds its pattern beside it (an object store has no rename).
    """
    target = rank_file_uri(uri)
    storage.check_bucket(target)
    with tempfile.TemporaryDirectory(prefix="hbpe-encoding-") as tmp:
        local = Path(write_encoding(ranks, Path(tmp, target.rpartition("/")[2]), pattern=pattern, name=name))
        sidecar = local.with_suffix(".json")
        storage.upload_file(sidecar, f"{target.rpartition('/')[0]}/{sidecar.name}")
        storage.upload_file(local, target)
    return target
