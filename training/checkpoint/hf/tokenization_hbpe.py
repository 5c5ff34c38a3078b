"""HbpeTokenizer: hbpe's two-stage tokenizer as a transformers PreTrainedTokenizer.

    ids = tok("Hello world")["input_ids"]      # first stage: tiktoken `encode_ordinary` ids
    patches = tok.patches(["Hello world"])     # (B, T, S) long: what HbpeForCausalLM takes
    tok.decode(ids), tok.decode_patches(patches[0])   # back to text, exactly

It reads the hbpe tokenizer directory `tokenizer/` of an `hbpe export --format hf` folder
(hbpe_tokenizer.json, or tokenizer.json as written before hbpe 0.x renamed it, and the rank
file it names), checks the rank file's sha256 and the spec's fingerprint, and applies the
second-stage merges to each first-stage token as hbpe does (SPEC: every merge in rank order,
`minimal` stops at <= S). Shipped verbatim; imports no hbpe (training/checkpoint/hf/__init__.py).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import shutil

import numpy as np
import tiktoken
import torch
from transformers import AddedToken, PreTrainedTokenizer

EOP, PAD, EOD, FIRST_MERGE_ID = 256, 257, 258, 259
TOKENIZER_DIR = "tokenizer"
SPEC_NAMES = ("hbpe_tokenizer.json", "tokenizer.json")  # the current name first, then the one before the rename
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>")  # the first stage's document end (gpt2 and friends, llama3)


def eos_token_of(special_tokens: dict[str, int]) -> str:
    """The first-stage special token that ends a document: the model's EOD patch, eos and pad of generate()."""
    for name in EOS_NAMES:
        if name in special_tokens:
            return name
    return min(special_tokens, key=special_tokens.get)


@functools.lru_cache
def _byte_chars() -> dict[int, str]:
    """GPT-2's printable character for each byte: a token's bytes as an HF token string."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _apply_merges(seq: list[int], ranks: dict[tuple[int, int], int], S: int, mode: str) -> list[int]:
    """hbpe's apply_merges: the lowest-ranked pair present merged first, left to right, non-overlapping."""
    while len(seq) > 1 and not (mode == "minimal" and len(seq) <= S):
        pair = min(zip(seq, seq[1:]), key=lambda p: ranks.get(p, 1 << 62))
        if pair not in ranks:
            break
        new, out, i = FIRST_MERGE_ID + ranks[pair], [], 0
        while i < len(seq):
            if i + 1 < len(seq) and (seq[i], seq[i + 1]) == pair:
                out.append(new)
                i += 2
            else:
                out.append(seq[i])
                i += 1
        seq = out
    return seq


def find_spec(folder: str) -> str:
    """The spec file of an hbpe tokenizer directory (or of the export folder holding `tokenizer/`)."""
    for base in (os.path.join(folder, TOKENIZER_DIR), folder):
        for name in SPEC_NAMES:
            if os.path.isfile(os.path.join(base, name)):
                return os.path.join(base, name)
    raise OSError(f"{folder} holds no hbpe tokenizer ({TOKENIZER_DIR}/{SPEC_NAMES[0]}): use an `hbpe export` folder")


