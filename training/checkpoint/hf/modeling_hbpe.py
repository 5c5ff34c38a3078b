"""HbpeForCausalLM: hbpe's hierarchical patch LM as a transformers PreTrainedModel.

    e_t = g_phi(patch_t)             # io.encoder (LocalEncoder), every patch on its own
    h_t = f_theta(e_1..e_t)          # latent, causal over patches
    logits of patch t+1 = m_psi(patch_{t+1}^{<s}, h_t)   # io.decoder (LocalDecoder), teacher-forced

One first-stage token is one patch: the model takes token ids (`input_ids`, the tokenizer's), maps
each to its patch (the second-stage symbols of the token, PAD(257)-padded to S) through its
tokenizer, and puts the document marker patch [EOD] before each row, as hbpe's documents start.
`logits` (B, T, S, V') are the distributions of the S symbols of token t's patch given the marker,
tokens < t and the symbols of its patch before each. `patches` (B, T, S), hbpe's own batch layout,
is accepted as well. generate() is generation_hbpe.py's.

The modules are hbpe's own: the hbpe_*.py files beside this one are copies of hbpe's library modules
(training/model/*, training/inference/kv_decode.py, patch_decode.py, sampling.py and the schemas they
read), written by `hbpe export --format hf` with only their import lines rewritten
(training/checkpoint/hf_library.py). This file and generation_hbpe.py are the transformers adapter
around them. Parameter names equal hbpe's, so one model.safetensors serves `hbpe eval` and transformers.
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_hbpe import HbpeConfig
from .generation_hbpe import PatchCache, check_inputs, ids_to_patches, op_threads, sampling_of

# transformers copies a local folder's remote code one import deep: the files this module imports, not what those
# import. So every copy of hbpe's modules is imported here by name, and each reaches transformers' module cache
# (tests/training/test_hf_library.py checks that the list is whole).
from .hbpe_config_check import Section  # noqa: F401
from .hbpe_errors import HbpeError  # noqa: F401
from .hbpe_hash_ngrams import HashNgramEmbedding  # noqa: F401
from .hbpe_kv_decode import CachedPatchLM  # noqa: F401
from .hbpe_layers import Transformer  # noqa: F401
from .hbpe_local_models import LocalDecoder  # noqa: F401
from .hbpe_locations import check_location  # noqa: F401
from .hbpe_names import is_plain_file_name  # noqa: F401
from .hbpe_packing import PatchPacking  # noqa: F401
from .hbpe_patch_attention import patch_attention  # noqa: F401
from .hbpe_patch_decode import decode_patches  # noqa: F401
from .hbpe_patch_io import IGNORE, HierarchicalPatchIO, cross_entropy_sum
from .hbpe_patch_lm import PatchLM
from .hbpe_sampling import Sampling  # noqa: F401
from .hbpe_schemes import scheme_names  # noqa: F401
from .hbpe_symbols import EOD, PAD
from .hbpe_tile_layout import tile_width  # noqa: F401
from .hbpe_tiles import TileRows  # noqa: F401
from .hbpe_train_config import ModelConfig

# generate() hands its cache to prepare_inputs_for_generation and reads it back from the model's output under one
# name: `past_key_values` in transformers 4 and 5.0, `cache` in the 5.x that renamed it (5.24; it refuses an output
# class without that field). Read from transformers' own signature rather than its version, so a release on either
# side of the rename is served by the same file.
CACHE_NAME = (
    "cache" if "cache" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    else "past_key_values"
)  # fmt: skip
# HbpeConfig's fields that are hbpe ModelConfig fields: they win over config.json's copy of the whole ModelConfig
# (`hbpe_model`), since transformers lets a caller set them (from_pretrained(DIR, dropout=0.1))
SHAPE = (
    "latent_layers", "latent_dim", "latent_ffn", "latent_heads", "local_dim", "local_ffn", "local_heads",
    "encoder_layers", "decoder_layers", "pooling", "conditioning", "dropout", "rope_theta", "max_patches",
)  # fmt: skip


def model_config(config: HbpeConfig) -> ModelConfig:
    """hbpe's ModelConfig of this model, checked by hbpe's own rules (ConfigError, a ValueError)."""
    fields = dict(getattr(config, "hbpe_model", None) or {})
    fields.update({name: getattr(config, name) for name in SHAPE}, io="hierarchical")
    return ModelConfig.from_dict(fields)


@dataclass
class HbpeCausalLMOutput(ModelOutput):
    """loss: mean cross-entropy per predicted symbol (with `labels`); nll_sum: its sum, in nats (BPB's
    numerator); logits: the symbols' (B, T, S, V') (see HbpeForCausalLM), or in generate() the next token's
    (B, 1, vocab_size); hidden_states: the latent states (B, T, D); past_key_values (transformers 4, 5.0) or
    cache (later 5.x): generate()'s PatchCache, under the name this transformers reads (CACHE_NAME)."""

    loss: torch.Tensor | None = None
    nll_sum: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None
    # one field, under generate()'s name: transformers 5.24 renames a `past_key_values` argument to `cache` on its
    # way into an output class, and transformers 4 reads `past_key_values` only
    if CACHE_NAME == "cache":
        cache: PatchCache | None = None
    else:
        past_key_values: PatchCache | None = None


