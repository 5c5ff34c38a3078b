"""Each scheme's patching measured on shards, and the paper's Table 1 columns from it.

One read of the shards' `tokens` column serves every scheme: each scheme cuts the same
samples (training/data/schemes.py) and is measured on the text it predicts (tokens 2..N):

- bytes per patch:   predicted text bytes / predicted text positions;
- symbols per patch: real symbols of a predicted text patch, EOP included (1 for bpe, bytes);
- fertility:         predicted text positions / whitespace-separated words of the same text
                     (the paper's F for the first stage, first-stage tokens per word, at T = text).

`table1` then gives, per scheme, the paper's forward FLOPs for `input_bytes` of text
(training/model/flops.py, Chinchilla's count), the parameters as the paper counts them, and these.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from hbpe.schemas.symbols import EOD, PAD
from hbpe.schemas.train_config import ModelConfig, TrainConfig
from hbpe.training.checkpoint.load import load_entropy_model
from hbpe.training.data.byte_patching import sample_units
from hbpe.training.data.schemes import Scheme, build_scheme, vocabulary_bytes
from hbpe.training.data.token_rows import read_token_rows
from hbpe.training.model.build import build_model
from hbpe.training.model.flops import paper_forward_flops
from hbpe.training.model.paper_flops import with_ffn_readings
from hbpe.training.model.patch_lm import VocabSpec, parameter_counts
from hbpe.training.schemes.registry import scheme_spec
from hbpe.training.train.calibration import threshold_on_shards
from hbpe.training.train.config_io import check_local

_WHITESPACE = np.zeros(259, dtype=bool)
_WHITESPACE[[9, 10, 11, 12, 13, 32, EOD]] = True  # ASCII whitespace (str.split on bytes), and document marks


@dataclass(frozen=True)
class PatchingStats:
    samples: int
    bytes: int  # predicted text bytes
    words: int
    positions: int  # predicted text positions (patches, tokens or bytes)
    symbols: int  # real symbols in them

    @property
    def bytes_per_patch(self) -> float:
        return self.bytes / max(self.positions, 1)

    @property
    def symbols_per_patch(self) -> float:
        return self.symbols / max(self.positions, 1)

    @property
    def fertility(self) -> float:
        return self.positions / max(self.words, 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "bytes_per_patch": self.bytes_per_patch,
            "symbols_per_patch": self.symbols_per_patch,
            "fertility": self.fertility,
        }


def measure(scheme: Scheme, io: str, tokens: np.ndarray, words: int, *, batch_size: int = 16) -> PatchingStats:
    nbytes = positions = symbols = 0
    for i in range(0, len(tokens), batch_size):
        b = scheme.batch(tokens[i : i + batch_size], None)
        nbytes += int(b["target_bytes"].sum())
        positions += int(b["text_positions"].sum())
        if scheme_spec(io).embedding:
            symbols += int(b["text_positions"].sum())
            continue
        patches = b["patches"]
        for row, first in zip(patches, b["first_target"], strict=True):
            predicted = row[first:]
            text = predicted[predicted[:, 0] != EOD]
            symbols += int((text != PAD).sum())
    return PatchingStats(len(tokens), nbytes, words, positions, symbols)


def output_vocab(cfg: ModelConfig, tok) -> int:
    """The output vocabulary each scheme predicts over (the V of the FLOPs' logits term)."""
    with torch.device("meta"):
        return build_model(cfg, VocabSpec.from_tokenizer(tok)).io.vocab_size


def table1_row(cfg: ModelConfig, tok, stats: PatchingStats, *, input_bytes: int) -> dict[str, Any]:
    """The paper's Table 1 columns for one scheme: GFLOPs by part, fertility, params, patching."""
    with torch.device("meta"):  # shapes only: a medium model costs nothing here
        model = build_model(cfg, VocabSpec.from_tokenizer(tok))
    flops = paper_forward_flops(
        cfg,
        input_bytes=input_bytes,
        bytes_per_patch=stats.bytes_per_patch,
        symbols_per_patch=stats.symbols_per_patch,
        vocab_size=model.io.vocab_size,
    )
    return {
        "scheme": scheme_label(cfg),
        "io": cfg.io,
        "gflops": {k: v / 1e9 for k, v in flops.items()},
        "params": parameter_counts(model),
        "input_bytes": input_bytes,
        **stats.to_dict(),
    }


def scheme_label(cfg: ModelConfig) -> str:
    """The paper's row names."""
    return scheme_spec(cfg).label(cfg)


def scheme_variants(base: ModelConfig) -> list[ModelConfig]:
    """The paper's six rows on `base`'s sizes; the two entropy rows only when base names an entropy model."""
    import dataclasses

    out = [dataclasses.replace(base, io=io) for io in ("hierarchical", "bpe", "bytes", "space")]
    p = base.patching
    if p.entropy_model and (p.entropy_threshold is not None or p.entropy_target_bytes is not None):
        out += [dataclasses.replace(base.with_patching(entropy_bounded=b), io="entropy") for b in (True, False)]
    return out


def with_measured_data(cfg: TrainConfig, data: str | None) -> TrainConfig:
    """`cfg` measured on shards `data` (`hbpe flops --data`) instead of its own; then its local paths checked.

    `flops` reads one shard directory and nothing else of the config's data, so with `data` the
    config's data.train, data.eval and data.streams are dropped rather than required to exist:
    a shipped config's relative `runs/demo/...` paths exist only in the repo root.
    """
    import dataclasses

    if data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, train=data, eval=None, streams=None))
    check_local(cfg)  # --data (or data.train) exists, data.tokenizer too when set
    return cfg


