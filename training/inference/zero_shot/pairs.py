"""The per-scheme part of zero-shot scoring: (context text, continuation text) -> model inputs + a mask.

A scheme's `encode` returns an `EncodedPair`: per-position input arrays (what `PatchLM.forward`
reads, unpadded: position 0 is the document marker) and `scored`, which of the forward pass's
target positions (position j predicts position j + 1) belong to the continuation. Everything
else (padding, batching, summing log-probabilities, metrics) is scheme-independent
(training/inference/zero_shot/scorer.py), so a new `model.io` adds one encode function and its spec's `pair_scheme`.

The context / continuation boundary, as lm-eval's `TemplateLM._encode_pair` draws it for BPE
models: trailing whitespace of the context moves to the continuation, then the continuation is
tokenized on its own, so its first token (patch) starts exactly at the boundary and the scored
symbols are exactly the continuation's bytes (plus each patch's EOP). lm-eval encodes
context + continuation whole and splits at the context's token count; with a regex-pretokenized
first stage (gpt2, cl100k, ...) and a continuation that starts with a space, both give the same
tokens (measured in tests/training/test_zero_shot.py), but encoding separately never lets a
merge straddle the boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.symbols import EOD, PAD, TOKEN_EOD
from hbpe.training.data.byte_patching import natural_starts, patch_starts, to_patches
from hbpe.training.schemes.registry import scheme_spec


@dataclass(frozen=True)
class EncodedPair:
    """One request as model inputs. `inputs[k]` is (L, ...) over L positions; `scored` is (L - 1, ...)
    bool over the forward pass's targets (positions 1..L-1), shaped like them per position
    ((S,) symbols for patches, () for tokens)."""

    inputs: dict[str, np.ndarray]
    scored: np.ndarray

    @property
    def length(self) -> int:
        return len(self.scored) + 1


@dataclass(frozen=True)
class PairScheme:
    """How one `model.io` turns text pairs into inputs: `encode`, the value that pads each input, and the
    output ids the model may emit but text never holds (excluded from the greedy check, as generation does)."""

    io: str
    encode: Callable[[str, str], EncodedPair]
    pad: dict[str, int]
    never_predicted: tuple[int, ...]


def move_trailing_space(context: str, continuation: str) -> tuple[str, str]:
    """lm-eval's rule: ("Answer: ", "A") -> ("Answer:", " A"), so a word keeps its leading space."""
    stripped = context.rstrip()
    return stripped, context[len(stripped) :] + continuation


def _check_continuation(continuation: str) -> None:
    if not continuation:
        raise ConfigError("a request has an empty continuation: there is nothing to score; give it text to score")


def hierarchical_pair(tok) -> Callable[[str, str], EncodedPair]:
    """BPE-patch: [EOD patch] + patches(context) + patches(continuation), each patch (S,) symbols.

    >>> enc = hierarchical_pair(tok)("The", " cat")   # gpt2, S=10: "The" is one token, " cat" one
    >>> enc.inputs["patches"].shape, enc.scored.sum(1).tolist()
    ((3, 10), [0, 3])
    """

    def encode(context: str, continuation: str) -> EncodedPair:
        context, continuation = move_trailing_space(context, continuation)
        _check_continuation(continuation)
        ctx = tok.patches(np.concatenate([[TOKEN_EOD], tok.encode(context)]).astype(np.int32))  # (1 + Nc, S)
        cont = tok.patches(tok.encode(continuation))  # (Nk, S): starts at a patch boundary
        scored = np.zeros((len(ctx) + len(cont) - 1, tok.max_patch_size), dtype=bool)
        scored[len(ctx) - 1 :] = cont != PAD  # every real symbol of the continuation's patches, EOP included
        return EncodedPair({"patches": np.concatenate([ctx, cont]).astype(np.int64)}, scored)

    return encode


def bpe_pair(tok) -> Callable[[str, str], EncodedPair]:
    """The BPE baseline: [TOKEN_EOD] + tokens(context) + tokens(continuation)."""

    def encode(context: str, continuation: str) -> EncodedPair:
        context, continuation = move_trailing_space(context, continuation)
        _check_continuation(continuation)
        ctx, cont = tok.encode(context), tok.encode(continuation)
        tokens = np.concatenate([[TOKEN_EOD], ctx, cont]).astype(np.int64)  # (L,)
        scored = np.zeros(len(tokens) - 1, dtype=bool)
        scored[len(ctx) :] = True  # target j predicts token j + 1: the continuation's tokens
        return EncodedPair({"tokens": tokens}, scored)

    return encode


def _bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


def bytes_pair() -> Callable[[str, str], EncodedPair]:
    """The byte-level baseline: [TOKEN_EOD] + bytes(context) + bytes(continuation)."""

    def encode(context: str, continuation: str) -> EncodedPair:
        context, continuation = move_trailing_space(context, continuation)
        _check_continuation(continuation)
        ctx, cont = _bytes(context), _bytes(continuation)
        tokens = np.concatenate([[TOKEN_EOD], ctx, cont]).astype(np.int64)
        scored = np.zeros(len(tokens) - 1, dtype=bool)
        scored[len(ctx) :] = True
        return EncodedPair({"tokens": tokens}, scored)

    return encode


def byte_patch_pair(cfg, entropy=None) -> Callable[[str, str], EncodedPair]:
    """Space or entropy patches over [EOD] + bytes(context) + bytes(continuation), a patch boundary at the
    continuation's first byte. Entropy patching reads the byte LM's entropies over the whole sequence, as
    training does over a sample, so the continuation is cut with its context in view.

    >>> from hbpe.schemas.train_config import model_config
    >>> enc = byte_patch_pair(model_config(io="space"))("Question: a b", " yes no")
    >>> enc.inputs["patches"].shape[1], int(enc.scored.sum())  # 6 bytes + EOP wide; " " | "yes " | "no": 7 + 3 EOPs
    (7, 10)
    """

    spec = scheme_spec(cfg)
    limit, width, eop = spec.max_patch_bytes(cfg), spec.symbols_per_patch(cfg), cfg.patching.boundaries == "eop"

    def encode(context: str, continuation: str) -> EncodedPair:
        context, continuation = move_trailing_space(context, continuation)
        _check_continuation(continuation)
        boundary = 1 + len(context.encode("utf-8"))
        units = np.concatenate([[EOD], _bytes(context), _bytes(continuation)]).astype(np.int32)
        natural = natural_starts(units, entropy, cfg.patching.entropy_threshold)
        cut = to_patches(units, boundary, patch_starts(units, boundary, natural, limit), width, eop=eop)
        patches = cut.patches.astype(np.int64)
        scored = np.zeros((len(patches) - 1, width), dtype=bool)
        scored[cut.context - 1 :] = patches[cut.context :] != PAD
        return EncodedPair({"patches": patches}, scored)

    return encode


def scheme_for(model, tok) -> PairScheme:
    """The PairScheme of a loaded model's `model.io` (its spec's, training/schemes/)."""
    return scheme_spec(model.cfg).pair_scheme(model, tok)
