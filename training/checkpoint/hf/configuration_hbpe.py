"""HbpeConfig: an hbpe hierarchical patch LM's shape, as transformers reads it (config.json).

Shipped verbatim in `hbpe export --format hf` folders; imports only transformers (training/checkpoint/hf/__init__.py).
"""

from __future__ import annotations

from transformers import PretrainedConfig


class HbpeConfig(PretrainedConfig):
    """The fields of hbpe's ModelConfig the hierarchical model reads, plus the tokenizer's shape.

    vocab_size is the first stage's vocabulary (the tokenizer's `input_ids`, `len(tokenizer)`: one
    first-stage token is one patch), symbol_vocab_size V' (second-stage symbols, the local models'
    alphabet), max_patch_size S (symbols per patch). eos_token_id (also pad) is the first stage's
    end-of-text token, which the model reads and writes as the document marker EOD.
    tie_word_embeddings: the symbol table E is one matrix read by the local encoder and decoder.
    """

    model_type = "hbpe"
    attribute_map = {"hidden_size": "latent_dim", "num_hidden_layers": "latent_layers"}

    def __init__(
        self,
        vocab_size: int = 257,
        symbol_vocab_size: int = 259,
        max_patch_size: int = 10,
        latent_layers: int = 2,
        latent_dim: int = 64,
        latent_ffn: int = 128,
        latent_heads: int = 4,
        local_dim: int = 64,
        local_ffn: int = 128,
        local_heads: int = 4,
        encoder_layers: int = 1,
        decoder_layers: int = 1,
        pooling: str = "mean",
        conditioning: str = "prefix",
        dropout: float = 0.0,
        rope_theta: float = 10000.0,
        max_patches: int = 4096,
        **kwargs,
    ) -> None:
        if pooling not in ("mean", "eop") or conditioning not in ("prefix", "add"):
            raise ValueError(
                f"HbpeConfig: pooling={pooling!r} (mean, eop), conditioning={conditioning!r} (prefix, add): "
                "use a config.json written by `hbpe export --format hf`"
            )
        self.vocab_size, self.symbol_vocab_size, self.max_patch_size = vocab_size, symbol_vocab_size, max_patch_size
        self.latent_layers, self.latent_dim, self.latent_ffn, self.latent_heads = (
            latent_layers,
            latent_dim,
            latent_ffn,
            latent_heads,
        )
        self.local_dim, self.local_ffn, self.local_heads = local_dim, local_ffn, local_heads
        self.encoder_layers, self.decoder_layers = encoder_layers, decoder_layers
        self.pooling, self.conditioning = pooling, conditioning
        self.dropout, self.rope_theta, self.max_patches = dropout, rope_theta, max_patches
        kwargs.setdefault("tie_word_embeddings", True)  # E: one table for g_phi and m_psi (the head is its own)
        super().__init__(**kwargs)
