"""Corpus -> shards: the two-stage tokenizer and the Beam conversion pipeline."""

if __name__ != "hbpe.pipeline":  # `import pipeline` from the repository root would load a second, different copy
    raise ImportError(
        f"import hbpe.pipeline, not {__name__}: the folder pipeline/ is the package hbpe.pipeline (pip install -e .)"
    )
