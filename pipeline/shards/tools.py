"""`hbpe shards inspect | verify | export-text | stats` over a committed shard directory (local or a URI)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from hbpe.pipeline import storage
from hbpe.pipeline.shards import mds_format
from hbpe.pipeline.shards.reader import ShardDir, columns_problem, read_shard_file
from hbpe.schemas.errors import ArtifactError, HbpeError
from hbpe.schemas.symbols import EOD, PAD, TOKEN_EOD, TOKEN_PAD


def stats(sd: ShardDir) -> dict[str, Any]:
    """Counts and statistics; refuses a directory whose shard files do not match index.json."""
    sd.check_files()
    m = sd.manifest
    zip_bytes = sum(e["zip_data"]["bytes"] for e in sd.shard_entries)
    raw_bytes = sum(e["raw_data"]["bytes"] for e in sd.shard_entries)
    return {
        "shards": len(sd.shard_entries),
        "samples": sum(e["samples"] for e in sd.shard_entries),
        "seq_len": m.seq_len,
        "max_patch_size": m.max_patch_size,
        "mode": m.mode,
        "tokenizer_fingerprint": m.tokenizer_fingerprint,
        "counts": m.counts.__dict__,
        "statistics": m.statistics,
        "bytes_on_disk": zip_bytes,
        "compression_ratio": raw_bytes / max(zip_bytes, 1),
    }


def _preview(tok, patches: np.ndarray, limit: int) -> str:
    out, flat = [], patches.reshape(-1)
    for s in flat[flat != PAD].tolist():
        out.append("⟨EOD⟩" if s == EOD else tok.symbol_bytes[s].decode("utf-8", errors="replace"))
        if sum(map(len, out)) > limit:
            break
    return "".join(out)[:limit]


def inspect(sd: ShardDir, *, samples: int = 2, chars: int = 240) -> dict[str, Any]:
    first = sd.shard_entries[0] if sd.shard_entries else None
    decoded = []
    if first is not None:
        for i, s in zip(range(samples), sd.iter_samples(first), strict=False):
            decoded.append(
                {"sample": i, "num_bytes": int(s["num_bytes"]), "text": _preview(sd.tokenizer, sd.patches(s), chars)}
            )
    return {
        **stats(sd),
        "columns": dict(zip(first["column_names"], first["column_encodings"], strict=True)) if first else {},
        "inputs": sd.manifest.inputs,
        "samples_preview": decoded,
    }


def verify(sd: ShardDir) -> list[str]:
    """Every problem found (empty when the directory is consistent).

    Files: each shard's size and hashes, before and after decompression. Samples: ids in
    the vocabulary, stored patches == tokenizer(tokens) (lean shards store none: readers derive
    them so), num_bytes. Manifest: shard list, tokenizer fingerprint, the columns of each shard
    (layout and shapes), and the counts of samples, patches, tokens, documents and bytes.
    """
    problems: list[str] = []
    m = sd.manifest
    names = [e["zip_data"]["basename"] for e in sd.shard_entries]
    if names != m.shards:
        problems.append(f"index.json lists {len(names)} shards, manifest {len(m.shards)}: they differ")
    try:
        tok = sd.tokenizer  # refused unless its fingerprint is the manifest's
    except HbpeError as e:
        # the per-sample checks need the conversion's tokenizer; the file and count checks go on
        problems.append(f"tokenizer/ cannot be used (samples not checked against it): {e}")
        tok = None
    n_vocab = tok.encoding.max_token_value + 1 if tok is not None else None
    text_tokens = eods = pads = nbytes_total = 0
    complete = True  # every shard was read: the totals below can be compared with the manifest
    for e in sd.shard_entries:
        name = e["zip_data"]["basename"]
        if problem := columns_problem(e, m):
            problems.append(f"{name}: {problem}")
            complete = False
            continue
        data = read_shard_file(sd.path, e["zip_data"])
        problem = mds_format.file_problem(data, e["zip_data"])
        if problem:
            problems.append(f"{name}: {problem}")
            complete = False
            continue
        try:
            raw = mds_format.decompress(data, name=name)
            problem = mds_format.file_problem(raw, e["raw_data"])
            if problem:
                raise ArtifactError(f"{name}: decompressed data {problem}")
            cols = sd.read_columns(e, raw)
        except ArtifactError as err:
            problems.append(str(err))
            complete = False
            continue
        tokens = cols["tokens"]
        text_tokens += int((tokens >= 0).sum())
        eods += int((tokens == TOKEN_EOD).sum())
        pads += int((tokens == TOKEN_PAD).sum())
        nbytes_total += int(cols["num_bytes"].sum())
        if tok is None:
            continue
        lo, hi = int(tokens.min(initial=0)), int(tokens.max(initial=0))
        if lo < TOKEN_PAD or hi >= n_vocab:
            problems.append(f"{name}: tokens span {lo}..{hi}, outside -2..{n_vocab - 1} of {tok.spec.first_stage.name}")
            complete = False
            continue
        if "patches" in cols:
            wrong = np.flatnonzero((cols["patches"] != tok.patches(tokens)).any(axis=(1, 2)))
            problems += [f"{name} sample {i}: patches differ from the tokenizer applied to tokens" for i in wrong[:5]]
        nbytes = np.take(tok.token_nbytes, tokens, axis=0).sum(axis=1)
        problems += [
            f"{name} sample {i}: num_bytes {cols['num_bytes'][i]} != {nbytes[i]}"
            for i in np.flatnonzero(nbytes != cols["num_bytes"])[:5]
        ]
    c = m.counts
    n_samples = sum(e["samples"] for e in sd.shard_entries)
    if n_samples != c.samples:
        problems.append(f"shards hold {n_samples} samples, manifest counts {c.samples}")
    if complete:
        problems += _count_problems(c, m.seq_len, n_samples, text_tokens, eods, pads, nbytes_total, tok)
    if not c.balanced():
        problems.append(
            f"documents_read {c.documents_read} != written {c.documents_written} + rejected {c.documents_rejected}"
        )
    return problems


def _count_problems(c, seq_len: int, n_samples: int, text_tokens: int, eods: int, pads: int, nbytes: int, tok) -> list:
    """The manifest's counts against what the shards hold, given the tail rule.

    The stream is every document's tokens followed by one EOD; `--tail drop` cuts its last
    `tail_patches_dropped` positions (`tail_tokens_dropped` of them tokens, the rest EODs),
    `--tail pad` appends `tail_patches_padded` PAD tokens.
    """
    problems = []
    if text_tokens + c.tail_tokens_dropped != c.tokens:
        problems.append(
            f"shards hold {text_tokens} tokens + {c.tail_tokens_dropped} dropped != manifest tokens {c.tokens}"
        )
    if n_samples * seq_len != c.patches - c.tail_patches_dropped + c.tail_patches_padded:
        problems.append(
            f"samples x seq_len = {n_samples * seq_len} does not equal the stream length after the tail rule "
            f"(manifest patches {c.patches} - dropped {c.tail_patches_dropped} + padded {c.tail_patches_padded})"
        )
    dropped_eods = c.tail_patches_dropped - c.tail_tokens_dropped
    if eods + dropped_eods != c.documents_written:
        problems.append(
            f"shards hold {eods} document ends + {dropped_eods} in the dropped tail != manifest documents_written "
            f"{c.documents_written}"
        )
    if pads != c.tail_patches_padded:
        problems.append(f"shards hold {pads} tail PAD patches, manifest tail_patches_padded {c.tail_patches_padded}")
    # the manifest does not record the bytes of the dropped tail, only its tokens: exact when
    # nothing was dropped, else bounded by 1..longest-token bytes per dropped token
    tail_bytes = c.bytes - nbytes
    longest = int(tok.token_nbytes.max()) if tok is not None else tail_bytes
    lo, hi = c.tail_tokens_dropped, c.tail_tokens_dropped * longest
    if not lo <= tail_bytes <= hi:
        problems.append(
            f"samples cover {nbytes} bytes, manifest bytes {c.bytes}: the {c.tail_tokens_dropped} dropped tail tokens "
            f"would hold {tail_bytes} bytes, expected {lo}..{hi}"
        )
    return problems


def export_text(sd: ShardDir, out: TextIO) -> dict[str, int]:
    """Rebuild documents from `patches` (the hierarchical symbols: stored, or derived), one JSON line each."""
    tok = sd.tokenizer
    written, pending = 0, []
    for s in sd.samples():
        flat = sd.patches(s).reshape(-1)
        flat = flat[flat != PAD]
        ends = np.flatnonzero(flat == EOD)
        start = 0
        for end in ends.tolist():
            pending.append(flat[start:end])
            text = tok.decode_symbols_bytes(np.concatenate(pending).tolist()).decode("utf-8")
            out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
            written += 1
            pending, start = [], end + 1
        pending.append(flat[start:])
    truncated = int(sum(len(p) for p in pending) > 0)
    return {"documents": written, "truncated_tail_documents": truncated}


def export_text_to(path: str | Path, sd: ShardDir) -> dict[str, int]:
    """export_text into `path` (local or a URI), whole or not at all: a damaged shard leaves no half file.

    A local file is written under a temporary name and renamed; a remote one is written locally
    and uploaded in one piece once complete (the bucket is checked first, before the work).
    """
    _refuse_inside(str(path), sd)
    if storage.is_remote(path):
        storage.check_bucket(str(path))
        with tempfile.TemporaryDirectory(prefix="hbpe-export-") as tmp:
            local = Path(tmp, "export.jsonl")
            with open(local, "w", encoding="utf-8") as f:
                r = export_text(sd, f)
            storage.upload_file(local, str(path))
        return r
    path = Path(path)
    if not path.resolve().parent.is_dir():
        raise ArtifactError(
            f"cannot write {path}: its folder {path.parent} does not exist; create it first or choose another path"
        )
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            r = export_text(sd, f)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return r


def _refuse_inside(path: str, sd: ShardDir) -> None:
    """e.g. DIR/index.json: the export would replace the shard directory's own files."""
    if storage.is_remote(path) != sd.remote:
        return  # a bucket and a local folder cannot overlap
    if sd.remote:
        target, root = path.rstrip("/"), str(sd.path)
        inside = target == root or target.startswith(root + "/")
    else:
        real, root_path = Path(path).resolve(), Path(sd.path).resolve()
        inside = real == root_path or root_path in real.parents
    if inside:
        raise ArtifactError(
            f"output {path} lies inside the shard directory {sd.path} being exported: write it outside {sd.path}"
        )
