"""hbpe's own modules in an HF export folder: the model and generation code, copied, their import lines rewritten.

`hbpe export --format hf` writes each module of LIBRARY_MODULES into the folder as `hbpe_<name>.py`
(hbpe.training.model.layers -> hbpe_layers.py). Every line that imports from `hbpe` is rewritten to
import the copy beside it, and no other line changes:

    from hbpe.training.model.layers import KVCache, Transformer   ->   from .hbpe_layers import KVCache, Transformer

So the folder's HbpeForCausalLM (hf/modeling_hbpe.py) builds hbpe's PatchLM modules and generates with
hbpe's KV-cached decoder and symbol loop: `hbpe generate` and transformers' generate() run the same code.
transformers loads the copies as relative imports of modeling_hbpe.py (it follows `from .name import`
lines, and copies them again on save_pretrained); they import the standard library, numpy and torch.
tests/training/test_hf_library.py holds an export's copies equal to these modules, every line but the imports.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from hbpe.schemas.errors import HbpeError

# the closure of what modeling_hbpe.py and generation_hbpe.py import, in dependency order (a test checks closure)
LIBRARY_MODULES = (
    "hbpe.schemas.errors",
    "hbpe.schemas.symbols",
    "hbpe.schemas.names",
    "hbpe.schemas.schemes",
    "hbpe.schemas.locations",
    "hbpe.schemas.config_check",
    "hbpe.schemas.train_config",
    "hbpe.training.data.tile_layout",
    "hbpe.training.model.packing",
    "hbpe.training.model.patch_attention",
    "hbpe.training.model.tiles",
    "hbpe.training.model.layers",
    "hbpe.training.model.hash_ngrams",
    "hbpe.training.model.local_models",
    "hbpe.training.model.patch_io",
    "hbpe.training.model.patch_lm",
    "hbpe.training.inference.sampling",
    "hbpe.training.inference.kv_decode",
    "hbpe.training.inference.patch_decode",
)
# imported but not shipped: the native packed-attention kernel is a compiled extension of hbpe's own build. Its
# import sits in a try (patch_attention.py); in the folder it fails and the torch path computes the same attention.
NOT_SHIPPED = ("hbpe.training.model._patch_attention",)
_FROM = re.compile(r"^(?P<indent>[ \t]*)from (?P<module>hbpe(?:\.\w+)*) import (?P<names>.*)$")
_IMPORT = re.compile(r"^[ \t]*import hbpe\b")


_COPY_NAME = re.compile(r"hbpe_\w+\.py")


def is_library_copy(name: str) -> bool:
    """Whether a file name is one an HF export's module copies take, this hbpe's or another's (a module added or
    dropped since): `hbpe export --overwrite` replaces them, a plain export removes them."""
    return _COPY_NAME.fullmatch(name) is not None


def copy_name(module: str) -> str:
    """The file a library module is copied to: hbpe_<last component>.py."""
    return f"hbpe_{module.rsplit('.', 1)[-1]}.py"


COPY_FILES = tuple(copy_name(m) for m in LIBRARY_MODULES)
if len(set(COPY_FILES)) != len(COPY_FILES):  # two modules of one name would overwrite each other in the folder
    raise RuntimeError(f"internal: LIBRARY_MODULES' copies collide: {sorted(COPY_FILES)}")


def module_source(module: str) -> str:
    """The text of an installed hbpe module."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise HbpeError(f"internal: hbpe module {module} not found; reinstall hbpe (pip install -e .)")
    return Path(spec.origin).read_text(encoding="utf-8")


def rewrite_imports(source: str, *, module: str = "<module>") -> str:
    """`source` with each `from hbpe.X import ...` line importing the copy of X beside it; every other line kept.

    >>> rewrite_imports("from hbpe.schemas.symbols import PAD\\nx = 1\\n")
    'from .hbpe_symbols import PAD\\nx = 1\\n'
    """
    out = []
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        body = line.rstrip("\r\n")
        end = line[len(body) :]
        m = _FROM.match(body)
        if m:
            target, names = m["module"], m["names"]
            if target in LIBRARY_MODULES:
                body = f"{m['indent']}from .{copy_name(target)[:-3]} import {names}"
            elif f"{target}.{names.split('#')[0].strip()}" in NOT_SHIPPED:
                body = f"{m['indent']}from . import {names}"
            else:
                raise HbpeError(
                    f"internal: {module} line {number} imports {target}, which HF export folders do not carry; add "
                    "it to LIBRARY_MODULES (training/checkpoint/hf_library.py) or import it elsewhere"
                )
        elif _IMPORT.match(body):
            raise HbpeError(
                f"internal: {module} line {number} is `{body.strip()}`; import names with `from ... import`"
            )
        out.append(body + end)
    return "".join(out)


def write_library_copies(dest: Path) -> None:
    """Each module of LIBRARY_MODULES into `dest` as its copy, imports rewritten."""
    for module in LIBRARY_MODULES:
        (dest / copy_name(module)).write_text(rewrite_imports(module_source(module), module=module), encoding="utf-8")
