"""The Beam conversion pipeline: corpus files -> MDS shards."""
