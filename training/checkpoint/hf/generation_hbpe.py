"""generate() for HbpeForCausalLM: one new token is one patch, which the local decoder emits symbol by symbol.

Each step, as `hbpe generate` (training/inference/generate.py) decodes: the latent model advances
one patch with a KV cache (`PatchCache`), the local decoder emits the next patch's symbols with a
KV cache of its own until a symbol that ends the patch (EOP, or a merge holding it), EOD, or S of
them, and the patch is turned into the token id(s) generate() appends:

    a patch of one first-stage token's bytes   -> that token
    any other bytes (the decoder may emit a    -> their first-stage tokens, returned one per step; the
    patch no token has, or S symbols without      latent model advances with hbpe's patches (the emitted
    EOP)                                          one, or its out-of-vocabulary re-encoding) once all are out
    EOD                                        -> eos (after the tokens of any bytes before it)
    a patch without bytes (EOP alone)          -> no token: the latent model takes it and the decoder goes on

so generate() writes what `hbpe generate` writes for the same choices. Rows of a batch keep their
own positions (left padding does not shift them) and padded slots are masked; a row whose attention_mask
is all 0 is an empty prompt (what the tokenizer pads "" to), continued from the document marker alone as
`hbpe generate --prompt ''` continues it. A token generate()
feeds back that the model did not emit (a caller's choice) advances the latent model with its own
patch.

The model math and the symbol loop are hbpe's own: CachedPatchLM (hbpe_kv_decode.py), decode_patches and
next_patches (hbpe_patch_decode.py) and Sampling (hbpe_sampling.py) are the copies `hbpe export --format hf`
writes of the modules `hbpe generate` runs (training/checkpoint/hf_library.py). This file is the adapter
between them and transformers' generate(), which asks for one token at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .hbpe_kv_decode import CachedPatchLM
from .hbpe_patch_decode import decode_patches, next_patches, op_threads
from .hbpe_sampling import MAX_TEMPERATURE, MIN_TEMPERATURE, Sampling
from .hbpe_symbols import EOD, PAD

__all__ = ["PatchCache", "check_inputs", "ids_to_patches", "op_threads", "sampling_of"]
# generate() options that reweight the next token's scores: the local decoder makes the choice, so they cannot act
REFUSED = {
    "num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None, "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "bad_words_ids": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "sequence_bias": None, "min_new_tokens": None, "min_length": 0,
    "forced_bos_token_id": None, "forced_eos_token_id": None, "guidance_scale": None,
}  # fmt: skip


def check_inputs(ids: torch.Tensor, attention_mask, *, generate: bool = False) -> None:
    """input_ids (B >= 1, T >= 1) and an attention_mask of their shape holding 0 and 1, or one ValueError (a (2, 1)
    mask was broadcast over (2, 4) ids; an empty batch failed deep inside transformers)."""
    what = "generate() continues" if generate else "the model reads"
    if ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
        raise ValueError(
            f"input_ids of shape {tuple(ids.shape)}: {what} a batch (batch >= 1, T >= 1) of token ids; an empty "
            "prompt is a row of a padded batch whose attention_mask is all 0 (tokenizer(['', ...], padding=True)), "
            "or alone input_ids=[[eos_token_id]] with attention_mask=[[0]]"
        )
    if attention_mask is None:
        return
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != tuple(ids.shape):
        shape = (
            tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        )
        raise ValueError(
            f"attention_mask of shape {shape} for input_ids of shape {tuple(ids.shape)}: it must have input_ids' "
            "shape (1 = a token, 0 = padding); pass the tokenizer's, tokenizer(texts, padding=True, return_tensors='pt')"
        )
    if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
        raise ValueError(
            "attention_mask holds values other than 0 and 1 (1 = a token, 0 = padding); pass the tokenizer's"
        )


def sampling_of(config) -> Sampling:
    """hbpe's Sampling for a transformers GenerationConfig (None: greedy); ValueError for the options this model
    cannot honour. Greedy is hbpe's temperature 0; a draw (do_sample) is hbpe's at `temperature`, from the `top_k`
    (0: every symbol) most likely symbols and the `top_p` nucleus, from torch's global generator."""
    if config is None:
        return Sampling()
    value = _settings(config)
    bad = [f"{k}={value(k)!r}" for k, default in REFUSED.items() if value(k) not in (None, default)]
    if bad:
        raise ValueError(
            f"HbpeForCausalLM.generate: {', '.join(bad)} not supported: the local decoder chooses each token (a "
            "patch, symbol by symbol), so only greedy or do_sample with temperature, top_k and top_p apply; "
            "leave these options at their defaults"
        )
    if not value("do_sample"):
        return Sampling()
    temperature, top_k, top_p = value("temperature"), value("top_k"), value("top_p")
    if not (_is_number(temperature) and MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):  # NaN fails too
        raise ValueError(
            f"HbpeForCausalLM.generate: temperature={temperature!r} with do_sample=True must be a number in "
            f"[{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}] (as `hbpe generate` takes); for greedy text set "
            "do_sample=False"
        )
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise ValueError(f"HbpeForCausalLM.generate: top_k={top_k!r} must be an integer >= 0 (0: every symbol)")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise ValueError(
            f"HbpeForCausalLM.generate: top_p={top_p!r} must be a number in (0, 1] (1: no cut; a top_p below the "
            "largest probability is the greedy choice)"
        )
    return Sampling(float(temperature), top_k or None, top_p if top_p is not None and top_p < 1 else None)


