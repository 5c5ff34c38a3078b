"""HbpeForCausalLM: hbpe's hierarchical patch LM as a transformers PreTrainedModel.

    e_t = g_phi(patch_t)             # io.encoder (LocalEncoder), every patch on its own
    h_t = f_theta(e_1..e_t)          # latent, causal over patches
    logits of patch t+1 = m_psi(patch_{t+1}^{<s}, h_t)   # io.decoder (LocalDecoder), teacher-forced

The model is not token-in/token-out: its input is `patches` (B, T, S), the second-stage symbols
of T first-stage tokens, PAD(257)-padded to S, exactly what hbpe trains on (HbpeTokenizer's
`patches` gives them). Its output `logits` (B, T-1, S, V') are, for t = 1..T-1, the distributions
of the S symbols of patch t+1 given patches 1..t and the symbols of patch t+1 before each.

Shipped verbatim in `hbpe export --format hf` folders: a copy of hbpe's training/model/layers.py and
local_models.py that imports only torch and transformers (training/checkpoint/hf/__init__.py). Parameter
names equal hbpe's, so one model.safetensors serves `hbpe eval` and transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_hbpe import HbpeConfig

PAD = 257  # fills a patch row up to S symbols; never predicted, ignored by the loss
IGNORE = -100


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x (B, H, L, Dh) at integer positions (L,)."""
    dh = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dh, 2, device=x.device, dtype=torch.float32) / dh))
    ang = positions.to(torch.float32)[:, None] * inv[None, :]  # (L, Dh/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, theta: float, dropout: float) -> None:
        super().__init__()
        self.heads, self.theta, self.dropout = heads, theta, dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, *, causal: bool, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)  # 3 x (B, H, L, Dh)
        pos = torch.arange(L, device=x.device)
        q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
        mask = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, L) True = attend
        if causal and L > 1:
            tri = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
            mask = tri if mask is None else (mask & tri)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, L, D))


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

    def forward(self, x: torch.Tensor, *, causal: bool, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), causal=causal, key_mask=key_mask)
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, *, layers: int, dim: int, ffn: int, heads: int, theta: float, dropout: float) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, ffn, heads, theta, dropout) for _ in range(layers))
        self.norm = RMSNorm(dim)

    def forward(self, x: torch.Tensor, *, causal: bool, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, causal=causal, key_mask=key_mask)
        return self.norm(x)


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
        self.head = nn.Linear(cfg.local_dim, cfg.vocab_size, bias=False)
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
        embed = nn.Embedding(cfg.vocab_size, cfg.local_dim)
        self.encoder = LocalEncoder(cfg, embed)
        self.decoder = LocalDecoder(cfg, embed)


@dataclass
class HbpeCausalLMOutput(ModelOutput):
    """loss: mean cross-entropy per predicted symbol (with `labels`); nll_sum: its sum, in nats (BPB's
    numerator); logits (B, T-1, S, V'); hidden_states: the latent states h_1..h_{T-1} (B, T-1, D)."""

    loss: torch.Tensor | None = None
    nll_sum: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None


class HbpePreTrainedModel(PreTrainedModel):
    config_class = HbpeConfig
    base_model_prefix = "hbpe"
    _tied_weights_keys = ["io.decoder.embed.weight"]  # E, stored once under io.encoder.embed.weight
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):  # as hbpe initialises a new model
            nn.init.normal_(module.weight, std=0.02)


class HbpeForCausalLM(HbpePreTrainedModel):
    """The hierarchical patch LM. Call it on patches, not token ids:

        out = model(patches=p, labels=p)   # p: (B, T, S) long, from HbpeTokenizer.patches
        out.logits                         # (B, T-1, S, V'): patch t+1's symbols from patches <= t
        out.loss, out.nll_sum              # mean / summed NLL (nats) over the real symbols of patches 2..T

    Bits per byte of a text: nll_sum / ln 2 / (UTF-8 bytes of tokens 2..T), as `hbpe eval` counts.
    """

    def __init__(self, config: HbpeConfig) -> None:
        super().__init__(config)
        self.latent = Transformer(
            layers=config.latent_layers, dim=config.latent_dim, ffn=config.latent_ffn, heads=config.latent_heads,
            theta=config.rope_theta, dropout=config.dropout,
        )  # fmt: skip
        self.io = HierarchicalIO(config)
        self.post_init()

    def forward(
        self,
        patches: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> HbpeCausalLMOutput:
        """patches (B, T, S) (or `input_ids` of that shape); labels (B, T, S): the same patches, PAD or -100
        where nothing is scored (positions 2..T are predicted, so labels[:, 0] is never read)."""
        patches = patches if patches is not None else input_ids
        if patches is None or patches.dim() != 3 or patches.shape[-1] != self.config.max_patch_size:
            shape = None if patches is None else tuple(patches.shape)
            raise ValueError(
                f"HbpeForCausalLM takes patches of shape (batch, T, S={self.config.max_patch_size}), got {shape}: "
                "encode text with the export's HbpeTokenizer (`tokenizer.patches(text)`), not token ids"
            )
        patches = patches.long()
        e = self.io.encoder(patches[:, :-1])  # (B, T-1, D): e_t = g_phi(patch_t)
        h = self.latent(e, causal=True)  # (B, T-1, D): h_t = f_theta(e_<=t)
        nxt = patches[:, 1:]  # (B, T-1, S): patch t+1, teacher-forced into m_psi
        B, T, S = nxt.shape
        logits = self.io.decoder(h.reshape(B * T, -1), nxt.reshape(B * T, S)).view(B, T, S, -1)  # (B, T-1, S, V)
        loss = nll = None
        if labels is not None:
            tgt = labels[:, 1:].long()  # (B, T-1, S)
            tgt = tgt.masked_fill(tgt == PAD, IGNORE).reshape(-1)
            flat = logits.reshape(-1, logits.shape[-1]).float()
            nll = F.cross_entropy(flat, tgt, ignore_index=IGNORE, reduction="sum")
            loss = nll / (tgt != IGNORE).sum().clamp_min(1)
        out = HbpeCausalLMOutput(loss=loss, nll_sum=nll, logits=logits, hidden_states=h)
        return out if return_dict is not False else out.to_tuple()

    def generate(self, *args, **kwargs):
        raise NotImplementedError(
            "HbpeForCausalLM.generate: transformers' generate() is token by token, this model emits patches of "
            "symbols (a local decoder inside a latent step), so it has no generate(); use hbpe's patch-by-patch "
            "decoder: `hbpe generate --checkpoint EXPORT_DIR --prompt TEXT` (EXPORT_DIR is this folder)"
        )
