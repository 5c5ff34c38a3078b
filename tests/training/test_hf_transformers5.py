"""`hbpe export --format hf` under transformers 5, where hbpe is not installed: the folder loads, generates (greedy,
sampled, through a pipeline), scores and comes back from save_pretrained as it does under the pinned transformers 4.

Each transformers 5 stack is a venv of its own (a CPU torch, transformers, no hbpe), built once per requirement
list with `python -m venv` and `pip install` under ~/.cache/hbpe-test-venvs (HBPE_TEST_VENVS moves it), keyed by
a hash of the list and the Python, and reused after. The same CHECK script runs there (in a subprocess) and here
(in-process, transformers 4); the two JSON answers must agree. Where the venv cannot be built (no package
registry) the test fails and says so: it is never skipped (CI has the registry).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local: a network call would be a bug

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.e2e  # trains (tiny_run) and builds a venv

# the oldest and the newest transformers 5 on the registry, with the libraries each resolved to (pinned, so a new
# release changes nothing here until the list does); the hash of a list names its venv
STACKS = {
    "5.0.0": (
        "torch==2.13.0+cpu", "transformers==5.0.0", "huggingface-hub==1.33.0", "tokenizers==0.22.2",
        "safetensors==0.8.0", "numpy==2.4.6", "tiktoken==0.14.0",
    ),
    "5.24.0": (
        "torch==2.13.0+cpu", "transformers==5.24.0", "huggingface-hub==2.4.0", "tokenizers==0.23.3",
        "safetensors==0.8.0", "numpy==2.4.6", "tiktoken==0.14.0",
    ),
}  # fmt: skip
PROMPTS = ["The State of the Union", "Mr. Speaker, we must", "In 1950"]
PIP_INSTALL = ("-m", "pip", "install", "-q", "--no-compile", "--retries", "2", "--disable-pip-version-check")
OLD_TIED = '    _tied_weights_keys = ["io.decoder.embed.weight"]  # E, stored once under io.encoder.embed.weight\n'

# run as it is by both transformers: uses only torch and transformers, never hbpe (absent from the venv)
CHECK = r"""
import importlib.util, json, os, sys
import torch, transformers

def loads(folder):
    try:
        transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {e}"

