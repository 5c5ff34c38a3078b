"""A config file or override cannot make `load_config` work without bound: YAML alias bombs, loops, depth, size."""

from __future__ import annotations

import pytest

from hbpe.schemas.errors import ConfigError
from hbpe.training.train.config_io import MAX_CONFIG_BYTES, load_config


def _bomb(levels: int) -> str:
    """The "billion laughs" of YAML: each level is 9 aliases of the one before (9**levels values)."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_in_a_config_is_refused_at_once(tmp_path):
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(_bomb(7) + "max_duration: 10ba\n")  # 4.8M values once expanded: OmegaConf ran for minutes
    with pytest.raises(ConfigError, match=r"bomb\.yaml: its YAML aliases \(\*name\) expand to over 100,000 values; "):
        load_config(str(cfg), [f"data.train={tmp_path}"])


def test_an_alias_bomb_in_an_override_is_refused(tmp_path):
    value = "{" + _bomb(7).strip().replace("\n", ", ") + "}"
    with pytest.raises(ConfigError, match=r"^override 'run_name=\{l0: .*expand to over 100,000 values"):
        load_config("tiny", [f"data.train={tmp_path}", f"run_name={value}"])


def test_aliases_of_a_sensible_size_still_work(tmp_path):
    cfg = tmp_path / "anchors.yaml"
    cfg.write_text("model: &m {latent_layers: 2}\nmax_duration: 10ba\n" + "save_interval: &s 5ba\neval_interval: *s\n")
    assert load_config(str(cfg), [f"data.train={tmp_path}"]).eval_interval == "5ba"


@pytest.mark.parametrize(
    "text,match",
    [
        ("a: &a [1, *a]\n", r"loop\.yaml: a YAML alias \(\*name\) inside the value it names \(a loop\)"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", r"loop\.yaml: YAML nested too deeply"),
    ],
)
def test_a_self_referring_or_too_deep_config_is_one_error(text, match, tmp_path):
    cfg = tmp_path / "loop.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(str(cfg), [f"data.train={tmp_path}"])


def test_a_huge_config_file_is_refused_before_it_is_parsed(tmp_path):
    cfg = tmp_path / "huge.yaml"
    cfg.write_text("# " + "x" * MAX_CONFIG_BYTES + "\nmax_duration: 10ba\n")
    with pytest.raises(ConfigError, match=r"huge\.yaml: over 1 MB, not a training config; pass a YAML config file"):
        load_config(str(cfg), [f"data.train={tmp_path}"])


def test_an_alias_bomb_in_an_experiment_spec_is_refused(tmp_path):
    from hbpe.experiments.presets import load_spec

    spec = tmp_path / "bomb-exp.yaml"
    head = "name: x\ndescription: y\nfirst_stages: {g: {encoding: gpt2}}\n"
    runs = "runs: [{name: a, first_stage: g, model: {io: hierarchical}}]\nextra:\n"
    spec.write_text(head + runs + "".join(f"  {line}\n" for line in _bomb(7).splitlines()))
    with pytest.raises(
        ConfigError,
        match=r"bomb-exp\.yaml: its YAML aliases \(\*name\) expand to over 100,000 values; write the values out$",
    ):
        load_spec(str(spec))
