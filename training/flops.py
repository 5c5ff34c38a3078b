"""Forward FLOPs as in the Chinchilla paper's appendix F, and the SPEC's hierarchical formula.

    F = T*Tr(p, D_enc, L_enc, V=0) + T*Tr(p, D_dec, L_dec, V=V') + Tr(T, D_G, L_G, V=0)

Tr counts, per layer: QKV and output projections (2*n*4*d*d), attention logits and
values (2*2*n*n*d), softmax (3*heads*n*n), and the MLP (2*n*mats*d*ffn, mats=3 for our
SwiGLU where Chinchilla's ReLU MLP has 2); embeddings cost 0, logits 2*n*d*V.
"""

from __future__ import annotations

from schemas.train_config import ModelConfig


def transformer_flops(
    n: float, d: int, layers: int, vocab: int = 0, *, ffn: int | None = None, heads: int = 1, mlp_mats: int = 3
) -> float:
    ffn = 4 * d if ffn is None else ffn
    attn = 2 * n * 4 * d * d + 2 * 2 * n * n * d + 3 * heads * n * n
    mlp = 2 * n * mlp_mats * d * ffn
    return layers * (attn + mlp) + 2 * n * d * vocab


def hierarchical_forward_flops(cfg: ModelConfig, *, patches: float, patch_len: float, vocab_size: int) -> float:
    """The SPEC's F for T patches of average length p (symbols)."""
    enc = transformer_flops(patch_len, cfg.local_dim, cfg.encoder_layers, 0, ffn=cfg.local_ffn, heads=cfg.local_heads)
    dec = transformer_flops(
        patch_len, cfg.local_dim, cfg.decoder_layers, vocab_size, ffn=cfg.local_ffn, heads=cfg.local_heads
    )
    lat = transformer_flops(patches, cfg.latent_dim, cfg.latent_layers, 0, ffn=cfg.latent_ffn, heads=cfg.latent_heads)
    return patches * enc + patches * dec + lat


def train_flops_per_sample(
    cfg: ModelConfig, *, seq_len: int, max_patch_size: int, vocab_size: int, n_vocab: int
) -> float:
    """Forward + backward (3x forward) FLOPs actually computed for one sample (padded S positions)."""
    T = seq_len - 1
    if cfg.io == "bpe":
        fwd = transformer_flops(
            T, cfg.latent_dim, cfg.latent_layers, n_vocab + 2, ffn=cfg.latent_ffn, heads=cfg.latent_heads
        )
    else:
        fwd = hierarchical_forward_flops(cfg, patches=T, patch_len=max_patch_size, vocab_size=vocab_size)
    return 3.0 * fwd