def check(folder, saved, prompts, texts):
    auto = transformers.AutoModelForCausalLM
    tok = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = auto.from_pretrained(folder, trust_remote_code=True).eval()
    enc = tok(prompts, return_tensors="pt", padding=True)  # left padding
    out = {"transformers": transformers.__version__, "hbpe_importable": importlib.util.find_spec("hbpe") is not None}
    out["greedy"] = model.generate(**enc, max_new_tokens=20).tolist()
    torch.manual_seed(0)
    out["sampled"] = model.generate(**enc, max_new_tokens=20, do_sample=True, temperature=0.9, top_k=40, top_p=0.95).tolist()
    torch.manual_seed(0)  # only do_sample: each transformers' own defaults (top_k 50)
    out["sampled_defaults"] = model.generate(**enc, max_new_tokens=20, do_sample=True).tolist()
    pipe = transformers.pipeline("text-generation", model=folder, trust_remote_code=True)
    out["pipeline"] = pipe(prompts[0], max_new_tokens=10, do_sample=False)[0]["generated_text"]
    batch = tok(texts, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    with torch.inference_mode():
        scored = model(**batch, labels=labels)
    out["ids"], out["loss"], out["nll_sum"] = batch["input_ids"].tolist(), float(scored.loss), float(scored.nll_sum)
    model.save_pretrained(saved)
    tok.save_pretrained(saved)
    again = auto.from_pretrained(saved, trust_remote_code=True).eval()
    tok2 = transformers.AutoTokenizer.from_pretrained(saved, trust_remote_code=True)
    with torch.inference_mode():
        out["saved_nll_sum"] = float(again(**batch, labels=labels).nll_sum)
    out["saved_greedy"] = again.generate(**tok2(prompts, return_tensors="pt", padding=True), max_new_tokens=20).tolist()
    out["saved_tied"] = again.io.encoder.embed.weight is again.io.decoder.embed.weight
    with open(os.path.join(saved, "config.json")) as f:
        config = json.load(f)
    out["saved_config"] = {k: config.get(k) for k in ("model_type", "auto_map", "hbpe_model", "hbpe_tested_transformers")}
    return out
"""


def _run_check(folder: Path, saved: Path, texts: list[str]) -> dict:
    """CHECK in this process (the pinned transformers 4)."""
    scope: dict = {}
    exec(compile(CHECK, "CHECK", "exec"), scope)
    return scope["check"](str(folder), str(saved), PROMPTS, texts)


def venv_root() -> Path:
    return Path(os.environ.get("HBPE_TEST_VENVS") or Path.home() / ".cache" / "hbpe-test-venvs")


def stack_python(requirements: tuple[str, ...]) -> Path:
    """The python of a venv holding exactly `requirements` (built on first use, under a lock; reused after).

    The venv's own pip installs with --no-compile: compiling torch's thousands of files made a build take 18 minutes
    on 2 busy cores (12 s without), and Python compiles what it imports anyway. A folder without its DONE file (an
    interrupted build) is built again."""
    key = hashlib.sha256(json.dumps([sys.version_info[:2], platform.machine(), *requirements]).encode()).hexdigest()
    root = venv_root()
    root.mkdir(parents=True, exist_ok=True)
    venv, python = root / key[:16], root / key[:16] / "bin" / "python"
    with open(root / f"{key[:16]}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time per list, xdist workers and parallel runs included
        if (venv / "DONE").is_file():
            return python
        shutil.rmtree(venv, ignore_errors=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        for cmd in (
            [sys.executable, "-m", "venv", str(venv)],
            [str(python), *PIP_INSTALL, *requirements],
        ):
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            if r.returncode:
                pytest.fail(
                    f"could not build the test venv {venv}: `{' '.join(cmd)}` exited {r.returncode}:\n"
                    f"{(r.stdout + r.stderr)[-3000:]}\nThis test installs {', '.join(requirements)} from the package "
                    "registry (CI has it): run it where pip reaches the registry, and for torch's CPU wheel (+cpu) "
                    "an index or folder that has it (PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS)",
                    pytrace=False,
                )
        (venv / "DONE").write_text("\n".join(requirements) + "\n")
    return python


def _run_in(python: Path, folder: Path, saved: Path, texts: list[str], old: Path, cwd: Path) -> dict:
    """CHECK in a stack's venv, where hbpe is not importable (no PYTHONPATH, another working directory)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(cwd / "hf-modules"), OMP_NUM_THREADS="1")
    main = "\nargs = json.loads(sys.argv[1])\nprint(json.dumps({**check(*args[:4]), 'old': loads(args[4])}))\n"
    args = json.dumps([str(folder), str(saved), PROMPTS, texts, str(old)])
    r = subprocess.run(
        [str(python), "-c", CHECK + main, args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-5000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def exports(tiny_run, tmp_path_factory) -> tuple[Path, Path]:
    """(an export written as every export was before transformers 5 support: its `_tied_weights_keys` a list, and
    that export rewritten by `hbpe export --format hf`). The tiny run with seeded noise (2 std) on its weights, as
    test_hf_causal_lm's `lively`: its greedy text is not one repeated token."""
    from hbpe.training import load_model
    from hbpe.training.checkpoint.export_format import write_export
    from tests.helpers import hbpe_cli

    model, tok, _ = load_model(str(tiny_run))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.std() * 2.0)
    root = tmp_path_factory.mktemp("tf5")
    old, new = root / "old", root / "new"
    write_export(model, tok, str(old), source={"test": "the tiny run, with noise"}, hf=True)
    code = (old / "modeling_hbpe.py").read_text()
    tied = next(line for line in code.splitlines(keepends=True) if line.lstrip().startswith("_tied_weights_keys ="))
    (old / "modeling_hbpe.py").write_text(code.replace(tied, OLD_TIED))
    config = json.loads((old / "config.json").read_text())
    del config["hbpe_tested_transformers"]
    (old / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    hbpe_cli("export", "--checkpoint", str(old), "--out", str(new), "--format", "hf")
    return old, new


@pytest.fixture(scope="module")
def texts(sample_texts) -> list[str]:
    return [PROMPTS[2], *(t[:300] for t in sample_texts[:2])]  # 3 and about 60 tokens: a padded batch


@pytest.fixture(scope="module")
def under_4(exports, texts, tmp_path_factory) -> dict[str, dict]:
    """CHECK in this process, on the earlier export and on its rewrite, each in its own HF_MODULES_CACHE."""
    from tests.conftest import private_hf_modules

    out = {}
    for folder in exports:
        root = tmp_path_factory.mktemp(f"tf4-{folder.name}")
        with private_hf_modules(root / "hf-modules"):
            out[folder.name] = _run_check(folder, root / "saved", texts)
    return out


def test_an_earlier_export_loads_under_transformers_4_as_its_rewrite_does(exports, under_4):
    old, new = exports
    assert "_tied_weights_keys = [" in (old / "modeling_hbpe.py").read_text()
    assert "_tied_weights_keys = {" in (new / "modeling_hbpe.py").read_text()
    got, want = dict(under_4["old"]), dict(under_4["new"])
    assert got.pop("saved_config")["hbpe_tested_transformers"] is None  # written before the record existed
    assert want.pop("saved_config")["hbpe_tested_transformers"] == ">=4.57,<6"
    assert got == want


def test_the_transformers_range_in_config_json_holds_the_versions_tested_here(exports):
    from packaging.specifiers import SpecifierSet

    config = json.loads((exports[1] / "config.json").read_text())
    tested = SpecifierSet(config["hbpe_tested_transformers"])
    assert all(v in tested for v in [transformers.__version__, *STACKS])  # this process's: the pinned 4.57


@pytest.mark.parametrize("stack", list(STACKS))
def test_an_export_runs_under_transformers_5_as_under_4(stack, exports, texts, under_4, tmp_path):
    python = stack_python(STACKS[stack])
    old, new = exports
    got = _run_in(python, new, tmp_path / "saved", texts, old, tmp_path)
    want = dict(under_4["new"])
    assert got.pop("transformers") == stack and want.pop("transformers") != stack  # the pinned 4.57 here
    assert got.pop("hbpe_importable") is False and want.pop("hbpe_importable") is True
    # an earlier export's list of tied weights is transformers 4's form only: rewritten (above), it loads
    assert "AttributeError: 'list' object has no attribute 'keys'" in got.pop("old")
    assert got.pop("loss") == pytest.approx(want.pop("loss"), rel=1e-5)  # another torch: the last bits may differ
    for key in ("nll_sum", "saved_nll_sum"):
        assert got.pop(key) == pytest.approx(want.pop(key), rel=1e-5)
    assert got["saved_tied"] and got["greedy"] == got["saved_greedy"]
    assert len(set(got["greedy"][0][-20:])) > 3  # varied text, not one repeated token
    # greedy and seeded draws (torch's global generator, one draw a symbol) the same tokens; the same config.json
    assert got == want
