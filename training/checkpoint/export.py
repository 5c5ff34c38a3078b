"""`hbpe export`: any checkpoint hbpe reads -> a self-contained model directory (export_format.py), which
transformers also loads with `format="hf"` (hf_export.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hbpe.pipeline import storage
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.training.checkpoint.export_format import (
    _OURS,
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
        with _nothing_partial(out, _local_undo(Path(out))):
            summary = write_export(model, tok, out, source=source, overwrite=overwrite, entropy=entropy, hf=hf)
    else:
        with tempfile.TemporaryDirectory(prefix="hbpe-export-") as tmp:
            with _nothing_partial(f"the temporary folder {tmp} (uploaded to {out} once whole)", lambda: None):
                summary = {**write_export(model, tok, tmp, source=source, entropy=entropy, hf=hf), "out": out}
            upload_export(tmp, out)
    return {"checkpoint": checkpoint, **summary, "format": format, "seconds": round(time.perf_counter() - t0, 3)}


# a full disk or quota, or the process's file size limit (`ulimit -f`, with SIGXFSZ ignored): what the user can fix
_NO_SPACE = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "a file would pass the file size limit (ulimit -f)",
}


def no_space_reason(e: BaseException) -> str | None:
    """What ran out, when `e` (or an exception it came from) says a disk, a quota or a file size limit is full.

    safetensors' SafetensorError is no OSError: it carries the OS's text ("File too large (os error 27)").

    >>> no_space_reason(OSError(errno.EFBIG, "File too large"))
    'a file would pass the file size limit (ulimit -f)'
    """
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for code, reason in _NO_SPACE.items():
            if (isinstance(e, OSError) and e.errno == code) or os.strerror(code) in str(e):
                return reason
        e = e.__cause__ or e.__context__
    return None


def _local_undo(dest: Path) -> Callable[[], None]:
    """Removes what an export into `dest` is about to write: the folders it creates (mkdir parents=True), else the
    export's own entries in `dest` (an --overwrite had begun replacing an earlier export: that one is gone either
    way, its description deleted first)."""
    created = None
    p = dest.absolute()
    while not p.exists():
        created, p = p, p.parent  # the topmost folder this export creates

    def undo() -> None:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
            return
        for name in _OURS:
            entry = dest / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()

    return undo


@contextlib.contextmanager
def _nothing_partial(where: str, undo: Callable[[], None]) -> Iterator[None]:
    """An export stopped by a full disk or a file size limit leaves nothing half-written, and says so in one line."""
    try:
        yield
    except Exception as e:
        reason = no_space_reason(e)
        if reason is None:
            raise
        undo()
        raise ArtifactError(
            f"export to {where} stopped: {reason} ({type(e).__name__}); nothing of it is left; free space or raise "
            "the limit, or pass another --out, and rerun"
        ) from None
