"""The MDS shard format, and reading and checking committed shard directories."""
