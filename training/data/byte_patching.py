"""Byte-level views of a shard sample, for the baselines that re-segment the same text.

Every scheme trains from the same `tokens` column (first-stage ids, EOD -1, PAD -2). The
byte schemes decode a sample back to its bytes and cut them their own way (SPEC section 1,
Baselines):

- `bytes`:   one byte per latent position;
- `space`:   a byte that is not an ASCII letter or digit (a UTF-8 lead byte >= 0xC0 counts,
             a continuation byte does not) is a delimiter; a new patch starts after the first
             delimiter of a run; patches longer than the maximum are split;
- `entropy`: a new patch starts at each byte whose next-byte entropy (from a small byte LM)
             exceeds a global threshold, optionally split at a maximum length.

Two boundaries are common to all: a document marker is a patch (position) of its own, and the
bytes of the sample's first token form the first patch(es). That first token is context in
every scheme (the hierarchical model predicts positions 2..N from position 1), so every scheme
predicts exactly the bytes of tokens 2..N: the same BPB denominator from the same sample.

A sample's units are int32 symbols in the second stage's id layout (schemas/symbols.py):
0..255 a byte, EOD a document marker. Patches are rows of [bytes..., EOP, PAD...] or
[EOD, PAD...], the layout the hierarchical model already reads (V' = 259 with no merges).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hbpe.schemas.symbols import EOD, EOP, NUM_BYTES, PAD, TOKEN_EOD, TOKEN_PAD

BYTE_VOCAB = NUM_BYTES + 3  # bytes, EOP, PAD, EOD: the symbols of the space and entropy schemes
# "unbounded" entropy patches are split at this length (the splits are counted and reported): a batch
# pads every patch to its longest, and at 64 the local models cost 10x the bounded variant's (measured)
UNBOUNDED_SAFETY_LIMIT = 24


@dataclass(frozen=True)
class VocabularyBytes:
    """The UTF-8 bytes of every first-stage token, flat, for vectorized decoding of samples."""

    flat: np.ndarray  # (total,) uint8: token 0's bytes, then token 1's, ...
    offsets: np.ndarray  # (n_vocab + 1,) int64: token t's bytes are flat[offsets[t]:offsets[t+1]]

    @classmethod
    def from_token_bytes(cls, token_bytes: list[bytes]) -> VocabularyBytes:
        lengths = np.fromiter((len(b) for b in token_bytes), dtype=np.int64, count=len(token_bytes))
        offsets = np.zeros(len(token_bytes) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.frombuffer(b"".join(token_bytes), dtype=np.uint8), offsets)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass(frozen=True)
class SampleUnits:
    """One sample as bytes and document markers, with where its context (first token) ends."""

    units: np.ndarray  # (L,) int32: 0..255 bytes, EOD markers; PAD tokens (a padded tail) dropped
    context: int  # units[:context] are the first token's: never predicted in any scheme


def sample_units(tokens: np.ndarray, vocab: VocabularyBytes) -> SampleUnits:
    """A row of the `tokens` column -> its bytes and markers.

    >>> vb = VocabularyBytes.from_token_bytes([b"a", b"bc"])
    >>> s = sample_units(np.array([1, 0, -1, 1, -2]), vb)
    >>> s.units.tolist(), s.context
    ([98, 99, 97, 258, 98, 99], 2)
    """
    tokens = np.asarray(tokens)
    tokens = tokens[tokens != TOKEN_PAD]
    is_eod = tokens == TOKEN_EOD
    safe = np.where(is_eod, 0, tokens)
    lengths = np.where(is_eod, 1, vocab.lengths[safe])  # a marker is one unit
    total = int(lengths.sum())
    starts = np.zeros(len(tokens), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    # for every unit: which token it comes from, and its index inside that token
    owner = np.repeat(np.arange(len(tokens)), lengths)
    within = np.arange(total) - starts[owner]
    units = vocab.flat[vocab.offsets[safe[owner]] + within].astype(np.int32)
    units[is_eod[owner]] = EOD
    return SampleUnits(units, int(lengths[0]) if len(tokens) else 0)


def space_starts(units: np.ndarray) -> np.ndarray:
    """Patch starts of space patching (before the maximum length is applied): (L,) bool.

    >>> u = np.frombuffer(b"hi, yo", dtype=np.uint8).astype(np.int32)
    >>> np.flatnonzero(space_starts(u)).tolist()  # "hi," " yo": after the first delimiter of ", "
    [3]
    """
    b = units
    alnum = ((b >= 48) & (b <= 57)) | ((b >= 65) & (b <= 90)) | ((b >= 97) & (b <= 122))
    continuation = (b >= 0x80) & (b < 0xC0)
    delim = ~alnum & ~continuation & (b < NUM_BYTES)
    first_of_run = delim & ~np.concatenate([[False], delim[:-1]])
    starts = np.zeros(len(b), dtype=bool)
    starts[1:] = first_of_run[:-1]  # a new patch starts after it
    return starts


def entropy_starts(entropies: np.ndarray, threshold: float) -> np.ndarray:
    """Patch starts of entropy patching: where the next-byte entropy exceeds the threshold.

    `entropies[i]` is H(p(unit_i | units_<i)) in nats (entropies[0] is unused: a patch starts there).
    """
    return np.asarray(entropies) > threshold


def patch_starts(units: np.ndarray, context: int, starts: np.ndarray, max_bytes: int) -> np.ndarray:
    """The scheme's starts plus the common boundaries, then patches split at `max_bytes`: (L,) bool."""
    starts = starts.copy()
    if len(units):
        starts[0] = True
    if 0 < context < len(units):
        starts[context] = True  # the first token is the context patch(es)
    eod = units == EOD
    starts |= eod  # a marker starts a patch ...
    starts[1:] |= eod[:-1]  # ... and ends it
    pid = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    pos = np.arange(len(units)) - first[pid]
    return starts | ((pos % max_bytes) == 0)


