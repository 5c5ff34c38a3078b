"""infra/gpu/train_on_image.sh and wheelhouse.py on CPU: `hbpe train` from a carried wheel over another venv's torch.

The test's own venv stands for the GPU image (a venv whose python3 holds torch, as /opt/torch/.venv there), and a
wheelhouse of hbpe's wheel alone, built from the tree, for the carried one: the script must make a venv that sees the
image's packages, install the wheel over them, import hbpe from the wheel and torch from the image, and train exactly
as the library does. The full wheelhouse (cp312, downloaded) over torch 2.11 was checked by hand (docs/gpu.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, TINY_RUN_BATCHES

SCRIPT = REPO / "infra" / "gpu" / "train_on_image.sh"
TORCH_FAMILY = ("torch", "torchvision", "triton")


@pytest.fixture(scope="module")
def wheelhouse():
    spec = importlib.util.spec_from_file_location("wheelhouse", REPO / "infra" / "gpu" / "wheelhouse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_training_wheels_are_pinned_by_the_current_stack_and_leave_the_images_torch_alone(wheelhouse):
    source = REPO / "constraints" / "current.txt"
    requirements = wheelhouse.pinned(wheelhouse.TRAINING, wheelhouse.read_pins(source), source)
    pins = wheelhouse.read_pins(source)
    assert [r.split("==")[1] for r in requirements] == [pins[wheelhouse.canonical(n)] for n in wheelhouse.TRAINING]
    names = {wheelhouse.canonical(n) for n in wheelhouse.TRAINING}
    assert len(names) == len(wheelhouse.TRAINING)  # no package twice: pip refuses two versions of one
    image_owned = {n for n in names if n in TORCH_FAMILY or n.startswith(("nvidia-", "cuda-"))}
    assert not image_owned
    assert {"mosaicml", "mosaicml-streaming", "numpy"} <= names
    assert not names & {"apache-beam", "pyarrow", "dask", "scipy", "matplotlib"}  # conversion's; optional ones


def test_a_package_the_constraints_do_not_pin_is_named(wheelhouse, tmp_path):
    source = tmp_path / "current.txt"
    source.write_text("# via x\nNumPy==2.4.6  # mosaicml: numpy<2.3.0\n--extra-index-url https://example.org\n")
    assert wheelhouse.read_pins(source) == {"numpy": "2.4.6"}
    with pytest.raises(SystemExit, match=r"pins no version of click, mosaicml: regenerate it"):
        wheelhouse.pinned(("numpy", "click", "mosaicml"), wheelhouse.read_pins(source), source)


def test_a_python_of_another_version_or_no_checkout_is_refused_before_any_download(wheelhouse, tmp_path):
    out = tmp_path / "wheels"
    with pytest.raises(
        SystemExit, match=rf"no Python 3\.9 to build hbpe's wheel for the image with \({re.escape(sys.executable)}\)"
    ):
        wheelhouse.main(["--python", sys.executable, "--python-version", "3.9", "--out", str(out)])
    assert not out.exists()
    with pytest.raises(
        SystemExit, match=rf"{re.escape(str(tmp_path))} is not a git checkout: hbpe's wheel is built from the files"
    ):
        wheelhouse.tree_copy(tmp_path / "copy", root=tmp_path)


def run_script(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_the_script_refuses_a_folder_that_is_no_wheelhouse_and_a_python_without_torch(tmp_path):
    r = run_script(str(tmp_path), str(tmp_path), env={"PYTHON": sys.executable, "OUT": str(tmp_path / "o")})
    assert r.returncode == 2
    assert f"error: {tmp_path}/requirements.txt not found: WHEELS must be a folder from infra/gpu/wheelhouse.py" in (
        r.stderr
    )
    (tmp_path / "requirements.txt").write_text("hbpe\n")
    r = run_script(str(tmp_path), str(tmp_path), env={"PYTHON": "/bin/false", "OUT": str(tmp_path / "o")})
    assert r.returncode == 2
    assert "error: /bin/false cannot import torch: set PYTHON to the image's Python" in r.stderr


def test_the_script_trains_from_the_carried_wheel_over_the_images_torch_as_the_library_does(
    wheelhouse, tiny_run, sample_shards, tmp_path
):
    wheels, out, venv = tmp_path / "wheels", tmp_path / "out", tmp_path / "venv"
    wheelhouse.build_hbpe(wheels, sys.executable, isolated=False)
    (wheels / "requirements.txt").write_text("hbpe\n")
    n = TINY_RUN_BATCHES  # tiny_run's config, its overrides and the script's defaults set back to tiny's
    overrides = [f"data.eval={sample_shards[1]}", f"max_duration={n}ba", f"eval_interval={n}ba",
                 f"save_interval={n}ba", "optim.warmup=10ba", "console=false"]  # fmt: skip
    env = {"PYTHON": sys.executable, "CONFIG": "tiny", "VENV": str(venv), "OUT": str(out), "TMPDIR": str(tmp_path)}
    r = run_script(str(wheels), str(sample_shards[0]), *overrides, env=env)
    assert r.returncode == 0, r.stderr[-3000:]

    found = json.loads((out / "versions.json").read_text())
    assert found["torch"] == {"version": version("torch"), "path": str(Path(torch.__file__).parent)}
    assert found["hbpe"]["path"].startswith(f"{venv}/lib/")  # the wheel's, not the tree's or the test venv's
    assert found["mosaicml"]["version"] == version("mosaicml")  # from the "image": the wheelhouse holds none
    assert found["device"] is None
    result = json.loads((out / "result.json").read_text())
    assert (result["batches"], result["device"], result["world_size"]) == (n, "cpu", 1)
    assert "error" not in (out / "train.log").read_text()

    def lines(path: Path) -> list[dict]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return [{k: v for k, v in row.items() if k != "time" and not k.startswith("throughput/")} for row in rows]

    # batch for batch the same losses, learning rates and eval BPB as the library's own run of the config (timings aside)
    assert lines(out / "metrics.jsonl") == lines(tiny_run / "metrics.jsonl")
