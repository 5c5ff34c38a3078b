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

Shipped verbatim in `hbpe export --format hf` folders: a copy of hbpe's training/model/layers.py and
local_models.py that imports only torch and transformers (training/checkpoint/hf/__init__.py). Parameter
names equal hbpe's, so one model.safetensors serves `hbpe eval` and transformers.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_hbpe import HbpeConfig
from .generation_hbpe import EOD, IGNORE, PAD, PatchCache, Sampling, check_inputs, ids_to_patches, op_threads

# generate() hands its cache to prepare_inputs_for_generation and reads it back from the model's output under one
# name: `past_key_values` in transformers 4 and 5.0, `cache` in the 5.x that renamed it (5.24; it refuses an output
# class without that field). Read from transformers' own signature rather than its version, so a release on either
# side of the rename is served by the same file.
CACHE_NAME = (
    "cache" if "cache" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    else "past_key_values"
)  # fmt: skip


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


@functools.lru_cache(maxsize=64)
def _inverse_frequencies(dh: int, theta: float, device: torch.device) -> torch.Tensor:
    """RoPE's (Dh/2,) frequencies, computed once per shape and device (generate() calls rope for every symbol)."""
    return 1.0 / (theta ** (torch.arange(0, dh, 2, device=device, dtype=torch.float32) / dh))


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x (B, H, L, Dh) at integer positions (L,), or (B, L): each row its own."""
    ang = positions.to(torch.float32)[..., None] * _inverse_frequencies(
        x.shape[-1], theta, x.device
    )  # (L or B, L, Dh/2)
    if ang.dim() == 3:
        ang = ang[:, None]  # (B, 1, L, Dh/2): over the heads
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


KV = tuple[torch.Tensor, torch.Tensor]  # one layer's keys and values (B, H, K, Dh), the cached ones first


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, theta: float, dropout: float) -> None:
        super().__init__()
        self.heads, self.theta, self.dropout = heads, theta, dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, past: KV | None = None
    ) -> tuple[torch.Tensor, KV]:
        """x (B, L, D) at `positions`; mask (B or 1, 1, L, K) True = attend, over past's keys then x's."""
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)  # 3 x (B, H, L, Dh)
        q, k = rope(q, positions, self.theta), rope(k, positions, self.theta)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, L, D)), (k, v)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, dim: int, ffn: int, heads: int, theta: float, dropout: float) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.attn = Attention(dim, heads, theta, dropout)
        self.mlp = SwiGLU(dim, ffn)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, past: KV | None = None
    ) -> tuple[torch.Tensor, KV]:
        y, kv = self.attn(self.norm1(x), positions, mask, past)
        x = x + y
        return x + self.mlp(self.norm2(x)), kv


class Transformer(nn.Module):
    def __init__(self, *, layers: int, dim: int, ffn: int, heads: int, theta: float, dropout: float) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, ffn, heads, theta, dropout) for _ in range(layers))
        self.norm = RMSNorm(dim)

    def forward(self, x: torch.Tensor, *, causal: bool, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, L, D) at positions 0..L-1; key_mask (B, L) True = a real key."""
        L = x.shape[1]
        mask = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, L)
        if causal and L > 1:
            tri = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            mask = tri if mask is None else (mask & tri)
        return self.attend(x, torch.arange(L, device=x.device), mask)[0]

    def attend(
        self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, past: list[KV] | None = None
    ) -> tuple[torch.Tensor, list[KV]]:
        """x (B, L, D) at positions (L,) or (B, L), after the cached keys `past` (one per block): the normed
        output and every block's keys and values, the cached ones included (generation's KV cache)."""
        cache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, positions, mask, None if past is None else past[i])
            cache.append(kv)
        return self.norm(x), cache


def _local(cfg: HbpeConfig, layers: int) -> Transformer:
    return Transformer(
        layers=layers, dim=cfg.local_dim, ffn=cfg.local_ffn, heads=cfg.local_heads, theta=cfg.rope_theta,
        dropout=cfg.dropout,
    )  # fmt: skip


