"""Shards -> models: the hierarchical patch LM, data, Composer training, eval, generation."""
