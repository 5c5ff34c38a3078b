"""The paper's Table 1 FLOPs under each reading of its local FFN, at its own patch lengths.

The paper's numbers disagree on the local models' FFN width: its parameter counts imply 768, its
FLOPs 384, its hyper-parameter table says 512 (hbpe's `small` and `medium` keep 512). `hbpe flops`
shows what each reading gives next to the paper's GFLOPs, for the rows measured on the shards and
for the paper's own setup: the small size, 8,192 bytes, the paper's patch lengths, and the byte
baselines with the boundaries given by the patcher (BLT's setup, model.patching.boundaries=given):

    space patch, max 6         4.29 bytes per patch: the paper's 6.22 bytes per word (4.12 bytes
                               per gpt2 token x fertility 1.51) over its space fertility 1.45
    entropy patch, max 6       3.45 bytes per patch (the paper's mean patch lengths)
    entropy patch, unbounded   4.49
    BPE-patch                  4.12 bytes, 4.13 symbols per patch, V' = 470 (SPEC section 1)

At FFN 384 these give 533 / 668 / 510 GFLOPs against the paper's 534 / 668 / 509; at 512, the
width trained, 2.0-2.6% more.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hbpe.schemas.train_config import ModelConfig, model_config
from hbpe.training.data.byte_patching import BYTE_VOCAB
from hbpe.training.model.flops import paper_forward_flops

LOCAL_FFN_READINGS = (384, 512, 768)  # what the paper's FLOPs, table and parameter counts imply
PAPER_BYTES_PER_WORD = 4.12 * 1.51  # gpt2 on SlimPajama: bytes per token x fertility (SPEC section 1)
GPT2_VOCAB = 50257

# the paper's Table 1 (SPEC section 1): GFLOPs (8,192 bytes), fertility, params (M), BPB
PAPER_TABLE1: dict[str, dict[str, float]] = {
    "entropy patch, unbounded": {"gflops": 509, "fertility": 1.41, "params_m": 351, "bpb": 1.24},
    "entropy patch, max 6": {"gflops": 668, "fertility": 1.83, "params_m": 351, "bpb": 1.20},
    "space patch, max 6": {"gflops": 534, "fertility": 1.45, "params_m": 351, "bpb": 1.14},
    "byte level": {"gflops": 4214, "fertility": 4.5, "params_m": 85, "bpb": 1.16},
    "BPE": {"gflops": 562, "fertility": 1.51, "params_m": 123, "bpb": 1.16},
    "BPE-patch": {"gflops": 554, "fertility": 1.51, "params_m": 99.7, "bpb": 1.11},
}

# the paper's patch lengths for its rows with local models: (io, bytes per patch, symbols per patch, V)
_PAPER_PATCHING: dict[str, tuple[str, float, float | None, int]] = {
    "space patch, max 6": ("space", PAPER_BYTES_PER_WORD / 1.45, None, BYTE_VOCAB),
    "entropy patch, max 6": ("space", 3.45, None, BYTE_VOCAB),  # the FLOPs read only the patch lengths
    "entropy patch, unbounded": ("space", 4.49, None, BYTE_VOCAB),
    "BPE-patch": ("hierarchical", 4.12, 4.13, 470),
}


def gflops_by_local_ffn(
    cfg: ModelConfig, *, input_bytes: float, bytes_per_patch: float, symbols_per_patch: float, vocab_size: int
) -> dict[str, float]:
    """Total forward GFLOPs of `cfg` with its local FFN set to each reading: {"384": ..., "512": ..., "768": ...}."""
    return {
        str(ffn): paper_forward_flops(
            dataclasses.replace(cfg, local_ffn=ffn), input_bytes=input_bytes, bytes_per_patch=bytes_per_patch,
            symbols_per_patch=symbols_per_patch, vocab_size=vocab_size,
        )["total"] / 1e9
        for ffn in LOCAL_FFN_READINGS
    }  # fmt: skip


def paper_setup_rows(input_bytes: int = 8192) -> list[dict[str, Any]]:
    """The paper's rows with local models at its small size and patch lengths, boundaries given, per FFN reading."""
    rows = []
    for label, (io, bpp, spp, vocab) in _PAPER_PATCHING.items():
        cfg = model_config("small", io=io, patching={"boundaries": "given"})
        symbols = bpp if spp is None else spp  # given boundaries: a byte patch is its bytes, no EOP
        rows.append(
            {
                "scheme": label,
                "bytes_per_patch": bpp,
                "symbols_per_patch": symbols,
                "paper_gflops": PAPER_TABLE1[label]["gflops"],
                "gflops_by_local_ffn": gflops_by_local_ffn(
                    cfg, input_bytes=input_bytes, bytes_per_patch=bpp, symbols_per_patch=symbols, vocab_size=vocab
                ),
            }
        )
    return rows


def _ffn_table(title: str, rows: list[dict[str, Any]], *, bytes_per_patch: bool, paper: Any) -> str:
    """Rows' GFLOPs at each local FFN reading as Markdown, the paper's number (`paper(row)`) last."""
    head = " | ".join(f"FFN {f}" for f in LOCAL_FFN_READINGS)
    extra = " bytes/patch |" if bytes_per_patch else ""
    lines = [
        title,
        f"| model |{extra} {head} | paper |",
        "|---|" + "---|" * (len(LOCAL_FFN_READINGS) + 1 + bytes_per_patch),
    ]
    for r in rows:
        g = r["gflops_by_local_ffn"]
        cells = " | ".join(f"{g[str(f)]:.1f}" for f in LOCAL_FFN_READINGS)
        bpp = f" {r['bytes_per_patch']:.2f} |" if bytes_per_patch else ""
        lines.append(f"| {r['scheme']} |{bpp} {cells} | {paper(r)} |")
    return "\n".join(lines)


def render_paper_setup(rows: list[dict[str, Any]]) -> str:
    """The paper-setup check as Markdown: GFLOPs at each local FFN reading next to the paper's."""
    title = "the paper's setup (small, 8,192 bytes, its patch lengths, given boundaries), GFLOPs by local FFN reading:"
    return _ffn_table(title, rows, bytes_per_patch=True, paper=lambda r: r["paper_gflops"])


def with_ffn_readings(row: dict[str, Any], cfg: ModelConfig, *, vocab_size: int) -> dict[str, Any]:
    """A measured Table 1 row (scheme_stats.table1_row) plus its GFLOPs per local FFN reading and the paper's
    numbers for that row; the paper-setup check of the row (when it has local models) as `paper_setup`."""
    readings = gflops_by_local_ffn(
        cfg, input_bytes=row["input_bytes"], bytes_per_patch=row["bytes_per_patch"],
        symbols_per_patch=row["symbols_per_patch"], vocab_size=vocab_size,
    )  # fmt: skip
    setup = {r["scheme"]: r for r in paper_setup_rows()}
    return {
        **row,
        "gflops_by_local_ffn": readings,
        "paper": PAPER_TABLE1.get(row["scheme"]),
        "paper_setup": setup.get(row["scheme"]),
    }


def render_ffn_readings(rows: list[dict[str, Any]]) -> str:
    """The measured rows' GFLOPs at each local FFN reading, with the paper's GFLOPs beside them."""
    title = (
        "the same rows by reading of the paper's local FFN (it trains 512; its parameters imply 768, its FLOPs 384):"
    )
    return _ffn_table(
        title, rows, bytes_per_patch=False, paper=lambda r: r["paper"]["gflops"] if r.get("paper") else "–"
    )