class LocalEncoder(nn.Module):
    """g_phi: a patch of S symbols -> one latent input e_t (bidirectional over the patch, pooled)."""

    def __init__(self, cfg: HbpeConfig, embed: nn.Embedding) -> None:
        super().__init__()
        self.pooling = cfg.pooling
        self.embed = embed
        self.transformer = _local(cfg, cfg.encoder_layers)
        self.to_latent = nn.Linear(cfg.local_dim, cfg.latent_dim, bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """(B, T, S) symbols -> e (B, T, D)."""
        B, T, S = patches.shape
        flat = patches.reshape(B * T, S)  # (M, S)
        real = flat != PAD  # (M, S)
        key_mask = real.clone()
        key_mask[:, 0] = True  # an all-PAD patch still attends somewhere: no NaN rows
        x = self.transformer(self.embed(flat), causal=False, key_mask=key_mask)  # (M, S, d)
        if self.pooling == "mean":
            w = real.unsqueeze(-1).to(x.dtype)  # (M, S, 1)
            pooled = (x * w).sum(1) / w.sum(1).clamp_min(1.0)  # (M, d)
        else:
            last = real.sum(1).clamp_min(1) - 1  # (M,) the last real symbol
            pooled = x[torch.arange(B * T, device=x.device), last]  # (M, d)
        return self.to_latent(pooled).view(B, T, -1)  # (B, T, D)


class LocalDecoder(nn.Module):
    """m_psi: h_t and the first s-1 symbols of patch t+1 -> logits of its symbol s."""

    def __init__(self, cfg: HbpeConfig, embed: nn.Embedding) -> None:
        super().__init__()
        self.conditioning = cfg.conditioning
        self.from_latent = nn.Linear(cfg.latent_dim, cfg.local_dim, bias=False)
        self.start = nn.Parameter(torch.zeros(cfg.local_dim)) if cfg.conditioning == "add" else None
        self.transformer = _local(cfg, cfg.decoder_layers)
        self.head = nn.Linear(cfg.local_dim, cfg.symbol_vocab_size, bias=False)
        self.embed = embed

    def inputs(self, h: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """h (M, D), prefix symbols (M, k) -> decoder inputs (M, k+1, d)."""
        c = self.from_latent(h).unsqueeze(1)  # (M, 1, d)
        emb = self.embed(prefix)  # (M, k, d)
        if self.conditioning == "prefix":
            return torch.cat([c, emb], dim=1)  # (M, k+1, d)
        return torch.cat([self.start.expand(emb.shape[0], 1, -1), emb], dim=1) + c  # (M, k+1, d)

    def forward(self, h: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: h (M, D), the patches it predicts (M, S) -> logits (M, S, V)."""
        return self.head(self.transformer(self.inputs(h, patches[:, :-1]), causal=True))  # (M, S, V)


class HierarchicalIO(nn.Module):
    """hbpe's HierarchicalPatchIO: one symbol table E shared by g_phi and m_psi (two state-dict names)."""

    def __init__(self, cfg: HbpeConfig) -> None:
        super().__init__()
        embed = nn.Embedding(cfg.symbol_vocab_size, cfg.local_dim)
        self.encoder = LocalEncoder(cfg, embed)
        self.decoder = LocalDecoder(cfg, embed)


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
        super().__init__(config)
        self.latent = Transformer(
            layers=config.latent_layers, dim=config.latent_dim, ffn=config.latent_ffn, heads=config.latent_heads,
            theta=config.rope_theta, dropout=config.dropout,
        )  # fmt: skip
        self.io = HierarchicalIO(config)
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
        h = self.latent(self.io.encoder(patches[:, :-1]), causal=True)  # (B, T-1, D): h_t = f_theta(g_phi(patch_<=t))
        tgt = None if labels is None else labels[:, 1:].long()
        return self._decode(h, patches[:, 1:], tgt)

    def _forward_ids(
        self, ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor | None
    ) -> HbpeCausalLMOutput:
        """[EOD] + the tokens' patches; left or right padding (attention_mask 0) is masked and never scored."""
        B, T = ids.shape
        real = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        patches = ids_to_patches(self.patch_tokenizer(), ids, real, self.config.eos_token_id).to(ids.device)
        doc = torch.full((B, 1, patches.shape[-1]), PAD, dtype=torch.long, device=ids.device)
        doc[:, 0, 0] = EOD
        inputs = torch.cat([doc, patches[:, :-1]], dim=1)  # (B, T, S): the marker, then tokens 1..T-1
        keys = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=ids.device), real[:, :-1]], dim=1)  # (B, T)
        positions = keys.long().cumsum(1) - 1  # each row's own positions: padding does not shift them
        mask = keys[:, None, None, :] & torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        h = self.latent.attend(self.io.encoder(inputs), positions, mask)[0]  # (B, T, D)
        # token t is predicted from the last real position before it (the marker, after left padding)
        last = torch.where(keys, torch.arange(T, device=ids.device), 0).cummax(1).values  # (B, T)
        h = h.gather(1, last[..., None].expand(-1, -1, h.shape[-1]))
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

    def _decode(self, h: torch.Tensor, nxt: torch.Tensor, tgt: torch.Tensor | None) -> HbpeCausalLMOutput:
        """h (B, T, D), the patches it predicts (B, T, S) teacher-forced into m_psi, their targets (PAD: not scored)."""
        B, T, S = nxt.shape
        logits = self.io.decoder(h.reshape(B * T, -1), nxt.reshape(B * T, S)).view(B, T, S, -1)  # (B, T, S, V')
        loss = nll = None
        if tgt is not None:
            tgt = tgt.masked_fill(tgt == PAD, IGNORE).reshape(-1)
            flat = logits.reshape(-1, logits.shape[-1]).float()
            nll = F.cross_entropy(flat, tgt, ignore_index=IGNORE, reduction="sum")
            loss = nll / (tgt != IGNORE).sum().clamp_min(1)
        return HbpeCausalLMOutput(loss=loss, nll_sum=nll, logits=logits, hidden_states=h)

    # ---- generate()

    def generate(self, inputs: torch.Tensor | None = None, generation_config=None, tokenizer=None, **kwargs):
        """transformers' generate(), each new token a patch of the local decoder (see the class docstring)."""
        config = copy.deepcopy(generation_config if generation_config is not None else self.generation_config)
        config.update(**kwargs)
        sampling = Sampling.of(config)
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        if isinstance(ids, torch.Tensor):  # before transformers' own code, which fails on them with other words
            check_inputs(ids, kwargs.get("attention_mask"), generate=True)
        if tokenizer is not None:  # transformers reads it for stop_strings; this model maps ids to patches with it
            kwargs["tokenizer"] = tokenizer
            if getattr(tokenizer, "token_patch", None) is not None:
                self.hbpe_tokenizer = tokenizer
        self._sampling = sampling
        try:
            with op_threads(self, 1 if ids is None else ids.shape[0]):
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
            step = PatchCache(self, self.patch_tokenizer(), getattr(self, "_sampling", Sampling()))
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