def _settings(config):
    """config's value of an option, where unset (None) its default as transformers' generate() applies it.

    transformers 4 keeps the defaults in GenerationConfig's fields (do_sample False, top_k 50, num_beams 1); from 5
    the fields a caller did not set are None and generate() fills them from `_get_default_generation_params()`
    (top_k 50 again). Asked for by feature, not version: a config that has the method lends its defaults."""
    defaults = getattr(config, "_get_default_generation_params", dict)()

    def value(name: str):
        v = getattr(config, name, None)
        return defaults.get(name) if v is None else v

    return value


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def token_patches(tok, ids: list[int], eos: int) -> list[list[int]]:
    """First-stage ids -> their patches (no PAD); eos is the document marker [EOD]."""
    out = []
    for i in ids:
        if i == eos:
            out.append([EOD])
        elif i in tok._token_bytes:
            out.append(list(tok.token_patch(i)))
        else:
            raise ValueError(
                f"token id {i} is not a text token of this model's first stage (nor its eos {eos}); pass ids from "
                "the export's tokenizer"
            )
    return out


def ids_to_patches(tok, ids: torch.Tensor, real: torch.Tensor, eos: int) -> torch.Tensor:
    """ids (B, T) -> patches (B, T, S) long on the CPU; all PAD where `real` (B, T) is False."""
    uniq, inverse = torch.unique(ids.cpu().masked_fill(~real.cpu(), eos), return_inverse=True)
    table = torch.full((len(uniq), tok.max_patch_size), PAD, dtype=torch.long)
    for row, p in enumerate(token_patches(tok, uniq.tolist(), eos)):
        table[row, : len(p)] = torch.tensor(p)
    return table[inverse].masked_fill(~real.cpu()[..., None], PAD)


@dataclass
class _Row:
    """One prompt's state between generate() steps."""

    queue: list[int] = field(default_factory=list)  # tokens of the last patch not yet returned
    expect: list[int] = field(default_factory=list)  # the token returned, not yet fed back
    fed: list[int] = field(default_factory=list)  # fed back; the latent model has not read them yet
    advance: list[list[int]] = field(default_factory=list)  # the patches it reads once the queue is fed back
    done: bool = False  # eos was returned


