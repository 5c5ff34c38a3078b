"""Load the first-stage byte-level BPE: a named tiktoken encoding or a `.tiktoken` rank file.

A rank file holds one `base64(token_bytes) rank` per line (tiktoken's format). It
carries no split pattern, so one is given by name (`gpt2`, `cl100k_base`, `llama3`,
...) or as a literal regex, or read from a sidecar `NAME.json` written beside the
rank file by `hbpe tokenizer train-bpe`.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path, PurePosixPath

import tiktoken

from hbpe.pipeline import storage
from hbpe.schemas.errors import EncodingUnavailableError, file_problem

NAMED_ENCODINGS = ("gpt2", "r50k_base", "p50k_base", "cl100k_base", "o200k_base")

_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# LLaMA-3's tokenizer.model is a .tiktoken rank file used with this pattern.
_LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
NAMED_PATTERNS = {
    "gpt2": _GPT2_PATTERN,
    "r50k_base": _GPT2_PATTERN,
    "p50k_base": _GPT2_PATTERN,
    "cl100k_base": _CL100K_PATTERN,
    "o200k_base": _O200K_PATTERN,
    "llama3": _LLAMA3_PATTERN,
}
DEFAULT_SPECIAL_TOKEN = "<|endoftext|>"


def _offline_hint(name: str) -> str:
    cache = os.environ.get("TIKTOKEN_CACHE_DIR")
    where = f"TIKTOKEN_CACHE_DIR={cache} does not hold it" if cache else "TIKTOKEN_CACHE_DIR is unset"
    return (
        f"cannot load tiktoken encoding {name!r}: it is fetched from the network on first use "
        f"and {where}. Fixes: set TIKTOKEN_CACHE_DIR to a folder with tiktoken's cache files "
        "(e.g. ../shared/data/tiktoken-cache), or pass --encoding PATH to a .tiktoken rank file "
        "(with --pattern)."
    )


def load_named(name: str) -> tiktoken.Encoding:
    """tiktoken.get_encoding with errors that say how to work offline."""
    if name not in NAMED_ENCODINGS:
        raise EncodingUnavailableError(
            f"unknown encoding {name!r}; use one of {', '.join(NAMED_ENCODINGS)} or a path to a .tiktoken rank file"
        )
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # network errors come from requests/urllib/blobfile, varied types
        raise EncodingUnavailableError(f"{_offline_hint(name)} (cause: {type(e).__name__}: {e})") from e


def parse_rank_file(data: bytes, *, source: str = "rank file") -> dict[bytes, int]:
    """Parse tiktoken's `base64 rank` lines, checking that ranks are unique."""
    ranks: dict[bytes, int] = {}
    seen: set[int] = set()
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            tok_b64, rank_s = line.split()
            token, rank = base64.b64decode(tok_b64, validate=True), int(rank_s)
        except ValueError as e:
            raise EncodingUnavailableError(
                f"{source}:{lineno}: not a tiktoken rank line (expected 'BASE64 RANK'): {line[:60]!r}"
            ) from e
        if token in ranks or rank in seen:
            raise EncodingUnavailableError(f"{source}:{lineno}: duplicate token or rank {rank}")
        ranks[token] = rank
        seen.add(rank)
    if not ranks:
        raise EncodingUnavailableError(f"{source}: holds no tokens")
    return ranks


def format_rank_file(ranks: dict[bytes, int]) -> bytes:
    """The inverse of parse_rank_file, sorted by rank so the bytes are deterministic."""
    lines = [
        base64.b64encode(tok) + b" " + str(rank).encode() for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])
    ]
    return b"\n".join(lines) + b"\n"


def resolve_pattern(pattern: str) -> str:
    """A named pattern (`gpt2`, `cl100k_base`, `llama3`, ...) or a literal regex."""
    return NAMED_PATTERNS.get(pattern, pattern)


def load_rank_file(
    path: str | os.PathLike, *, pattern: str | None = None, special_tokens: dict[str, int] | None = None
) -> tiktoken.Encoding:
    """Build an Encoding from a rank file; pattern/special tokens from args or a sidecar JSON."""
    path = Path(path)
    problem = file_problem(path)
    if problem is not None:
        raise EncodingUnavailableError(f"rank file {path} {problem}; pass an existing .tiktoken file")
    ranks = parse_rank_file(path.read_bytes(), source=str(path))
    sidecar = path.with_suffix(".json")
    meta = _read_sidecar(sidecar) if sidecar.is_file() else {}
    pat = resolve_pattern(pattern) if pattern else meta.get("pattern")
    if not pat:
        raise EncodingUnavailableError(
            f"rank file {path} has no split pattern: pass --pattern NAME_OR_REGEX "
            f"(names: {', '.join(sorted(NAMED_PATTERNS))}) or put a {sidecar.name} with a 'pattern' beside it"
        )
    if special_tokens is None:
        special_tokens = meta.get("special_tokens") or {DEFAULT_SPECIAL_TOKEN: max(ranks.values()) + 1}
    return tiktoken.Encoding(
        name=meta.get("name", path.stem), pat_str=pat, mergeable_ranks=ranks, special_tokens=dict(special_tokens)
    )


def _read_sidecar(sidecar: Path) -> dict:
    """The `NAME.json` that `hbpe tokenizer train-bpe` writes beside its rank file."""
    try:
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EncodingUnavailableError(
            f"{sidecar}: not valid JSON ({e}); fix it, or delete it and pass --pattern NAME_OR_REGEX"
        ) from e
    if not isinstance(meta, dict) or not isinstance(meta.get("pattern", ""), str):
        raise EncodingUnavailableError(
            f"{sidecar}: expected an object with a string 'pattern'; fix it, or delete it and pass --pattern"
        )
    return meta


def vocabulary_tokens(enc: tiktoken.Encoding) -> list[tuple[int, bytes]]:
    """(id, bytes) of every non-special first-stage token, in id order (gaps skipped)."""
    # _mergeable_ranks is tiktoken's own table: faster and gap-free, unlike probing every id.
    return sorted(((rank, tok) for tok, rank in enc._mergeable_ranks.items()))


def load_remote_rank_file(uri: str, *, pattern: str | None = None) -> tiktoken.Encoding:
    """`load_rank_file` of a rank file in a bucket: it and its sidecar `NAME.json` (when there) are
    downloaded into a temporary directory first; errors name the URI, not the copy."""
    parent, _, name = uri.rpartition("/")
    sidecar = PurePosixPath(name).with_suffix(".json").name if name else ""
    with tempfile.TemporaryDirectory(prefix="hbpe-encoding-") as tmp:
        storage.localize_dir(parent, [n for n in dict.fromkeys((name, sidecar)) if n], into=tmp)
        try:
            return load_rank_file(os.path.join(tmp, name), pattern=pattern)
        except EncodingUnavailableError as e:
            raise EncodingUnavailableError(str(e).replace(tmp, parent)) from None


def load_encoding(spec: str, *, pattern: str | None = None) -> tiktoken.Encoding:
    """`spec` is a named encoding or a path or URI (s3://, gs://, ...) of a `.tiktoken` rank file."""
    if spec in NAMED_ENCODINGS:
        return load_named(spec)
    if storage.is_remote(spec):  # before any Path(): it would collapse s3://b/x to s3:/b/x
        return load_remote_rank_file(spec, pattern=pattern)
    if Path(spec).exists() or spec.endswith(".tiktoken") or os.sep in spec:
        return load_rank_file(spec, pattern=pattern)
    return load_named(spec)  # raises with the list of names
