"""Corpus files: formats, decompression, work units, records -> documents or rejects."""