def flops_table(
    base: ModelConfig, tok, shards: str, *, input_bytes: int = 8192, samples: int = 256
) -> list[dict[str, Any]]:
    """Table 1 for every scheme on `shards`: patching measured on its first `samples` samples."""

    tokens = read_token_rows(shards, tok, samples=samples)
    words = count_words(tokens, vocabulary_bytes(tok))
    rows, entropy = [], None
    for cfg in scheme_variants(base):
        if scheme_spec(cfg).uses_entropy_model:
            entropy = entropy or load_entropy_model(cfg.patching.entropy_model)
            if cfg.patching.entropy_threshold is None:
                cfg = cfg.with_patching(entropy_threshold=threshold_on_shards(cfg, tok, shards, entropy))
        scheme = build_scheme(cfg, tok, derive=True, entropy_model=entropy)
        row = table1_row(cfg, tok, measure(scheme, cfg.io, tokens, words), input_bytes=input_bytes)
        rows.append(with_ffn_readings(row, cfg, vocab_size=output_vocab(cfg, tok)))  # paper_flops.py
    return rows


def render_table1(rows: list[dict[str, Any]]) -> str:
    """The paper's Table 1 as Markdown (GFLOPs for `input_bytes` of text), with the parts of the FLOPs."""
    head = (
        "| model | GFLOPs | enc | dec | latent | fertility | params | bytes/patch | symbols/patch |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        g = r["gflops"]
        lines.append(
            f"| {r['scheme']} | {g['total']:.1f} | {g['local_encoder']:.1f} | {g['local_decoder']:.1f} | "
            f"{g['latent']:.1f} | {r['fertility']:.2f} | {r['params']['total'] / 1e6:.2f}M | "
            f"{r['bytes_per_patch']:.2f} | {r['symbols_per_patch']:.2f} |"
        )
    return "\n".join(lines)


def count_words(tokens: np.ndarray, vocab) -> int:
    """Whitespace-separated words in the predicted text of these rows (a marker separates words)."""
    words = 0
    for row in tokens:
        s = sample_units(row, vocab)
        space = _WHITESPACE[s.units[s.context :]]
        words += int((~space & np.concatenate([[True], space[:-1]])).sum())
    return words