class HbpePreTrainedModel(PreTrainedModel):
    config_class = HbpeConfig
    base_model_prefix = "hbpe"
    _tied_weights_keys = {"io.decoder.embed.weight": "io.encoder.embed.weight"}  # E, stored once under the encoder
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):  # as hbpe initialises a new model
            nn.init.normal_(module.weight, std=0.02)


class HbpeForCausalLM(HbpePreTrainedModel, GenerationMixin):
    """The hierarchical patch LM, on token ids (one first-stage token = one patch) or on patches.

        out = model(input_ids=ids, attention_mask=m, labels=ids)  # ids (B, T): HbpeTokenizer's input_ids
        out.logits            # (B, T, S, V'): the symbols of token t's patch given the document marker and tokens < t
        out.loss, out.nll_sum # mean / summed NLL (nats) over the real symbols of every labelled token
        model.generate(**tok(prompts, return_tensors="pt", padding=True), max_new_tokens=20)

    The model puts the document marker patch [EOD] before each row (hbpe's documents start with
    it), so every token is predicted, the first one included; the tokenizer's eos token is EOD.
    Labels are the input ids, -100 (or attention_mask 0) where a token is not scored. attention_mask has
    input_ids' shape and holds 0 and 1; a row of zeros is an empty prompt: the document marker alone (nothing
    scored; generate() continues it as `hbpe generate --prompt ''` does).
    `model(patches=p, labels=p)`, p (B, T, S) from `tokenizer.patches`, is hbpe's own batch layout:
    logits (B, T-1, S, V') of patches 2..T.

    Bits per byte of a text: nll_sum / ln 2 / (its UTF-8 bytes), as `hbpe eval` counts.

    generate(): each step the latent model advances one patch and the local decoder emits the next
    patch symbol by symbol (greedy, or a draw at `temperature` from the `top_k` / `top_p` symbols, as
    `hbpe generate` does), with KV caches in both (generation_hbpe.py); the patch is the next token.
    The next-token scores generate() sees are that choice (0 for the chosen token, -inf elsewhere):
    the choice is the local decoder's, so options that reweight tokens (beams, repetition penalties,
    banned words) are refused. Sampling draws from torch's global generator (`torch.manual_seed`).
    """

    _is_stateful = True  # the cache holds each row's patches, which generate() cannot roll back

    def __init__(self, config: HbpeConfig) -> None:
        config.check(model=True)  # before any tensor: a field set after HbpeConfig.__init__ is checked here
        cfg = model_config(config)
        super().__init__(config)
        io = HierarchicalPatchIO(cfg, vocab_size=config.symbol_vocab_size, max_patch_size=config.max_patch_size)
        lm = PatchLM(cfg, io)  # hbpe's model; its modules are this one's, under hbpe's names
        self.cfg, self.latent, self.io = cfg, lm.latent, lm.io
        self.hbpe_tokenizer = None  # HbpeTokenizer: token ids <-> patches; read from the model's folder when first used
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' from_pretrained, then every weight checked finite (it loads NaN as readily as numbers)."""
        loaded = super().from_pretrained(*args, **kwargs)
        check_finite_weights(loaded[0] if isinstance(loaded, tuple) else loaded)  # output_loading_info=True: a pair
        return loaded

    def get_input_embeddings(self) -> nn.Embedding:
        return self.io.encoder.embed  # E: the symbol table (V', d) that g_phi and m_psi read

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.io.encoder.embed = self.io.decoder.embed = value

    def get_output_embeddings(self) -> None:
        return None  # m_psi's head is its own matrix, never tied to E

    def patch_tokenizer(self):
        """The HbpeTokenizer that maps token ids to patches: `hbpe_tokenizer`, or the one saved beside the model."""
        if self.hbpe_tokenizer is None:
            from .tokenization_hbpe import HbpeTokenizer

            where = self.config._name_or_path
            try:
                self.hbpe_tokenizer = HbpeTokenizer.from_pretrained(where)
            except (OSError, ValueError) as e:
                raise ValueError(
                    f"HbpeForCausalLM reads token ids through its tokenizer, and found none in {where!r} ({e}); save "
                    "the tokenizer beside the model (tokenizer.save_pretrained(DIR)) or set model.hbpe_tokenizer = "
                    "AutoTokenizer.from_pretrained(EXPORT_DIR, trust_remote_code=True)"
                ) from None
        return self.hbpe_tokenizer

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        patches: torch.Tensor | None = None,
        past_key_values: PatchCache | None = None,
        return_dict: bool | None = None,
        cache: PatchCache | None = None,
        **kwargs,
    ) -> HbpeCausalLMOutput:
        """Token ids (B, T) with attention_mask and labels (B, T); or patches (B, T, S) (also passed as
        input_ids of that shape) with labels (B, T, S): the same patches, PAD or -100 where nothing is
        scored (positions 2..T are predicted, so labels[:, 0] is never read). past_key_values (transformers 4's
        name) or cache (later 5.x's): generate()'s PatchCache."""
        step = cache if cache is not None else past_key_values
        if step is not None:
            out = HbpeCausalLMOutput(logits=step.step(input_ids, attention_mask), **{CACHE_NAME: step})
        elif patches is not None or (input_ids is not None and input_ids.dim() == 3):
            out = self._forward_patches(patches if patches is not None else input_ids, labels)
        elif input_ids is not None and input_ids.dim() == 2:
            check_inputs(input_ids, attention_mask)
            out = self._forward_ids(input_ids, attention_mask, labels)
        else:
            shape = None if input_ids is None else tuple(input_ids.shape)
            raise ValueError(
                f"HbpeForCausalLM takes input_ids (batch, T) or patches (batch, T, S={self.config.max_patch_size}), "
                f"got input_ids of shape {shape}: encode text with the export's tokenizer (`tokenizer(texts)`)"
            )
        return out if return_dict is not False else out.to_tuple()

    def _forward_patches(self, patches: torch.Tensor, labels: torch.Tensor | None) -> HbpeCausalLMOutput:
        shape = tuple(patches.shape)
        if len(shape) != 3 or shape[-1] != self.config.max_patch_size or shape[0] < 1 or shape[1] < 2:
            raise ValueError(
                f"HbpeForCausalLM takes patches of shape (batch >= 1, T >= 2, S={self.config.max_patch_size}), got "
                f"{shape}: encode text with the export's HbpeTokenizer (`tokenizer.patches(text)`)"
            )
        patches = patches.long()
        h = self.latent(self.io.encode_patches(patches[:, :-1]), causal=True)  # (B, T-1, D): f_theta(g_phi(...))
        tgt = None if labels is None else labels[:, 1:].long()
        return self._decode(h, patches[:, 1:], tgt)

    def _forward_ids(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor | None
    ) -> HbpeCausalLMOutput:
        """[EOD] + the tokens' patches; left or right padding (attention_mask 0) is left out and never scored."""
        real = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        patches = ids_to_patches(self.patch_tokenizer(), ids, real, self.config.eos_token_id).to(ids.device)
        h = self._latent_states(patches, real)  # (B, T, D)
        tgt = None
        if labels is not None:
            if bool(((labels != IGNORE) & (labels != ids)).any()):
                raise ValueError(
                    "labels differ from input_ids where they are scored: a causal LM's labels are its input_ids, "
                    "with -100 where a token is not scored (the model shifts them itself)"
                )
            scored = (labels != IGNORE) & real  # (B, T)
            tgt = patches.masked_fill(~scored[..., None], PAD)
        return self._decode(h, patches, tgt)

    def _latent_states(self, patches: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """h (B, T, D): at position t, f_theta after the document marker and the row's real tokens before t.

        Each row is hbpe's document: the marker, then its real tokens at positions 0, 1, ... (padding anywhere
        in the row shifts nothing), through hbpe's own modules as `hbpe eval` runs them, with no mask. Rows
        with the same number of real tokens run as one batch. A padded position reads the state after the
        real tokens before it (the marker's, before a left-padded row's first token).
        """
        B, T, S = patches.shape
        counts = real.sum(1)  # (B,)
        before = real.long().cumsum(1) - real.long()  # (B, T) real tokens before each position
        marker = torch.full((1, S), PAD, dtype=torch.long, device=patches.device)
        marker[0, 0] = EOD  # the document marker patch: EOD, then PAD
        order, states = [], []
        for n in sorted(set(counts.tolist())):
            rows = (counts == n).nonzero().squeeze(1)  # (r,)
            width = min(n + 1, T)  # the marker and the tokens; the last token only where a padded position reads it
            seq = torch.stack([torch.cat([marker, patches[b][real[b]]])[:width] for b in rows.tolist()])  # (r, w, S)
            h = self.latent(self.io.encode_patches(seq), causal=True)  # (r, w, D)
            at = before.index_select(0, rows).clamp_max(width - 1)  # (r, T)
            states.append(h.gather(1, at[..., None].expand(-1, -1, h.shape[-1])))  # (r, T, D)
            order.append(rows)
        inverse = torch.argsort(torch.cat(order))  # (B,) back to the batch's row order
        return torch.cat(states).index_select(0, inverse)

    def _decode(self, h: torch.Tensor, nxt: torch.Tensor, tgt: torch.Tensor | None) -> HbpeCausalLMOutput:
        """h (B, T, D), the patches it predicts (B, T, S) teacher-forced into m_psi, their targets (PAD: not scored)."""
        B, T, S = nxt.shape
        logits = self.io.decoder(h.reshape(B * T, -1), nxt.reshape(B * T, S)).view(B, T, S, -1)  # (B, T, S, V')
        loss = nll = None
        if tgt is not None:
            tgt = tgt.masked_fill(tgt == PAD, IGNORE).reshape(-1)
            nll = cross_entropy_sum(logits.reshape(-1, logits.shape[-1]), tgt)  # hbpe eval's sum, fp32
            loss = nll / (tgt != IGNORE).sum().clamp_min(1)
        return HbpeCausalLMOutput(loss=loss, nll_sum=nll, logits=logits, hidden_states=h)

    # ---- generate()

    def generate(self, inputs: torch.Tensor | None = None, generation_config=None, tokenizer=None, **kwargs):
        """transformers' generate(), each new token a patch of the local decoder (see the class docstring)."""
        config = copy.deepcopy(generation_config if generation_config is not None else self.generation_config)
        config.update(**kwargs)
        sampling = sampling_of(config)
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        if isinstance(ids, torch.Tensor):  # before transformers' own code, which fails on them with other words
            check_inputs(ids, kwargs.get("attention_mask"), generate=True)
        if tokenizer is not None:  # transformers reads it for stop_strings; this model maps ids to patches with it
            kwargs["tokenizer"] = tokenizer
            if getattr(tokenizer, "token_patch", None) is not None:
                self.hbpe_tokenizer = tokenizer
        self._sampling = sampling
        try:
            with op_threads(self.cfg, self.device, 1 if ids is None else ids.shape[0]):
                return super().generate(inputs, generation_config=generation_config, **kwargs)
        finally:
            del self._sampling

    def prepare_inputs_for_generation(
        self, input_ids: torch.Tensor, past_key_values=None, attention_mask=None, cache=None, **kwargs
    ) -> dict:
        """All of input_ids each step (PatchCache knows which it has read), with the cache under CACHE_NAME.
        transformers 5.24 hands the first step an empty DynamicCache of its own making (it no longer asks
        `_is_stateful`): anything but a PatchCache starts this model's."""
        step = cache if cache is not None else past_key_values
        if not isinstance(step, PatchCache):
            step = PatchCache(self, self.patch_tokenizer(), getattr(self, "_sampling", None) or sampling_of(None))
        return {"input_ids": input_ids, "attention_mask": attention_mask, CACHE_NAME: step}


def check_finite_weights(model: nn.Module) -> None:
    """Every loaded floating-point weight is finite, or one ValueError naming the first that is not (hbpe's loader
    refuses them too, training/checkpoint/load_checks.py): a diverged run's NaN generated one repeated token."""
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if not t.is_floating_point() or t.numel() == 0 or t.is_meta:  # meta: offloaded by a device_map
            continue
        lo, hi = torch.aminmax(t.detach())  # NaN if any value is, +-inf if any is: cheaper than isfinite().all()
        if not (math.isfinite(lo) and math.isfinite(hi)):
            bad = t.numel() - int(torch.isfinite(t).sum())
            raise ValueError(
                f"HbpeForCausalLM: weight {name} in {model.config._name_or_path!r} holds {bad} non-finite values (NaN "
                f"or inf) of {t.numel()}: the training run diverged (or the file was damaged) before it was saved; "
                "export an earlier checkpoint of the run (`hbpe export --format hf`)"
            )
