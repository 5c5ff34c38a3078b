"""Corpus -> shards: the two-stage tokenizer and the Beam conversion pipeline."""
