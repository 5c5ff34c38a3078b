"""The MDS shard contract: column names, encodings, and what each value means.

Each sample holds N patches (`seq_len`) of the continuous document stream, in
which every document is followed by one EOD patch.

- `tokens`    int32[N]     first-stage ids; TOKEN_EOD (-1) marks the EOD patch and
                           TOKEN_PAD (-2) tail padding. Stored so that a later
                           experiment with another S or mode can re-derive patches.
- `patches`   uint16[N, S] second-stage symbols, PAD-padded rows.
- `num_bytes` int64        UTF-8 bytes of text the sample covers (BPB's denominator).
"""

from __future__ import annotations

SHARD_SCHEMA_VERSION = 1
COMPRESSION = "zstd"
HASHES = ("xxh64",)  # fast; detects corruption. sha1 would add ~5 ms per MB for no reader that needs it
COMPLETED_FILENAME = "COMPLETED"
MANIFEST_FILENAME = "manifest.json"
INDEX_FILENAME = "index.json"
TOKENIZER_DIRNAME = "tokenizer"
REJECTS_DIRNAME = "rejects"


def mds_columns(seq_len: int, max_patch_size: int) -> dict[str, str]:
    """Column encodings for MDSWriter (fixed shapes: no per-sample size headers)."""
    return {
        "tokens": f"ndarray:int32:{seq_len}",
        "patches": f"ndarray:uint16:{seq_len},{max_patch_size}",
        "num_bytes": "int64",
    }


def shard_basename(index: int) -> str:
    return f"shard.{index:05d}.mds.zstd"
