"""The import path and the wheel: one copy of each module, and every package in the wheel.

`hbpe/schemas`, `hbpe/pipeline` and `hbpe/training` are links to the top-level folders, and the
editable install puts `src/` (holding only the link `hbpe`) on the path: a plain directory walk,
which editors and type checkers follow, and package discovery that cannot forget a folder.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

TOP = ("schemas", "pipeline", "training")


def _packages_in_tree() -> set[str]:
    found = {"hbpe"}
    for top in (*TOP, "hbpe"):
        for init in (REPO / top).rglob("__init__.py"):
            if any(p.is_symlink() for p in init.relative_to(REPO).parents if p != Path(".")):
                continue
            rel = init.parent.relative_to(REPO).parts
            found.add(".".join(rel if rel[0] == "hbpe" else ("hbpe", *rel)))
    return found


def test_the_import_path_is_a_directory_walk_and_bare_names_are_refused(tmp_path):
    import hbpe.training.model.patch_lm as patch_lm

    assert Path(patch_lm.__file__).resolve() == REPO / "training" / "model" / "patch_lm.py"
    for top in TOP:
        assert (REPO / "hbpe" / top).resolve() == REPO / top
        # from the repository root, the bare folder name would be a second copy of the package
        r = subprocess.run([sys.executable, "-c", f"import {top}"], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 1 and f"ImportError: import hbpe.{top}, not {top}" in r.stderr


@pytest.mark.e2e
def test_the_wheel_holds_every_package_and_runs_the_demo_anywhere(tmp_path):
    """Built, installed into a new venv and run from another directory: no file of the checkout is used.

    The venv gets hbpe from the wheel alone; its dependencies come from the tested stack (this
    venv's site-packages on its path: no network here), whose own `hbpe` entry is not read.
    """
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("hbpe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    in_wheel = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert _packages_in_tree() <= in_wheel, sorted(_packages_in_tree() - in_wheel)
    assert {"hbpe/training/configs/tiny.yaml", "hbpe/sample/en-sotu-sample.jsonl.zst", "hbpe/py.typed"} <= set(names)
    assert any(n.startswith("hbpe/pipeline/tokenizer/second_stage/_merge_core") for n in names)
    assert any(n.startswith("hbpe/training/model/_patch_attention") for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    deps = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "torch").is_dir())
    (site / "tested-stack.pth").write_text(deps + "\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            str(wheel),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run(
        [str(venv / "bin" / "hbpe"), "demo", "--out", "demo", "--batches", "4", "--json"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert (
        str(venv)
        in subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import hbpe.demo; print(hbpe.demo.__file__)"],
            cwd=elsewhere,
            capture_output=True,
            text=True,
        ).stdout
    )
    assert (elsewhere / "demo" / "shards-train" / "COMPLETED").exists() and math.isfinite(result["eval"]["bpb"])


def test_the_package_list_check_can_fail(tmp_path, monkeypatch):
    """A folder with an __init__.py that the wheel lacks is named (here: a made-up tree)."""
    (tmp_path / "training" / "newroom").mkdir(parents=True)
    (tmp_path / "training" / "newroom" / "__init__.py").write_text("")
    (tmp_path / "hbpe").mkdir()
    monkeypatch.setattr("tests.test_packaging.REPO", tmp_path)
    assert _packages_in_tree() - {"hbpe"} == {"hbpe.training.newroom"}
