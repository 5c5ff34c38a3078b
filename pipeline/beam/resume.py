"""`--resume`: the record that ties a staging folder to one conversion, checked before anything is reused.

    OUTPUT/.hbpe-staging/resume.json                      a new output's build
    OUTPUT/.hbpe-new-XXXXXXXX/.hbpe-staging/resume.json   an --overwrite's build (the old output stays)
    OUTPUT/.hbpe-new-XXXXXXXX/COMPLETED                   an --overwrite's complete build, swap cut short:
                                                          its record is read back from its manifest.json

The record holds the run's options (the output aside: it is where the record is found),
the tokenizer fingerprint and every input's path, size and mtime. A resume with anything
else is refused with the difference named: its units would not be the ones this run
encodes, and the shards would not be those an uninterrupted run writes. Each unit's own
key (units.py) guards the units themselves.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hbpe.pipeline.beam import fs
from hbpe.pipeline.beam.finalize import STAGING_DIRNAME
from hbpe.pipeline.corpus.files import FileInfo
from hbpe.schemas.canonical import pretty_json
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ConfigError
from hbpe.schemas.shard_columns import COMPLETED_FILENAME, MANIFEST_FILENAME

RECORD_FILENAME = "resume.json"
RECORD_FORMAT = "hbpe-convert-staging"
RECORD_VERSION = 1
_START_OVER = "or pass --overwrite instead of --resume to start over"


def make_record(cfg: ConvertConfig, files: list[FileInfo], tokenizer_fingerprint: str, n_units: int) -> dict[str, Any]:
    config = cfg.to_dict()
    del config["output"]
    return {
        "format": RECORD_FORMAT,
        "version": RECORD_VERSION,
        "config": config,
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "inputs": [{"path": f.path, "size": f.size, "mtime": f.mtime} for f in files],
        "units": n_units,
    }


def record_of_manifest(build: str) -> dict[str, Any] | None:
    """The record of the run that wrote the complete output in `build`, from its manifest; None if unreadable.

    The manifest holds all a record does (its options with the output, the tokenizer, the inputs).
    """
    try:
        m = json.loads(fs.read_bytes(fs.join(build, MANIFEST_FILENAME)))
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or not isinstance(m.get("config"), dict):
        return None
    return {
        "format": RECORD_FORMAT,
        "version": RECORD_VERSION,
        "config": {k: v for k, v in m["config"].items() if k != "output"},
        "tokenizer_fingerprint": m.get("tokenizer_fingerprint"),
        "inputs": m.get("inputs") if isinstance(m.get("inputs"), list) else [],
    }


def write_record(staging: str, record: dict[str, Any]) -> None:
    fs.write_atomic(fs.join(staging, RECORD_FILENAME), pretty_json(record).encode())


def read_record(staging: str) -> dict[str, Any] | None:
    """The record in `staging`, None when there is none (or it cannot be read: never half written, but edited)."""
    try:
        d = json.loads(fs.read_bytes(fs.join(staging, RECORD_FILENAME)))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def mismatch(found: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """Why the interrupted run of record `found` is not this run (`wanted`); None when it is the same."""
    if (found.get("format"), found.get("version")) != (RECORD_FORMAT, RECORD_VERSION):
        return f"its staging was written by another hbpe version ({found.get('format')} v{found.get('version')})"
    if found.get("tokenizer_fingerprint") != wanted["tokenizer_fingerprint"]:
        return (
            f"it used the tokenizer with fingerprint {str(found.get('tokenizer_fingerprint'))[:12]}, this run "
            f"{wanted['tokenizer_fingerprint'][:12]}: rerun with the same --tokenizer"
        )
    old, new = found.get("config") if isinstance(found.get("config"), dict) else {}, wanted["config"]
    changed = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if changed:
        return f"its options differ from this run's: {', '.join(changed)}; rerun with the options it had"
    before = {i["path"]: i for i in found.get("inputs") or [] if isinstance(i, dict) and isinstance(i.get("path"), str)}
    now = {i["path"]: i for i in wanted["inputs"]}
    if before.keys() != now.keys():
        gone, new_files = sorted(before.keys() - now.keys()), sorted(now.keys() - before.keys())
        return f"its input files were different (gone: {gone[:3]}, new: {new_files[:3]}); rerun with the same inputs"
    for path, i in now.items():
        if (before[path].get("size"), before[path].get("mtime")) != (i["size"], i["mtime"]):
            return f"input {path} changed since (size or modification time): its encoded units are stale"
    return None


def refuse(shown: str, why: str) -> ConfigError:
    return ConfigError(f"cannot resume the conversion in {shown}: {why}; {_START_OVER}")


def unfinished_builds(output: str) -> list[str]:
    """Folders in `output` that hold a conversion's staging, or an --overwrite's complete build whose swap was
    cut short (output itself first, then .hbpe-new-*, newest first)."""

    names = fs.top_entries(output)
    builds = [output] if STAGING_DIRNAME in names else []
    others = [fs.join(output, n) for n in names if n.startswith(".hbpe-new-")]
    if not fs.is_remote(output):
        others.sort(key=lambda p: os.path.getmtime(p), reverse=True)
    return builds + [b for b in others if {STAGING_DIRNAME, COMPLETED_FILENAME} & set(fs.top_entries(b))]


def is_complete(build: str) -> bool:
    """Whether `build` holds a whole output (its COMPLETED): only putting it in place is left."""
    return COMPLETED_FILENAME in fs.top_entries(build)


def clean_staging(staging: str) -> None:
    """Before a resume: drop what an interrupted run left half done (temporary files, shards, progress).

    The tokenizer copy goes too (the launcher copies it again): finalize copies that folder whole.
    """
    fs.delete_entries(staging, ["shards", "progress", "tokenizer"])
    for sub in ("units", "rejects"):
        d = fs.join(staging, sub)
        fs.delete_entries(d, [n for n in fs.top_entries(d) if ".tmp-" in n])
