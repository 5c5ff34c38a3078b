"""The README's "From Python" block runs as written, and the API gives what the CLI gives."""

from __future__ import annotations

import json
import math
import re

import pytest
from click.testing import CliRunner

import hbpe
from hbpe.cli import main
from hbpe.schemas.errors import ConfigError
from tests.conftest import REPO


def _readme_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("### From Python") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.e2e
def test_the_readme_example_runs_and_matches_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sample").symlink_to(REPO / "data" / "sample")
    exec(compile(_readme_block(), "README.md", "exec"), {})
    bpb_line, sample_line = capsys.readouterr().out.splitlines()[-2:]
    bpb = float(bpb_line)
    assert math.isfinite(bpb) and 1.0 < bpb < 12.0
    assert sample_line.startswith("The state of the union")
    # the CLI's numbers for the same checkpoint and data: the same function underneath
    r = CliRunner().invoke(
        main, ["eval", "--checkpoint", "runs/py/run", "--data", "runs/py/shards", "--max-batches", "4", "--json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout[r.stdout.index("{") :])["bpb"] == pytest.approx(bpb, abs=1e-9)
    assert hbpe.generate("runs/py/run", "The state of the union", max_bytes=40)[0] == sample_line  # greedy


def test_errors_are_the_commands_errors():
    with pytest.raises(ConfigError, match="data.train path /no/such/shards does not exist"):
        hbpe.train_config("tiny", {"data.train": "/no/such/shards"})
    cfg = hbpe.train_config({"model_size": "tiny", "data": {"train": "x"}, "model": {"latent_layers": 3}}, ["seed=3"])
    assert (cfg.model.latent_layers, cfg.seed) == (3, 3)


# the names the README documents (its "From Python" section), by hand: a name dropped from or added to
# hbpe.__all__ without the README is caught here
DOCUMENTED = {
    "convert", "evaluate", "export", "generate", "load_model", "load_tokenizer", "plot", "save_tokenizer",
    "score_tasks", "train", "train_config", "train_tokenizer",
}  # fmt: skip


def test_the_public_names_are_all_there():
    import inspect

    from hbpe import api

    assert set(hbpe.__all__) == DOCUMENTED and len(hbpe.__all__) == len(DOCUMENTED)
    readme = (REPO / "README.md").read_text()
    start = readme.index("### From Python")
    section = readme[start : readme.index("\n## ", start)]  # to the next section
    assert set(re.findall(r"hbpe\.(\w+)", section)) == DOCUMENTED | {"training"}  # and the lower-level package
    # every public function of hbpe/api.py is exported, and each name is that function, with a docstring
    defined = {n for n, f in inspect.getmembers(api, inspect.isfunction) if f.__module__ == api.__name__}
    assert {n for n in defined if not n.startswith("_")} == DOCUMENTED
    for name in hbpe.__all__:
        assert getattr(hbpe, name) is getattr(api, name) and inspect.getdoc(getattr(hbpe, name)), name
    assert set(dir(hbpe)) >= DOCUMENTED
    with pytest.raises(AttributeError, match="module 'hbpe' has no attribute 'trian'"):
        hbpe.trian  # noqa: B018
