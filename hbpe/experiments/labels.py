"""How a results row is named in tables and plots: its scheme, plus what the experiment varies."""

from __future__ import annotations

from typing import Any

WIDTH_KEY = "latent_dim"  # a width ladder scales every width together; the latent one names the rung


def row_label_suffix(r: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """S, the first-stage vocabulary, the learning rate or the width when the experiment varies them (within the
    row's scheme for S, lr and width), so that no two rows of a table or lines of a plot share a name."""
    same_io = [x for x in results if x["io"] == r["io"]]
    parts = []
    if len({x["max_patch_size"] for x in same_io}) > 1 and r["io"] == "hierarchical":
        parts.append(f"S={r['max_patch_size']}")
    if len({x["first_stage_vocab"] for x in results}) > 1:
        parts.append(f"V={r['first_stage_vocab']}")
    if len({x.get("lr") for x in same_io}) > 1:
        parts.append(f"lr={r['lr']:g}")
    if len({x["model"].get(WIDTH_KEY) for x in same_io}) > 1:
        parts.append(f"width {r['model'][WIDTH_KEY]}")
    return f" ({', '.join(parts)})" if parts else ""