class PatchCache:
    """generate()'s cache: the latent model's keys and values, each row's positions and patches in flight."""

    def __init__(self, model, tok, sampling: Sampling) -> None:
        self.model, self.tok, self.sampling = model, tok, sampling
        self.eos, self.S = model.config.eos_token_id, model.config.max_patch_size
        if model.dtype != torch.float32:
            raise ValueError(
                f"HbpeForCausalLM.generate runs hbpe's KV-cached decoder, which reads float32 weights; this model "
                f"holds {model.dtype}: load it with torch_dtype=torch.float32 (from_pretrained) or call model.float()"
            )
        self.m: CachedPatchLM | None = None  # hbpe's KV-cached model (hbpe_kv_decode.py), from the prompts on
        self.rows: list[_Row] = []
        self.seen = 0  # input_ids columns read

    def get_seq_length(self) -> int:
        return self.seen

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The ids generate() holds (B, N) -> the scores of each row's next token (B, 1, vocab_size)."""
        new = input_ids[:, self.seen :].tolist()
        self.seen = input_ids.shape[1]
        emit: dict[int, int] = {}
        advance: dict[int, list[list[int]]] = {}
        if not self.rows:  # the prompts: the document marker, then each row's real tokens
            real = [[True] * len(r) for r in new] if attention_mask is None else attention_mask.bool().tolist()
            self.rows = [_Row() for _ in new]
            for b, (ids, keep) in enumerate(zip(new, real)):
                advance[b] = [[EOD], *token_patches(self.tok, [i for i, k in zip(ids, keep) if k], self.eos)]
                if len(advance[b]) > self.model.config.max_patches:
                    raise ValueError(
                        f"prompt {b} is {len(advance[b]) - 1} tokens and the model's context holds "
                        f"{self.model.config.max_patches} patches with the document marker; shorten the prompt"
                    )
        for b, (row, ids) in enumerate(zip(self.rows, new)):
            if b in advance:
                continue
            if row.done or ids == [self.eos] != row.expect:  # generate() pads a row it finished (eos_token_id)
                row.done = True
                emit[b] = self.eos
            elif ids == row.expect:
                row.fed, row.expect = row.fed + ids, []
                if row.queue:
                    emit[b] = self._emit(row)
                else:
                    advance[b] = row.advance
            else:  # not the token this model emitted: the latent model reads the tokens it was given
                advance[b] = token_patches(self.tok, row.fed + ids, self.eos)
        emit.update(self._next_tokens(advance))
        scores = torch.full((len(new), 1, self.model.config.vocab_size), float("-inf"), device=input_ids.device)
        for b, token in emit.items():
            scores[b, 0, token] = 0.0
        return scores

    def _emit(self, row: _Row) -> int:
        token = row.queue.pop(0)
        row.expect, row.done = [token], token == self.eos
        return token

    def _next_tokens(self, advance: dict[int, list[list[int]]]) -> dict[int, int]:
        """Advance these rows' latent model by their patches, decode a patch each -> the token each returns."""
        emit = {}
        while advance:
            for b, patches in list(advance.items()):
                if self._position(b) + len(patches) > self.model.config.max_patches:
                    del advance[b]  # the latent context (max_patches) is full: the row ends
                    self.rows[b].queue, self.rows[b].fed = [self.eos], []
                    emit[b] = self._emit(self.rows[b])
            if not advance:
                break
            h = self._advance(advance)
            again = {}
            for b, symbols in zip(advance, self._decode(h)):
                tokens, patches = self._resolve(symbols)
                row = self.rows[b]
                if tokens:
                    row.queue, row.advance, row.fed = tokens, patches, []
                    emit[b] = self._emit(row)
                else:
                    again[b] = patches
            advance = again
        return emit

    def _position(self, b: int) -> int:
        """Row b's next latent position (0 before the prompts)."""
        return 0 if self.m is None else self.m.positions[b]

    def _resolve(self, symbols: list[int]) -> tuple[list[int], list[list[int]]]:
        """A decoded patch -> (the token ids of its bytes, the patches the latent model reads next), as
        `hbpe generate` finishes a patch (hbpe_patch_decode.next_patches): a patch that ends with EOP is read as it
        is, S symbols without EOP are re-encoded by the tokenizer's out-of-vocabulary rule."""
        tok = self.tok
        if symbols[-1] == EOD:
            return self._ids(tok.symbols_bytes(symbols[:-1])) + [self.eos], []
        data = tok.symbols_bytes(symbols)
        return self._ids(data), next_patches(symbols, data, tok)

    def _ids(self, data: bytes) -> list[int]:
        """Bytes -> first-stage ids (one token when they are one, as a canonical patch is)."""
        enc = self.tok.encoding
        piece = getattr(enc, "encode_single_piece", None) or enc._encode_single_piece  # private in tiktoken 0.6-0.14
        return list(piece(data)) if data else []

    def _advance(self, advance: dict[int, list[list[int]]]) -> torch.Tensor:
        """f_theta over each listed row's new patches (the other rows read none) -> h (n, D) after each listed
        row's last new patch, in `advance`'s order. The first call reads every row's prompt."""
        if self.m is None:
            self.m = CachedPatchLM(self.model)
            h = self.m.prefill([advance[b] for b in range(len(self.rows))])  # (B, D)
        else:
            h = self.m.advance([advance.get(b, []) for b in range(len(self.rows))])  # (B, D)
        return h[list(advance)]

    def _decode(self, h: torch.Tensor) -> list[list[int]]:
        """m_psi with a KV cache: h (n, D) -> one patch of symbols per row (hbpe_patch_decode.decode_patches)."""
        return decode_patches(
            self.m, h, ends=self.tok.symbol_ends_patch, max_patch_size=self.S, sampling=self.sampling,
            gens=[None] * h.shape[0],
        )  # fmt: skip
