"""An HF export carries hbpe's own model and generation modules (training/checkpoint/hf_library.py): the copies equal
the library's modules line for line but their import lines, and transformers loads every one of them."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch

from hbpe.schemas.errors import HbpeError
from hbpe.training.checkpoint.hf_library import (
    COPY_FILES,
    LIBRARY_MODULES,
    copy_name,
    module_source,
    rewrite_imports,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("hf_modules")

# transformers' own rules (dynamic_module_utils.get_relative_imports), which decide the files it copies
_RELATIVE = re.compile(r"^\s*from\s+\.(\S+)\s+import", re.MULTILINE)
_IMPORTS_HBPE = re.compile(r"^\s*(from|import)\s+hbpe\b", re.MULTILINE)


@pytest.fixture(scope="module")
def hf_dir(tiny_run, tmp_path_factory) -> Path:
    from hbpe.training import export_model

    out = tmp_path_factory.mktemp("hf-library") / "model"
    export_model(str(tiny_run), str(out), format="hf")
    return out


def _relative_imports(path: Path) -> set[str]:
    return set(_RELATIVE.findall(path.read_text(encoding="utf-8")))


def test_each_copy_is_the_librarys_module_with_only_its_import_lines_changed(hf_dir):
    for module in LIBRARY_MODULES:
        library = module_source(module).splitlines()
        copy = (hf_dir / copy_name(module)).read_text(encoding="utf-8").splitlines()
        assert len(copy) == len(library), module
        changed = [(ours, theirs) for ours, theirs in zip(library, copy) if ours != theirs]
        for ours, theirs in changed:
            assert re.match(r"\s*from hbpe(\.\w+)+ import ", ours), (module, ours)
            assert re.match(r"\s*from \.(hbpe_\w+)? ?import ", theirs), (module, theirs)


def test_no_shipped_file_imports_hbpe(hf_dir):
    shipped = sorted(hf_dir.glob("*.py"))
    assert {p.name for p in shipped} >= set(COPY_FILES) | {"modeling_hbpe.py", "generation_hbpe.py"}
    for path in shipped:
        assert not _IMPORTS_HBPE.search(path.read_text(encoding="utf-8")), path.name


def test_the_copies_are_closed_and_modeling_names_each_one(hf_dir):
    """transformers copies a local folder's remote code one import deep: modeling_hbpe.py must import every copy,
    and the copies import nothing else of the folder's but each other."""
    stems = {name[:-3] for name in COPY_FILES}
    top = _relative_imports(hf_dir / "modeling_hbpe.py")
    assert stems <= top, sorted(stems - top)
    for name in COPY_FILES:
        assert _relative_imports(hf_dir / name) <= stems, name
    assert _relative_imports(hf_dir / "generation_hbpe.py") <= stems


def test_the_loaded_model_runs_the_copies_of_hbpes_classes(hf_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True)
    package = type(model).__module__.rsplit(".", 1)[0]
    assert type(model.latent).__module__ == f"{package}.hbpe_layers"
    assert type(model.io).__module__ == f"{package}.hbpe_patch_io"
    assert type(model.io.decoder).__module__ == f"{package}.hbpe_local_models"
    loaded = [sys.modules[m] for m in sys.modules if m.startswith(f"{package}.hbpe_")]
    assert len(loaded) == len(COPY_FILES)
    assert all(Path(m.__file__).parent == Path(sys.modules[package].__file__).parent for m in loaded)
    # the modules compute what hbpe's do: the same state dict through hbpe's own PatchLM
    from hbpe.training import load_model

    hbpe_model, tok, _ = load_model(str(hf_dir))
    patches = torch.as_tensor(tok.patches(tok.encode("The State of the Union is strong.")))[None]
    with torch.no_grad():
        theirs = model(patches=patches).logits
        e = hbpe_model.io.encode_patches(patches[:, :-1].long())
        h = hbpe_model.latent(e, causal=True)
        ours = hbpe_model.io.decoder(h[0], patches[0, 1:].long())[None]
    # hbpe's encoder may take its native packed kernel, which the folder does not ship: equal to float rounding
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    assert theirs.abs().max() > 1  # trained logits, not zeros


