"""The scheme registry: one SchemeSpec per `model.io`, registered once (torchtitan's TrainSpec).

A scheme is how a model reads and writes text: its batches, its PatchIO, how it generates and
scores zero-shot pairs, its FLOPs terms and its Table 1 label. Code outside the specs asks
`scheme_spec(cfg)` and never compares `model.io` to a name, so a new scheme is one module that
subclasses SchemeSpec and calls `register_scheme` (tests/training/toy_scheme.py is one).

The registry is a leaf (it imports schemas/ only): the rooms that ask it (data, model, checkpoint,
inference) are the rooms the specs' hooks come from, so the built-in specs are loaded by name on the
first lookup rather than imported here, and the import graph keeps no cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.schemes import BUILTIN_SCHEMES, add_scheme_name, scheme_names

if TYPE_CHECKING:
    from hbpe.schemas.train_config import ModelConfig

_SPECS: dict[str, SchemeSpec] = {}


class SchemeSpec:
    """What differs by scheme. A subclass sets `name`, the flags that apply and the hooks below."""

    name: ClassVar[str]
    # one embedding row per latent position (bpe, bytes): batches carry `tokens`, the latent model carries the
    # head, no local models (FLOPs count no local terms)
    embedding: ClassVar[bool] = False
    # patches of bytes cut by a patcher (space, entropy): BLT's options apply (model.patching.boundaries, hash n-grams)
    byte_patches: ClassVar[bool] = False
    # patches cut by a byte LM's entropies (entropy): the run keeps that model, checked (entropy_files.py)
    uses_entropy_model: ClassVar[bool] = False
    # predicts the next byte at every latent position (bytes): can serve as another run's entropy model
    next_byte: ClassVar[bool] = False
    # patches are the second-stage tokenizer's (hierarchical): S is the tokenizer's, an HF class exists
    tokenizer_patches: ClassVar[bool] = False
    # generates one latent position per byte, without patches (bytes: byte_generation.generate_bytes)
    per_position_generation: ClassVar[bool] = False

    def build_io(self, cfg: ModelConfig, vocab: Any) -> Any:
        """The PatchIO around the latent model (training/model/patch_io.py); `vocab`: a VocabSpec."""
        raise NotImplementedError

    def batches(self, cfg: ModelConfig, tok: Any, *, derive: bool, entropy: Any = None) -> Any:
        """The batch builder (training/data/schemes.py's Scheme): rows of `tokens` -> the model's batch."""
        raise NotImplementedError

    def label(self, cfg: ModelConfig) -> str:
        """The row's name in Table 1 (training/inference/scheme_stats.py)."""
        raise NotImplementedError

    def latent_input(self, batch: dict[str, Any]) -> Any:
        """The batch array with one row per latent position: `tokens` (B, N) or `patches` (B, N, S) (FLOPs)."""
        return batch["tokens"] if self.embedding else batch["patches"]

    def generation_symbols(self, model: Any, tok: Any) -> Any:
        """What generate.py reads a patch's symbols with (the tokenizer, or byte_generation.ByteSymbols)."""
        return tok

    def prompt_patches(self, symbols: Any, prompt: str) -> list[list[int]]:
        """The prompt as the latent model's positions after the document marker, each a list of real symbols."""
        raise NotImplementedError

    def cached_generation(self, cfg: ModelConfig) -> bool:
        """Whether kv_decode.py can generate for this model (else the modules' path, recomputing each step)."""
        return True

    def never_generated(self, cfg: ModelConfig) -> tuple[int, ...]:
        """Symbols the local decoder may emit but training never targeted (PAD aside)."""
        return ()

    def pair_scheme(self, model: Any, tok: Any) -> Any:
        """How zero-shot scoring turns text pairs into inputs (training/inference/zero_shot/pairs.py's PairScheme)."""
        raise NotImplementedError


def register_scheme(spec: SchemeSpec) -> SchemeSpec:
    """Make `spec` the scheme of `model.io=spec.name`; configs may name it from now on."""
    if not isinstance(spec, SchemeSpec):
        raise TypeError(f"register_scheme takes a SchemeSpec instance, got {type(spec).__name__}")
    if spec.name in _SPECS and type(_SPECS[spec.name]) is not type(spec):
        raise ConfigError(f"model.io={spec.name} is registered already (by {type(_SPECS[spec.name]).__name__})")
    _SPECS[spec.name] = spec
    add_scheme_name(spec.name)
    return spec


def scheme_spec(cfg: ModelConfig | str) -> SchemeSpec:
    """The spec of a model config's `io` (or of a scheme's name).

    >>> scheme_spec("bytes").embedding, scheme_spec("space").byte_patches
    (True, True)
    """
    name = cfg if isinstance(cfg, str) else cfg.io
    if name not in _SPECS and name in BUILTIN_SCHEMES:
        importlib.import_module(f"{__package__}.{name}")  # registers it (the built-ins are loaded on first use)
    spec = _SPECS.get(name)
    if spec is None:
        raise ConfigError(
            f"model.io={name} is not a scheme hbpe knows (known: {', '.join(scheme_names())}); "
            "retrain with a supported model.io, or register the scheme (training/schemes/registry.py)"
        )
    return spec
