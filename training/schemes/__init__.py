"""The schemes (`model.io`): one spec per scheme, each in its own module, found through registry.py.

    registry.py      SchemeSpec (what differs by scheme), register_scheme, scheme_spec
    hierarchical.py  the paper's model: BPE patches over V' symbols
    bpe.py           the embedding baseline: one first-stage token per latent position
    bytes.py         the byte-level baseline: one byte per latent position
    space.py         BLT's space patching: patches of bytes + EOP through the paper's local models
    entropy.py       BLT's entropy patching: space.py's patches, cut where a byte LM is unsure

This file imports nothing: the rooms below (data, model, ...) import registry.py, a leaf, and the
registry loads the built-in specs (which import those rooms) on its first lookup.
"""