def test_an_import_of_a_module_the_folder_does_not_carry_is_refused():
    with pytest.raises(HbpeError, match=r"line 2 imports hbpe.pipeline.storage, which HF export folders do not carry"):
        rewrite_imports("x = 1\nfrom hbpe.pipeline.storage import open_uri\n", module="m")
    with pytest.raises(HbpeError, match=r"line 1 is `import hbpe.schemas`"):
        rewrite_imports("import hbpe.schemas\n", module="m")
    kept = "from hbpe.training.model import _patch_attention\n"
    assert rewrite_imports(kept) == "from . import _patch_attention\n"  # the native kernel: the torch path runs


def test_an_older_python_is_named_before_anything_is_imported(hf_dir):
    """The copies are hbpe's, which needs Python 3.11: configuration_hbpe.py, the folder's first file transformers
    reads, refuses an older one with both versions (checked before it imports transformers)."""
    import subprocess

    from hbpe.training.checkpoint.hf.configuration_hbpe import check_python

    with pytest.raises(ImportError, match=r"needs Python 3\.11 or newer; this is Python 3\.10\.13: load it from"):
        check_python((3, 10, 13, "final", 0))
    check_python(tuple(sys.version_info))
    older = [p for p in (Path.home() / ".pyenv" / "versions").glob("3.10.*/bin/python")]
    if not older:  # this machine has no Python 3.10: the check above is the test
        return
    load = (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location('c', sys.argv[1]); "
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))"
    )
    done = subprocess.run(
        [str(older[0]), "-c", load, str(hf_dir / "configuration_hbpe.py")], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert re.search(
        r"ImportError: this hbpe export .* needs Python 3\.11 or newer; this is Python 3\.10\.\d+", done.stderr
    )


def test_a_patch_without_eop_is_re_encoded_as_hbpe_generate_re_encodes_it(hf_dir):
    """S symbols without EOP are not a patch the latent model ever read: generate() hands it the bytes re-encoded by
    the tokenizer's out-of-vocabulary rule (hbpe_patch_decode.next_patches, as `hbpe generate` does), and returns
    their first-stage tokens."""
    from hbpe.training import load_model
    from hbpe.training.inference.patch_decode import next_patches

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True)
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
    _, tok, _ = load_model(str(hf_dir))
    data = b"Fellow-Citizens of the Senate"[: tok.max_patch_size]
    symbols = list(data)  # raw byte symbols, none of which ends a patch
    cache_name = sys.modules[type(model).__module__].CACHE_NAME
    cache = model.prepare_inputs_for_generation(torch.tensor([[hf_tok.eos_token_id]]))[cache_name]
    tokens, patches = cache._resolve(symbols)
    assert patches == next_patches(symbols, data, tok) == tok.encode_bytes(data)
    assert patches != [symbols] and sum(map(len, patches)) < len(symbols)  # merged: not the raw bytes as read
    assert hf_tok.decode(tokens) == data.decode() and tokens == tok.encoding.encode_ordinary(data.decode())


def test_an_export_over_one_with_copies_of_other_modules_replaces_them(hf_dir, tiny_run, tmp_path):
    """An export written by another hbpe carries other hbpe_*.py copies (a module added or dropped since): --overwrite
    replaces it whole, and a plain export over it leaves none of them."""
    import shutil

    from hbpe.training import export_model

    old = Path(shutil.copytree(hf_dir, tmp_path / "old"))
    (old / "hbpe_dropped_since.py").write_text("x = 1\n")
    export_model(str(tiny_run), str(old), format="hf", overwrite=True)
    assert not (old / "hbpe_dropped_since.py").exists()
    assert {p.name for p in old.glob("hbpe_*.py")} == set(COPY_FILES)
    (old / "hbpe_dropped_since.py").write_text("x = 1\n")
    export_model(str(tiny_run), str(old), overwrite=True)  # plain: no transformers files left
    assert not list(old.glob("hbpe_*.py"))
    (old / "hbpe_notes.txt").write_text("mine")  # not a module copy: still the user's file, refused
    with pytest.raises(HbpeError, match=r"holds files hbpe export did not write \(hbpe_notes\.txt\)"):
        export_model(str(tiny_run), str(old), format="hf", overwrite=True)
