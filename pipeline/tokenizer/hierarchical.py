"""The two-stage tokenizer: tiktoken first, then a table gather for the hierarchical BPE.

Every first-stage id maps to one fixed symbol sequence, so the second stage is a
precomputed `[n_vocab, S]` table and encoding a corpus costs `encode_ordinary`
plus one numpy gather.

Patch rows are PAD-padded to S. Two extra rows sit at the end of the table so that
the negative marker ids of the `tokens` shard column gather to marker patches:
`table[-1]` is the EOD patch (TOKEN_EOD = -1), `table[-2]` the all-PAD row
(TOKEN_PAD = -2).

Byte strings outside the vocabulary (generation) may exceed S after the merges;
`encode_bytes` then splits them greedily into the longest prefixes whose patch
fits in S, each closed by its own EOP, so decoding stays exact (a single byte plus
EOP always fits, as S >= 2).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import tiktoken

from hbpe.pipeline.tokenizer.first_stage import vocabulary_tokens
from hbpe.pipeline.tokenizer.second_stage import kernels
from hbpe.pipeline.tokenizer.second_stage.apply import apply_merges, patch_of
from hbpe.schemas.errors import ConfigError, HbpeError
from hbpe.schemas.symbols import EOD, NUM_BYTES, PAD, TOKEN_EOD, TOKEN_PAD
from hbpe.schemas.tokenizer_artifact import TokenizerSpec


class PatchTables(NamedTuple):
    """The second stage's per-id arrays: built from the merges here, or read back from an artifact (tables.py)."""

    table: np.ndarray  # (R + 2, S) uint16, R = first-stage ids
    patch_lengths: np.ndarray  # (R + 2,) uint8
    token_nbytes: np.ndarray  # (R + 2,) int32


