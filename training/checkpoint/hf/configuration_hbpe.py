"""HbpeConfig: an hbpe hierarchical patch LM's shape, as transformers reads it (config.json).

Shipped verbatim in `hbpe export --format hf` folders; imports only transformers (training/checkpoint/hf/__init__.py).
"""

from __future__ import annotations

import math
import sys

OLDEST_PYTHON = (3, 11)  # the hbpe_*.py modules of the folder are hbpe's own (typing.Self, ...), as hbpe needs


def check_python(version: tuple[int, ...]) -> None:
    """One ImportError naming both versions where the folder's code cannot run (transformers reads this file first).

    >>> check_python((3, 10, 13))
    Traceback (most recent call last):
    ImportError: this hbpe export (hbpe's own model code, hbpe_*.py) needs Python 3.11 or newer; this is Python 3.10.13: ...
    """
    if tuple(version[:2]) < OLDEST_PYTHON:
        raise ImportError(
            f"this hbpe export (hbpe's own model code, hbpe_*.py) needs Python {'.'.join(map(str, OLDEST_PYTHON))} "
            f"or newer; this is Python {'.'.join(map(str, version[:3]))}: load it from a Python 3.11+ environment"
        )


check_python(tuple(sys.version_info))  # before transformers: an older Python is named, not a failed import deep inside

from transformers import PretrainedConfig  # noqa: E402

# hbpe's bounds, copied (this file imports no hbpe) and held equal by tests/training/test_hf_guards.py: the model's
# sizes (schemas/train_config.py MODEL_SIZE_LIMITS), V' and S (schemas/tokenizer_artifact.py MAX_VOCAB_SIZE,
# MAX_PATCH_SIZE_LIMIT). config.json is untrusted: transformers builds whatever it says (latent_dim 1e12 asked for
# 4 TB, heads 0 divided by zero, a NaN rope_theta generated garbage), so it is checked before a tensor is allocated.
SIZE_LIMITS = {
    "latent_layers": 1024, "latent_dim": 65536, "latent_ffn": 262144, "latent_heads": 1024, "local_dim": 65536,
    "local_ffn": 262144, "local_heads": 1024, "encoder_layers": 1024, "decoder_layers": 1024, "max_patches": 1 << 20,
}  # fmt: skip
SYMBOLS_RANGE = (259, 1 << 16)  # V': the 256 bytes, EOP, PAD and EOD, then the merges
PATCH_SIZE_RANGE = (1, 255)  # S
# the first stage's vocabulary (hbpe bounds it by the tokenizer it checks against; the largest tiktoken encoding,
# o200k, has 200k tokens): generate() writes a row of scores this long for every new token
FIRST_STAGE_RANGE = (1, 1 << 22)
FIX = "config.json was edited or damaged: export the model again (`hbpe export --format hf`)"


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
        self.check()

    def check(self, *, model: bool = False) -> None:
        """Every size an integer in hbpe's range, heads that split their width, finite numbers; `model`: an eos id
        too (the document marker the model reads). One ValueError, before anything is allocated; the model checks
        again (from_pretrained(DIR, latent_heads=0) sets a field after __init__)."""
        ranges = {
            **{name: (1, limit) for name, limit in SIZE_LIMITS.items()},
            "vocab_size": FIRST_STAGE_RANGE, "symbol_vocab_size": SYMBOLS_RANGE, "max_patch_size": PATCH_SIZE_RANGE,
        }  # fmt: skip
        for name, (lo, hi) in ranges.items():
            value = getattr(self, name)
            if not _is_int(value) or not lo <= value <= hi:
                _refuse(f"{name}={value!r} must be an integer in {lo}..{hi}")
        for dim, heads in (("latent_dim", "latent_heads"), ("local_dim", "local_heads")):
            d, h = getattr(self, dim), getattr(self, heads)
            if d % h or (d // h) % 2:  # RoPE rotates pairs of channels within a head
                _refuse(f"{dim}={d} must split into an even head size over {heads}={h}")
        if not (_is_number(self.rope_theta) and math.isfinite(self.rope_theta) and self.rope_theta > 0):
            _refuse(f"rope_theta={self.rope_theta!r} must be a finite number > 0 (RoPE's base, e.g. 10000)")
        if not (_is_number(self.dropout) and 0 <= self.dropout < 1):  # NaN fails both comparisons
            _refuse(f"dropout={self.dropout!r} must be a number in [0, 1)")
        # transformers 5.0 sets no eos_token_id on a config that was given none (4 and later 5.x set None): the
        # default HbpeConfig() that to_diff_dict() builds has none
        eos = getattr(self, "eos_token_id", None)
        if (model or eos is not None) and not (_is_int(eos) and 0 <= eos < self.vocab_size):
            _refuse(f"eos_token_id={eos!r} must be one token id in 0..{self.vocab_size - 1} (the document marker)")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON `true` must not pass as 1


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _refuse(problem: str) -> None:
    raise ValueError(f"HbpeConfig: {problem}; {FIX}")
