"""hbpe: hierarchical BPE tokenization, sharding and training."""

__version__ = "0.1.0"
