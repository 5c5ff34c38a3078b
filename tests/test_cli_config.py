"""`hbpe config show`: every key of a config with its value, type and help, read from the dataclasses (issue 27)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.config_doc import describe, field_help
from hbpe.training.train.config_io import load_config


def _leaves(d: dict, prefix: str = "") -> dict:
    """The config's own dict (TrainConfig.to_dict) flattened: what `config show` must list."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_config_show_lists_every_key_of_tiny_with_its_value_and_type():
    r = CliRunner().invoke(main, ["config", "show", "tiny", "optim.lr=0.5", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    want = _leaves(load_config("tiny", ["optim.lr=0.5"], check_paths=False).to_dict())
    assert [row["key"] for row in rows] == list(want)
    assert all(row["type"] for row in rows)
    by_key = {row["key"]: row for row in rows}
    assert by_key["optim.lr"]["value"] == 0.5 and by_key["optim.lr"]["type"] == "float"
    assert by_key["data.eval"]["type"] == "str | null"
    assert by_key["optim.grad_clip_norm"]["help"] == "0 turns clipping off"  # the comment on the field's line
    assert by_key["model.io"]["help"].startswith("input/output side")  # the comment lines above it
    text = CliRunner().invoke(main, ["config", "show", "tiny"]).stdout.splitlines()
    assert len(text) == len(rows) and text[0].split()[:3] == ["run_name", "hbpe-tiny", "str"]


def test_config_show_takes_a_path_with_bases_and_train_help_points_to_it(tmp_path):
    (tmp_path / "run.yaml").write_text("base: tiny\nrun_name: mine\n")
    r = CliRunner().invoke(main, ["config", "show", str(tmp_path / "run.yaml")])
    assert r.exit_code == 0 and r.stdout.split()[:2] == ["run_name", "mine"], r.output
    assert "hbpe config show tiny" in CliRunner().invoke(main, ["train", "--help"]).output
    r = CliRunner().invoke(main, ["config", "show", "tiny", "nonsense=1"])
    assert r.exit_code == 2 and "unknown config keys ['nonsense']" in r.output


@dataclass(frozen=True)
class _Doc:
    a: int = 1  # inline
    # above,
    # two lines
    b: str = "x"
    c: float = field(default=0.0, metadata={"help": "from metadata"})  # not this
    d: bool = False  # type: ignore[assignment]


def test_help_comes_from_metadata_then_the_line_then_the_lines_above():
    assert field_help(_Doc) == {"a": "inline", "b": "above, two lines", "c": "from metadata", "d": ""}
    assert [(k.key, k.type) for k in describe(_Doc())] == [("a", "int"), ("b", "str"), ("c", "float"), ("d", "bool")]
