"""The MDS shard contract: column names, encodings, and what each value means.

Each sample holds N patches (`seq_len`) of the continuous document stream, in
which every document is followed by one EOD patch.

- `tokens`    int32[N]     first-stage ids; TOKEN_EOD (-1) marks the EOD patch and
                           TOKEN_PAD (-2) tail padding. Every patch of a sample is a function
                           of its token (the tokenizer's table), so readers derive `patches`
                           from `tokens` with the tokenizer the manifest names.
- `patches`   uint16[N, S] second-stage symbols, PAD-padded rows: only in shards written with
                           `--store-patches` (and by every hbpe before shard schema 2). At S=10
                           it is 20 of a token's 24 raw bytes, and two thirds of the zstd bytes on disk.
- `num_bytes` int64        UTF-8 bytes of text the sample covers (BPB's denominator). Kept in
                           lean shards: 8 bytes a sample (0.2% of `tokens` at N=1024), and it
                           gives a sample's text size without the tokenizer (`hbpe shards
                           inspect`, the eval set's description) and a check of `tokens`.

Shard schema versions (the manifest's `shard_schema_version`; manifest version 1 means 1):
    1  every shard stores num_bytes, patches, tokens
    2  the manifest's `columns` says which: LEAN_COLUMNS by default, STORED_COLUMNS with --store-patches
"""

from __future__ import annotations

SHARD_SCHEMA_VERSION = 2
LEAN_COLUMNS = ("num_bytes", "tokens")  # sorted, as MDS orders a sample's columns
STORED_COLUMNS = ("num_bytes", "patches", "tokens")  # --store-patches, and every shard of schema 1
COMPRESSION = "zstd"
HASHES = ("xxh64",)  # fast; detects corruption. sha1 would add ~5 ms per MB for no reader that needs it
COMPLETED_FILENAME = "COMPLETED"
MANIFEST_FILENAME = "manifest.json"
INDEX_FILENAME = "index.json"
TOKENIZER_DIRNAME = "tokenizer"
REJECTS_DIRNAME = "rejects"


def column_names(*, store_patches: bool) -> tuple[str, ...]:
    """The columns a conversion writes: `patches` only when asked to store it."""
    return STORED_COLUMNS if store_patches else LEAN_COLUMNS


def mds_columns(seq_len: int, max_patch_size: int, *, store_patches: bool) -> dict[str, str]:
    """Column encodings for MDSWriter (fixed shapes: no per-sample size headers).

    >>> mds_columns(4, 3, store_patches=False)
    {'tokens': 'ndarray:int32:4', 'num_bytes': 'int64'}
    """
    encodings = {
        "tokens": f"ndarray:int32:{seq_len}",
        "patches": f"ndarray:uint16:{seq_len},{max_patch_size}",
        "num_bytes": "int64",
    }
    return {k: v for k, v in encodings.items() if k in column_names(store_patches=store_patches)}


def shard_basename(index: int) -> str:
    return f"shard.{index:05d}.mds.zstd"
