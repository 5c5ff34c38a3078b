"""Shards -> batches: the loader and its stream cache (loader.py, streams.py, stream_cache.py), the token
rows calibration reads (token_rows.py), byte patching (byte_patching.py, numpy only) and the schemes that
turn rows into each model's batch (schemes.py: handed an already-loaded entropy model, never a checkpoint).
Imports hbpe.schemas, hbpe.pipeline and the scheme registry (training/schemes/registry.py, a leaf) only."""
