"""Canonical JSON and hashing, so fingerprints are byte-stable across machines."""

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    """Serialize with sorted keys and no whitespace: the bytes every fingerprint hashes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pretty_json(value: Any) -> str:
    """Human-readable JSON for files people open (stable key order, trailing newline)."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
