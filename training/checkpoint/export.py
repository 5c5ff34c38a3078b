"""`hbpe export`: any checkpoint hbpe reads -> a self-contained model directory (export_format.py), which
transformers also loads with `format="hf"` (hf_export.py)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from hbpe.pipeline import storage
from hbpe.schemas.errors import ConfigError
from hbpe.training.checkpoint.export_format import (
    FORMATS,
    _check_out,
    _check_remote_out,
    upload_export,
    write_export,
)
from hbpe.training.checkpoint.hf_export import check_hf_exportable
from hbpe.training.checkpoint.load import entropy_of, load_model
from hbpe.training.schemes.registry import scheme_spec


def export_model(checkpoint: str, out: str, *, overwrite: bool = False, format: str = "hbpe") -> dict[str, Any]:
    """Any checkpoint `load_model` reads (local or in a bucket) -> a self-contained model directory `out`
    (local, or a bucket prefix); returns a summary. `format="hf"`: transformers loads it too (hf_export.py)."""
    t0 = time.perf_counter()
    if format not in FORMATS:
        raise ConfigError(f"--format {format}: not an export format; use one of {', '.join(FORMATS)}")
    remote_out = storage.is_remote(out)
    if remote_out:  # before the (possibly large) model is read
        _check_remote_out(out, overwrite=overwrite)
    else:
        _check_out(Path(out), overwrite=overwrite)
    model, tok, meta = load_model(checkpoint)
    if format == "hf":
        check_hf_exportable(model.cfg)
    entropy = entropy_of(model.cfg) if scheme_spec(model.cfg).uses_entropy_model else None  # before `out` changes
    where = checkpoint if storage.is_remote(checkpoint) else str(Path(checkpoint).resolve())
    source = meta.get("source") or {"checkpoint": where}
    hf = format == "hf"
    if not remote_out:
        summary = write_export(model, tok, out, source=source, overwrite=overwrite, entropy=entropy, hf=hf)
    else:
        with tempfile.TemporaryDirectory(prefix="hbpe-export-") as tmp:
            summary = {**write_export(model, tok, tmp, source=source, entropy=entropy, hf=hf), "out": out}
            upload_export(tmp, out)
    return {"checkpoint": checkpoint, **summary, "format": format, "seconds": round(time.perf_counter() - t0, 3)}
