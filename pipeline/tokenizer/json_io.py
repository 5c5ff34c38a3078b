"""The JSON form of an encoding: `{"tokens": [...], "patches": [[...], ...]}`, written and read back.

`patches` holds each token's symbols without PAD, so the JSON is as short as the
text's patches; decoding accepts `patches` (the second stage) or, alone, `tokens`
(the first stage). Every bad input is an HbpeError that says what to pass instead.
"""

from __future__ import annotations

import json
from typing import Any

from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.schemas.errors import HbpeError

_FIX = "pass the output of `hbpe tokenizer encode`"


def text_from_bytes(data: bytes) -> str:
    """The text to encode: UTF-8 only, since the tokens must decode back to the same bytes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise HbpeError(f"input is not valid UTF-8 (byte {e.start}); convert it to UTF-8 first") from e


def encode_to_dict(tok: HierarchicalTokenizer, text: str) -> dict[str, list]:
    """Text -> {"tokens": [t, ...], "patches": [[s, ..., EOP or merge], ...]}, one patch per token, PAD cut off."""
    tokens, patches = tok.encode_patches(text)  # (T,), (T, S)
    lengths = tok.patch_lengths[tokens.astype("int64")]  # (T,)
    return {"tokens": tokens.tolist(), "patches": [row[:n].tolist() for row, n in zip(patches, lengths, strict=True)]}


def dumps_encoded(obj: dict[str, list]) -> str:
    """One compact line: the JSON of a long text stays a stream a shell pipe can carry."""
    return json.dumps(obj, separators=(",", ":"))


def parse_encoded(data: bytes) -> dict[str, Any]:
    """The JSON written by `encode_to_dict`, checked for shape before any tokenizer is loaded."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise HbpeError(f"input is not UTF-8 (byte {e.start}); {_FIX}") from e
    except json.JSONDecodeError as e:
        raise HbpeError(f"input is not JSON ({e}); {_FIX}") from e
    if not isinstance(obj, dict) or not ({"patches", "tokens"} & obj.keys()):
        raise HbpeError('input JSON needs a "patches" or "tokens" list, as written by `hbpe tokenizer encode`')
    return obj


def decode_from_dict(tok: HierarchicalTokenizer, obj: dict[str, Any]) -> str:
    """The text of `patches` (second-stage symbols), or of `tokens` when no patches are given."""
    if "patches" in obj:
        rows = obj["patches"]
        if not isinstance(rows, list) or not all(isinstance(p, list) for p in rows):
            raise HbpeError('"patches" must be a list of lists of symbol ids, as written by `hbpe tokenizer encode`')
        symbols = _ids([s for p in rows for s in p], tok.vocab_size, '"patches"', "symbol")
        return tok.decode_symbols_bytes(symbols).decode("utf-8", errors="replace")
    tokens = obj["tokens"] if isinstance(obj["tokens"], list) else [obj["tokens"]]
    return tok.decode_tokens(_ids(tokens, tok.encoding.max_token_value + 1, '"tokens"', "first-stage token"))


def _ids(values: list[Any], n: int, where: str, what: str) -> list[int]:
    """Ids a user handed in, each an int in [0, n): a negative one would index from the end, silently."""
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
            raise HbpeError(
                f"{where} holds {v!r}, not a {what} id of this tokenizer (0..{n - 1}); "
                "pass the output of `hbpe tokenizer encode` with the same --tokenizer"
            )
    return values
