"""`hbpe shards inspect | verify | export-text | stats` over a committed shard directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from pipeline import mds_format
from pipeline.shard_reader import ShardDir
from schemas.symbols import EOD, PAD


def stats(sd: ShardDir) -> dict[str, Any]:
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
                {"sample": i, "num_bytes": int(s["num_bytes"]), "text": _preview(sd.tokenizer, s["patches"], chars)}
            )
    return {
        **stats(sd),
        "columns": dict(zip(first["column_names"], first["column_encodings"], strict=True)) if first else {},
        "inputs": sd.manifest.inputs,
        "samples_preview": decoded,
    }


def verify(sd: ShardDir) -> list[str]:
    """Every problem found (empty when the directory is consistent)."""
    problems: list[str] = []
    m, tok = sd.manifest, sd.tokenizer
    names = [e["zip_data"]["basename"] for e in sd.shard_entries]
    if names != m.shards:
        problems.append(f"index.json lists {len(names)} shards, manifest {len(m.shards)}: they differ")
    if tok.fingerprint != m.tokenizer_fingerprint:
        problems.append(f"tokenizer/ fingerprint {tok.fingerprint[:12]} != manifest {m.tokenizer_fingerprint[:12]}")
    n_samples = text_tokens = eods = 0
    for e in sd.shard_entries:
        name = e["zip_data"]["basename"]
        path = sd.path / name
        if not path.is_file():
            problems.append(f"{name}: missing")
            continue
        data = path.read_bytes()
        bad = mds_format.verify_hashes(data, e["zip_data"])
        if bad:
            problems.append(f"{name}: {'/'.join(bad)} does not match index.json (corrupted or replaced)")
            continue
        raw = mds_format.decompress(data)
        if mds_format.verify_hashes(raw, e["raw_data"]):
            problems.append(f"{name}: decompressed data does not match index.json")
            continue
        cols = sd.read_columns(e, raw)
        tokens = cols["tokens"]
        wrong = np.flatnonzero((cols["patches"] != tok.patches(tokens)).any(axis=(1, 2)))
        problems += [f"{name} sample {i}: patches differ from the tokenizer applied to tokens" for i in wrong[:5]]
        nbytes = np.take(tok.token_nbytes, tokens, axis=0).sum(axis=1)
        problems += [
            f"{name} sample {i}: num_bytes {cols['num_bytes'][i]} != {nbytes[i]}"
            for i in np.flatnonzero(nbytes != cols["num_bytes"])[:5]
        ]
        text_tokens += int((tokens >= 0).sum())
        eods += int((tokens == -1).sum())
        n_samples += e["samples"]
    c = m.counts
    if n_samples != c.samples:
        problems.append(f"shards hold {n_samples} samples, manifest counts {c.samples}")
    if not problems:
        if text_tokens + c.tail_tokens_dropped != c.tokens:
            problems.append(
                f"shards hold {text_tokens} tokens + {c.tail_tokens_dropped} dropped != manifest tokens {c.tokens}"
            )
        if n_samples * m.seq_len != c.patches - c.tail_patches_dropped + c.tail_patches_padded:
            problems.append("samples x seq_len does not equal the stream length after the tail rule")
        if eods > c.documents_written:
            problems.append(f"{eods} document ends but only {c.documents_written} documents written")
    if not c.balanced():
        problems.append(
            f"documents_read {c.documents_read} != written {c.documents_written} + rejected {c.documents_rejected}"
        )
    return problems


def export_text(sd: ShardDir, out: TextIO) -> dict[str, int]:
    """Rebuild documents from `patches` (the hierarchical symbols), one JSON line each."""
    tok = sd.tokenizer
    written, pending = 0, []
    for s in sd.samples():
        flat = s["patches"].reshape(-1)
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
    with open(path, "w", encoding="utf-8") as f:
        return export_text(sd, f)