class HierarchicalTokenizer:
    """A loaded two-stage tokenizer. Build with `training.train_tokenizer` or `artifact.load`.

    `tables`: the arrays `_build_table` would build, as an artifact's saved tables hold them (checked by
    the caller); without them they are built from the merges.
    """

    def __init__(self, encoding: tiktoken.Encoding, spec: TokenizerSpec, *, tables: PatchTables | None = None) -> None:
        self.encoding = encoding
        self.spec = spec
        stage = spec.second_stage
        self.max_patch_size = stage.max_patch_size
        self.mode = stage.mode
        self.merges = stage.merges
        self.vocab_size = stage.vocab_size
        self._ranks = {pair: k for k, pair in enumerate(self.merges)}
        self.symbol_bytes, self.symbol_ends_patch = self._expand_symbols()
        self.table, self.patch_lengths, self.token_nbytes = tables if tables is not None else self._build_table()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0

    # ---- construction -------------------------------------------------------------------

    def _expand_symbols(self) -> tuple[list[bytes], list[bool]]:
        """Bytes of every symbol, and whether it ends a patch (EOP, or a merge that swallowed EOP)."""
        out = [bytes([b]) for b in range(NUM_BYTES)] + [b"", b"", b""]  # EOP, PAD, EOD carry no bytes
        ends = [False] * NUM_BYTES + [True, False, False]
        for a, b in self.merges:
            out.append(out[a] + out[b])
            ends.append(ends[b])
        return out, ends

    def _build_table(self) -> PatchTables:
        S = self.max_patch_size
        vocab = vocabulary_tokens(self.encoding)
        n_rows = self.encoding.max_token_value + 1
        flat, offsets = kernels.apply_merges_flat(
            [patch_of(tok) for _, tok in vocab], self.merges, max_patch_size=S, mode=self.mode
        )
        lengths = np.diff(offsets)
        if len(lengths) and lengths.max() > S:
            raise HbpeError(
                f"internal: a vocabulary patch has {lengths.max()} > S={S} symbols; the merges are inconsistent"
            )
        ids = np.array([i for i, _ in vocab], dtype=np.int64)
        # (n_rows + 2, S): vocabulary rows, then the PAD row (index -2) and the EOD row (index -1)
        table = np.full((n_rows + 2, S), PAD, dtype=np.uint16)
        rows = np.repeat(ids, lengths)
        cols = np.arange(len(flat)) - np.repeat(offsets[:-1], lengths)
        table[rows, cols] = flat
        table[-1, 0] = EOD
        patch_lengths = np.zeros(n_rows + 2, dtype=np.uint8)  # 0 = not a text token (special id or gap)
        patch_lengths[ids] = lengths
        patch_lengths[-1] = 1
        token_nbytes = np.zeros(n_rows + 2, dtype=np.int32)
        token_nbytes[ids] = [len(tok) for _, tok in vocab]
        return PatchTables(table, patch_lengths, token_nbytes)

    # ---- encoding -----------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        return self.spec.fingerprint

    def encode(self, text: str) -> np.ndarray:
        """First stage only, as `encode_ordinary`: special tokens in text stay plain text.

        `encode_to_numpy` with nothing allowed or disallowed gives the same ids as
        `encode_ordinary` (tested) straight from tiktoken's buffer, skipping the Python
        list, which makes tiktoken + the table gather faster than `encode_ordinary` alone.
        """
        return self.encoding.encode_to_numpy(text, allowed_special=set(), disallowed_special=()).view(np.int32)

    def encode_patches_batch(self, texts: list[str], *, num_threads: int = 2) -> list[tuple[np.ndarray, np.ndarray]]:
        """(tokens, patches) for many texts, in order.

        The gather runs in the same worker threads as tiktoken, so it overlaps with
        the other threads' encoding instead of following the whole batch.
        """
        return self._map(self.encode_patches, texts, num_threads)

    def encode_batch(self, texts: list[str], *, num_threads: int = 2) -> list[np.ndarray]:
        """First-stage ids for many texts, in order, on a thread pool."""
        return self._map(self.encode, texts, num_threads)

    def _map(self, fn, texts: list[str], num_threads: int) -> list:
        if num_threads <= 1 or len(texts) <= 1:
            return [fn(t) for t in texts]
        if self._pool is None or self._pool_size != num_threads:
            self._pool, self._pool_size = ThreadPoolExecutor(num_threads, thread_name_prefix="hbpe-encode"), num_threads
        return list(self._pool.map(fn, texts))

    def patches(self, tokens: np.ndarray) -> np.ndarray:
        """(T,) int32 first-stage ids (or TOKEN_EOD / TOKEN_PAD) -> (T, S) uint16 PAD-padded patches.

        One row of the precomputed table per id, e.g. with gpt2 at S=10 (PAD = 257, EOD = 258):

        >>> tok.patches(np.array([464, -1], dtype=np.int32))[:, :4]  # "The" = "Th" + "e<EOP>"; EOD
        array([[397, 265, 257, 257],
               [258, 257, 257, 257]], dtype=uint16)
        """
        return self._gather(self._checked_ids(tokens))

    def _gather(self, ids: np.ndarray) -> np.ndarray:
        # np.take on int32 indices is ~2x faster than fancy indexing; negatives pick the marker rows
        return np.take(self.table, ids, axis=0)

    def _checked_ids(self, tokens: Any) -> np.ndarray:
        """`tokens` as int32 row indices, or a ConfigError naming the first id this tokenizer has no row for.

        Without it an id past the table was numpy's IndexError (or OverflowError), and an int64 id past 2**31
        or a negative one below TOKEN_PAD silently picked another token's row.
        """
        ids = np.asarray(tokens)
        flat = ids.reshape(-1)
        if ids.dtype == object:  # Python ints past int64 (2**70), or values of mixed types
            not_int = [t for t in flat if isinstance(t, bool) or not isinstance(t, (int, np.integer))]
        else:
            not_int = flat[:1] if ids.dtype.kind not in "iu" else []
        if len(not_int):
            first = not_int[0].item() if isinstance(not_int[0], np.generic) else not_int[0]
            raise ConfigError(
                f"token {first!r:.40} ({type(first).__name__}) is not an integer id: pass first-stage "
                "ids, e.g. tok.patches(tok.encode('Hello world'))"
            )
        rows = len(self.table) - 2  # the vocabulary's; -1 and -2 are EOD and PAD
        if ids.dtype == object:
            outside = [t for t in flat if not TOKEN_PAD <= t < rows]
        else:
            outside = flat[(flat < TOKEN_PAD) | (flat >= rows)]
        if len(outside):
            raise ConfigError(
                f"token id {int(outside[0])} is out of range for this tokenizer: ids are 0..{rows - 1} (its first "
                f"stage's), or {TOKEN_EOD} (EOD) and {TOKEN_PAD} (PAD); encode text with tok.encode"
            )
        return ids.astype(np.int32, copy=False)

    def encode_patches(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        tokens = self.encode(text)  # ids of this tokenizer: gathered without a check
        return tokens, self._gather(tokens)

    def nbytes(self, tokens: np.ndarray) -> int:
        """UTF-8 bytes of text the tokens cover (markers cover none): BPB's denominator."""
        return int(self.token_nbytes[np.asarray(tokens, dtype=np.int64)].sum())

    def encode_bytes(self, data: bytes) -> list[list[int]]:
        """Any byte string -> patches (no PAD), each <= S symbols, split greedily when needed."""
        S, out, start = self.max_patch_size, [], 0
        while start < len(data):
            whole = self._apply(data[start:])
            if len(whole) <= S:
                out.append(whole)
                break
            # longest prefix whose patch fits; one byte + EOP always does
            lo, hi = 1, len(data) - start
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if len(self._apply(data[start : start + mid])) <= S:
                    lo = mid
                else:
                    hi = mid - 1
            out.append(self._apply(data[start : start + lo]))
            start += lo
        return out

    def _apply(self, data: bytes) -> list[int]:
        return apply_merges(patch_of(data), self._ranks, max_patch_size=self.max_patch_size, mode=self.mode)

    # ---- decoding -----------------------------------------------------------------------

    def decode_symbols_bytes(self, symbols: Iterable[int]) -> bytes:
        """Expand merges to bytes; EOP, PAD and EOD carry none."""
        sb = self.symbol_bytes
        try:
            return b"".join(sb[s] for s in symbols)
        except IndexError as e:
            raise HbpeError(f"symbol id out of range for this tokenizer (V'={self.vocab_size}): {e}") from e

    def decode_symbols(self, symbols: Iterable[int], *, errors: str = "replace") -> str:
        return self.decode_symbols_bytes(symbols).decode("utf-8", errors=errors)

    def decode_patches(self, patches: Sequence[Sequence[int]] | np.ndarray) -> str:
        """PAD-padded (T, S) rows or ragged lists of symbols -> text."""
        if isinstance(patches, np.ndarray):
            return self.decode_symbols(patches.reshape(-1).tolist())
        return self.decode_symbols(s for p in patches for s in p)

    def split_documents(self, symbols: np.ndarray) -> list[bytes]:
        """Split a flat symbol stream at EOD into document bytes (text after the last EOD is kept too)."""
        docs, cur = [], []
        for s in np.asarray(symbols).tolist():
            if s == EOD:
                docs.append(self.decode_symbols_bytes(cur))
                cur = []
            else:
                cur.append(s)
        if cur:
            docs.append(self.decode_symbols_bytes(cur))
        return docs

    def decode_tokens(self, tokens: Iterable[int]) -> str:
        return self.encoding.decode([t for t in tokens if t >= 0])

    # ---- statistics ---------------------------------------------------------------------

    def vocabulary_patch_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(symbols per raw patch `bytes+EOP`, symbols per final patch) over the first-stage vocabulary."""
        ids = np.flatnonzero(self.token_nbytes[:-2] > 0)
        return self.token_nbytes[ids] + 1, self.patch_lengths[ids].astype(np.int32)
