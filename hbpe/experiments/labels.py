"""How a results row is named in tables and plots: its scheme, plus what the experiment varies."""

from __future__ import annotations

from typing import Any


def row_label_suffix(r: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """S or the first-stage vocabulary when the experiment varies them."""
    parts = []
    if len({x["max_patch_size"] for x in results if x["io"] == "hierarchical"}) > 1 and r["io"] == "hierarchical":
        parts.append(f"S={r['max_patch_size']}")
    if len({x["first_stage_vocab"] for x in results}) > 1:
        parts.append(f"V={r['first_stage_vocab']}")
    return f" ({', '.join(parts)})" if parts else ""