class HbpeTokenizer(PreTrainedTokenizer):
    """Text <-> first-stage ids (`input_ids`, as any HF tokenizer) <-> patches (the model's input).

    The first stage's special tokens are the tokenizer's added tokens (so `len(tok)` is the first
    stage's vocabulary, the model's `vocab_size`), its end-of-text token is eos and pad (the model
    reads it as the document marker EOD); text is always encoded as text (`split_special_tokens`),
    as hbpe's `encode_ordinary` does, so "<|endoftext|>" in a string stays those characters.
    """

    vocab_files_names = {"spec_file": f"{TOKENIZER_DIR}/{SPEC_NAMES[0]}"}
    model_input_names = ["input_ids", "attention_mask"]
    padding_side = "left"  # generate() continues the last token of each row

    def __init__(self, spec_file: str | None = None, **kwargs) -> None:
        if spec_file is None or not os.path.isfile(spec_file):  # an export written with the former name
            folder = kwargs.get("name_or_path") or os.path.dirname(os.path.dirname(spec_file or ""))
            spec_file = find_spec(folder)
        self.spec_file = spec_file
        with open(spec_file, encoding="utf-8") as f:
            spec = json.load(f)
        content = {k: v for k, v in spec.items() if k not in ("fingerprint", "hbpe_version")}
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        if hashlib.sha256(canonical).hexdigest() != spec.get("fingerprint"):
            raise ValueError(f"{spec_file}: its fingerprint does not match its content; restore the export folder")
        first, second = spec["first_stage"], spec["second_stage"]
        self.rank_file = os.path.join(os.path.dirname(spec_file), os.path.basename(first["rank_file"]))
        with open(self.rank_file, "rb") as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != first["rank_file_sha256"]:
            raise ValueError(f"{self.rank_file}: its sha256 differs from {spec_file}'s; restore the export folder")
        ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in data.splitlines() if line.strip())}
        self.fingerprint = spec["fingerprint"]
        self.encoding = tiktoken.Encoding(
            name=first["name"], pat_str=first["pattern"], mergeable_ranks=ranks, special_tokens=first["special_tokens"]
        )
        self.max_patch_size, self.mode = second["max_patch_size"], second["mode"]
        merges = [tuple(m) for m in second["merges"]]
        self._ranks = {pair: k for k, pair in enumerate(merges)}
        self.symbol_bytes = [bytes([b]) for b in range(256)] + [b"", b"", b""]  # EOP, PAD, EOD carry no bytes
        self.symbol_ends_patch = [False] * 256 + [True, False, False]  # EOP ends a patch, and a merge holding it
        for a, b in merges:
            self.symbol_bytes.append(self.symbol_bytes[a] + self.symbol_bytes[b])
            self.symbol_ends_patch.append(self.symbol_ends_patch[b])
        self._token_bytes = {r: t for t, r in ranks.items()}
        self._chars = _byte_chars()
        self._bytes_of = {c: b for b, c in self._chars.items()}
        specials = first["special_tokens"]
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        kwargs.setdefault("split_special_tokens", True)
        kwargs["added_tokens_decoder"] = {
            **{i: AddedToken(t, special=True, normalized=False) for t, i in specials.items()},
            **kwargs.get("added_tokens_decoder", {}),
        }
        eos = eos_token_of(specials)
        kwargs.setdefault("eos_token", eos)
        kwargs.setdefault("pad_token", eos)
        super().__init__(**kwargs)

    # ---- the PreTrainedTokenizer hooks: tokens are GPT-2-style strings of a first-stage token's bytes

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    def get_vocab(self) -> dict[str, int]:
        return {**{self._string(t): r for r, t in self._token_bytes.items()}, **self.added_tokens_encoder}

    def _string(self, data: bytes) -> str:
        return "".join(self._chars[b] for b in data)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [self._string(self._token_bytes[i]) for i in self.encoding.encode_ordinary(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoding.encode_single_token(bytes(self._bytes_of[c] for c in token))

    def _convert_id_to_token(self, index: int) -> str:
        return self._string(self.encoding.decode_single_token_bytes(index))

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return bytes(self._bytes_of[c] for t in tokens for c in t).decode("utf-8", errors="replace")

    # no special tokens around a text: hbpe encodes a text alone (encode_ordinary) and the model puts the document
    # marker before each row itself. transformers 4's PreTrainedTokenizer adds none unless told; 5.0's adds [CLS] text
    # [SEP] by default (special_tokens_pattern "cls_sep": ids None here, so padding a batch failed); said here once
    def build_inputs_with_special_tokens(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        return token_ids_0 + (token_ids_1 or [])

    def get_special_tokens_mask(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None, already_has_special_tokens: bool = False
    ) -> list[int]:
        if already_has_special_tokens:
            return super().get_special_tokens_mask(token_ids_0, token_ids_1, already_has_special_tokens=True)
        return [0] * (len(token_ids_0) + len(token_ids_1 or []))

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        """The hbpe tokenizer directory, byte for byte, into save_directory/tokenizer/ (hbpe reads it there)."""
        out = os.path.join(save_directory, TOKENIZER_DIR)
        os.makedirs(out, exist_ok=True)
        spec, rank = os.path.join(out, SPEC_NAMES[0]), os.path.join(out, os.path.basename(self.rank_file))
        for src, dst in ((self.spec_file, spec), (self.rank_file, rank)):
            if os.path.abspath(src) != os.path.abspath(dst):
                shutil.copyfile(src, dst)
        return spec, rank

    # ---- the second stage

    @functools.lru_cache(maxsize=1 << 17)  # noqa: B019 - one table row per token, for the tokenizer's life
    def token_patch(self, token_id: int) -> tuple[int, ...]:
        """One first-stage token -> its patch: bytes + EOP with the merges applied (<= S symbols)."""
        raw = [*self.encoding.decode_single_token_bytes(token_id), EOP]
        return tuple(_apply_merges(raw, self._ranks, self.max_patch_size, self.mode))

    def patches(self, texts: str | list[str] | list[list[int]], *, eod: bool = False) -> torch.Tensor:
        """Texts (or lists of first-stage ids) -> patches (B, T, S) long, PAD-padded; shorter rows end in
        all-PAD patches, which the model never scores. `eod`: each row starts with the document marker
        patch [EOD, PAD, ...], as documents start in hbpe's shards."""
        rows = [texts] if isinstance(texts, str) else texts
        ids = [self.encoding.encode_ordinary(r) if isinstance(r, str) else list(r) for r in rows]
        S, T = self.max_patch_size, max(len(r) + eod for r in ids)
        out = np.full((len(ids), T, S), PAD, dtype=np.int64)
        for i, r in enumerate(ids):
            if eod:
                out[i, 0, 0] = EOD
            for t, token in enumerate(r, start=int(eod)):
                p = self.token_patch(int(token))
                out[i, t, : len(p)] = p
        return torch.from_numpy(out)

    def encode_bytes(self, data: bytes) -> list[list[int]]:
        """Any byte string -> patches (no PAD) of <= S symbols, split greedily where needed: hbpe's out-of-vocabulary
        rule (HierarchicalTokenizer.encode_bytes), which closes a generated patch of S symbols without EOP."""
        S, out, start = self.max_patch_size, [], 0
        while start < len(data):
            lo, hi = 1, len(data) - start  # the longest prefix whose patch fits; one byte + EOP always does
            if len(self._patch_of(data[start:])) <= S:
                lo = hi
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if len(self._patch_of(data[start : start + mid])) <= S else (lo, mid - 1)
            out.append(self._patch_of(data[start : start + lo]))
            start += lo
        return out

    def _patch_of(self, data: bytes) -> list[int]:
        return _apply_merges([*data, EOP], self._ranks, self.max_patch_size, self.mode)

    def symbols_bytes(self, symbols: list[int]) -> bytes:
        """Symbols (EOP, PAD and EOD carry no bytes) -> their bytes."""
        return b"".join(self.symbol_bytes[s] for s in symbols)

    def nbytes(self, ids: list[int]) -> int:
        """UTF-8 bytes of the text first-stage ids cover: the denominator of bits per byte."""
        return sum(len(self._token_bytes[int(i)]) for i in ids if int(i) >= 0)

    def decode_patches(self, patches: torch.Tensor | np.ndarray | list) -> str:
        """Patches (T, S) (PAD, EOP and EOD carry no bytes) -> text."""
        flat = np.asarray(patches).reshape(-1).tolist()
        return b"".join(self.symbol_bytes[s] for s in flat).decode("utf-8", errors="replace")
