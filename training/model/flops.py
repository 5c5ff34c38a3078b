"""Forward FLOPs: the paper's figure (Chinchilla's appendix F) and the count our blocks compute.

The SPEC's formula for the hierarchical model, Y bytes in T = Y / (bytes per patch) patches
of p symbols on average:

    F = T*Tr(p, D_enc, L_enc, V=0) + T*Tr(p, D_dec, L_dec, V=V') + Tr(T, D_G, L_G, V=0)

and for the BPE baseline F = Tr(T, D_G, L_G, V=vocab). Tr counts, per layer: QKV and output
projections (2*n*4*d*d), attention logits and values (2*2*n*n*d), softmax (3*heads*n*n) and
the MLP (2*n*mats*d*ffn); embeddings cost 0, logits 2*n*d*V.

- `paper_forward_flops`: Chinchilla's two MLP matrices (mats=2), the number the paper's
  Table 1 reports (562 GFLOPs for the small BPE model on 8,192 bytes). Use it to compare
  with the paper and between schemes.
- `train_flops_per_sample`: what a training step computes in the padded layout: SwiGLU's three
  MLP matrices, all S symbol positions of every patch (PAD included), the patch <-> latent
  projections, and 3x forward for forward + backward.
- `local_train_flops`: the local models' part counted from a batch's real patch lengths as
  `model.local_layout` runs them (packed: real symbols only), with the FLOPs spent on PAD. The
  Composer model's `flops_per_batch` (SpeedMonitor's MFU, the experiments' executed compute)
  is the latent part of `train_flops_per_sample` plus this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hbpe.schemas.symbols import PAD
from hbpe.schemas.train_config import ModelConfig
from hbpe.training.schemes.registry import scheme_spec

if TYPE_CHECKING:
    from torch import Tensor

CHINCHILLA_MLP_MATS = 2  # the paper's transformer (Chinchilla appendix F)
SWIGLU_MLP_MATS = 3  # gate, up and down: what training/model/layers.py computes


def transformer_flops(
    n: float, d: int, layers: int, vocab: int = 0, *, ffn: int | None = None, heads: int = 1, mlp_mats: int
) -> float:
    """Tr(n, d, L, V): forward FLOPs of an L-layer transformer on n positions.

    >>> transformer_flops(1, 2, 1, ffn=4, heads=1, mlp_mats=2)  # 2*4*4 + 4*2 + 3 + 2*2*2*4
    75.0
    """
    return stack_flops(n, n * n, d, layers, vocab, ffn=ffn, heads=heads, mlp_mats=mlp_mats)


def stack_flops(
    positions: float, pairs: float, d: int, layers: int, vocab: int = 0, *, ffn: int | None, heads: int, mlp_mats: int
) -> float:
    """`transformer_flops` split by what scales how: position-wise work on `positions`, attention on
    `pairs` of (query, key) positions (n*n for one sequence of n; the sum over the patches of a batch).

    >>> stack_flops(2, 4, 2, 1, ffn=4, heads=1, mlp_mats=2) == transformer_flops(2, 2, 1, ffn=4, mlp_mats=2)
    True
    """
    ffn = 4 * d if ffn is None else ffn
    attn = 2 * positions * 4 * d * d + 2 * 2 * pairs * d + 3 * heads * pairs
    mlp = 2 * positions * mlp_mats * d * ffn
    return float(layers * (attn + mlp) + 2 * positions * d * vocab)


def forward_flops_by_part(
    cfg: ModelConfig, *, patches: float, patch_len: float, vocab_size: int, mlp_mats: int
) -> dict[str, float]:
    """{local_encoder, local_decoder, latent, total} for T patches of p symbols.

    `vocab_size` is the output vocabulary: V' for the hierarchical model, the first stage's
    for the BPE baseline (whose latent transformer then carries the logits).
    """
    embedding = scheme_spec(cfg).embedding  # one embedding row per latent position, no local models
    latent_vocab = vocab_size if embedding else 0
    latent = transformer_flops(
        patches, cfg.latent_dim, cfg.latent_layers, latent_vocab, ffn=cfg.latent_ffn, heads=cfg.latent_heads,
        mlp_mats=mlp_mats,
    )  # fmt: skip
    enc = dec = 0.0
    if not embedding:
        local = dict(ffn=cfg.local_ffn, heads=cfg.local_heads, mlp_mats=mlp_mats)
        enc = patches * transformer_flops(patch_len, cfg.local_dim, cfg.encoder_layers, 0, **local)
        dec = patches * transformer_flops(patch_len, cfg.local_dim, cfg.decoder_layers, vocab_size, **local)
    return {"local_encoder": enc, "local_decoder": dec, "latent": latent, "total": enc + dec + latent}


def paper_forward_flops(
    cfg: ModelConfig,
    *,
    input_bytes: float,
    bytes_per_patch: float,
    symbols_per_patch: float,
    vocab_size: int,
) -> dict[str, float]:
    """The paper's forward FLOPs for `input_bytes` of text (Table 1 uses 8,192).

    `bytes_per_patch` and `symbols_per_patch` are measured on the data (e.g. `hbpe eval`);
    for the BPE baseline a patch is a first-stage token and `symbols_per_patch` is unused.
    """
    return forward_flops_by_part(
        cfg,
        patches=input_bytes / bytes_per_patch,
        patch_len=symbols_per_patch,
        vocab_size=vocab_size,
        mlp_mats=CHINCHILLA_MLP_MATS,
    )


def train_flops_per_sample(cfg: ModelConfig, *, seq_len: int, max_patch_size: int, vocab_size: int) -> float:
    """Forward + backward (3x forward) FLOPs one sample really costs, for MFU.

    `vocab_size` is the model's output vocabulary (V', or the BPE head's rows).
    """
    T = seq_len - 1
    fwd = forward_flops_by_part(
        cfg, patches=T, patch_len=max_patch_size, vocab_size=vocab_size, mlp_mats=SWIGLU_MLP_MATS
    )["total"]
    if not scheme_spec(cfg).embedding:
        fwd += 2 * 2 * T * cfg.local_dim * cfg.latent_dim  # to_latent and from_latent, once per patch
    return 3.0 * fwd


def local_train_flops(
    cfg: ModelConfig, patches: Tensor, *, vocab_size: int, tiles: tuple[int, int, int] | None = None
) -> dict[str, float]:
    """Forward + backward FLOPs of the local models on one batch of patches (B, N, S), as `cfg.local_layout`
    runs them, and the part of them spent on PAD -> {executed, pad}.

    Packed (training/model/packing.py): position-wise work and attention on the real symbols only (an
    all-PAD patch the encoder reads keeps one position: its only PAD). Padded: all S positions of every patch.
    `tiles` = (encoder rows, decoder rows, W) of the loader's tiles (training/data/tile_layout.py): every row,
    empty ones too, and W x W query-key pairs per tile, as they run; what is not a real symbol's is PAD.
    The encoder reads patches 1..N-1, the decoder predicts patches 2..N (training/model/patch_io.py).
    """
    local = dict(ffn=cfg.local_ffn, heads=cfg.local_heads, mlp_mats=SWIGLU_MLP_MATS)
    S = patches.shape[-1]
    executed = useful = 0.0
    tile_rows = (tiles[0], tiles[1]) if tiles is not None else (None, None)
    for (rows, layers, vocab, keep_first), laid in zip(
        (
            (patches[:, :-1], cfg.encoder_layers, 0, True),  # g_phi keeps an all-PAD patch's first position
            (patches[:, 1:], cfg.decoder_layers, vocab_size, False),
        ),
        tile_rows,
        strict=True,
    ):
        real = (rows != PAD).reshape(-1, S).sum(-1).double()  # (M,) real symbols per patch
        kept = real.clamp_min(1) if keep_first else real
        M = float(real.numel())
        useful += stack_flops(float(real.sum()), float((real * real).sum()), cfg.local_dim, layers, vocab, **local)
        if laid is not None:  # the loader's tiles: every row, W x W pairs per tile
            executed += stack_flops(float(laid), float(laid * tiles[2]), cfg.local_dim, layers, vocab, **local)
        elif cfg.local_layout == "packed":  # each patch attends within itself, over its kept positions
            executed += stack_flops(
                float(kept.sum()), float((kept * kept).sum()), cfg.local_dim, layers, vocab, **local
            )
        else:
            executed += stack_flops(M * S, M * S * S, cfg.local_dim, layers, vocab, **local)
    return {"executed": 3.0 * executed, "pad": 3.0 * (executed - useful)}


def batch_train_flops(
    cfg: ModelConfig, x: Tensor, *, vocab_size: int, tiles: tuple[int, int, int] | None = None
) -> dict[str, float]:
    """Forward + backward FLOPs of one training batch -> {executed, pad, paper}: as run, the part of that
    spent on PAD, and the paper's count (Chinchilla's two MLP matrices, patches of the batch's mean length).

    `x` is the batch's `tokens` (B, N) for the embedding schemes, its `patches` (B, N, S) otherwise; `tiles`:
    the loader's tiles, where the batch has them (local_train_flops).
    """
    B, N = x.shape[:2]
    T = N - 1
    if scheme_spec(cfg).embedding:
        paper = forward_flops_by_part(cfg, patches=T, patch_len=1, vocab_size=vocab_size, mlp_mats=CHINCHILLA_MLP_MATS)
        executed = B * train_flops_per_sample(cfg, seq_len=N, max_patch_size=1, vocab_size=vocab_size)
        return {"executed": executed, "pad": 0.0, "paper": 3.0 * B * paper["total"]}
    latent = forward_flops_by_part(cfg, patches=T, patch_len=1, vocab_size=vocab_size, mlp_mats=SWIGLU_MLP_MATS)
    latent_fwd = latent["latent"] + 2 * 2 * T * cfg.local_dim * cfg.latent_dim  # + to_latent and from_latent
    local = local_train_flops(cfg, x, vocab_size=vocab_size, tiles=tiles)
    # the paper's count at this batch's own patches: p = its mean real symbols per predicted patch
    p = float((x[:, 1:] != PAD).sum()) / max(B * T, 1)
    paper = forward_flops_by_part(cfg, patches=T, patch_len=p, vocab_size=vocab_size, mlp_mats=CHINCHILLA_MLP_MATS)
    return {
        "executed": B * 3.0 * latent_fwd + local["executed"],
        "pad": local["pad"],
        "paper": 3.0 * B * paper["total"],
    }