def natural_starts(units: np.ndarray, entropy=None, threshold: float | None = None) -> np.ndarray:
    """One sample's patch starts by its scheme's rule: space patching, or entropy above `threshold`."""
    if entropy is None:
        return space_starts(units)
    return entropy_starts(entropy.entropies([units])[0], threshold)


@dataclass(frozen=True)
class SamplePatches:
    patches: np.ndarray  # (T, W) int32 rows [bytes..., EOP, PAD...] or [EOD, PAD...]
    context: int  # patches[:context] cover the first token: never predicted
    text_bytes: int  # bytes in the predicted patches (the BPB denominator)


def to_patches(units: np.ndarray, context: int, starts: np.ndarray, width: int, *, eop: bool = True) -> SamplePatches:
    """Units cut at `starts` -> patch rows of `width` symbols (the longest patch + EOP must fit).

    `eop=False` (model.patching.boundaries=given, BLT's setup): no EOP; the boundaries are the
    patcher's, given to the model, and the longest patch alone must fit.

    >>> u = np.frombuffer(b"ab cd", dtype=np.uint8).astype(np.int32)
    >>> p = to_patches(u, 1, patch_starts(u, 1, space_starts(u), 6), 7)
    >>> p.patches[:, :4].tolist(), p.context, p.text_bytes
    ([[97, 256, 257, 257], [98, 32, 256, 257], [99, 100, 256, 257]], 1, 4)
    """
    pid = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    pos = np.arange(len(units)) - first[pid]
    n = len(first)
    lengths = np.bincount(pid, minlength=n)
    if n and int(lengths.max()) + eop > width:
        raise ValueError(f"a patch of {int(lengths.max())} bytes does not fit {width} symbols{' with EOP' * eop}")
    out = np.full((n, width), PAD, dtype=np.int32)
    out[pid, pos] = units
    if eop:
        text_rows = np.flatnonzero(out[:, 0] != EOD)
        out[text_rows, lengths[text_rows]] = EOP
    ctx = int(pid[context]) if context < len(units) else n  # patches before the one holding unit `context`
    text_bytes = int((units[context:] != EOD).sum())
    return SamplePatches(out, ctx, text_bytes)
