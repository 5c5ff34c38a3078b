"""The hierarchical BPE (Algorithm 1): training, the two application modes, the C kernels."""
