"""Contracts shared by the pipeline and the trainer: light imports only (stdlib + numpy)."""

if __name__ != "hbpe.schemas":  # `import schemas` from the repository root would load a second, different copy
    raise ImportError(
        f"import hbpe.schemas, not {__name__}: the folder schemas/ is the package hbpe.schemas (pip install -e .)"
    )
