"""OmegaConf merges YAML and `key=value` overrides and resolves `${...}`; the typed dataclasses then validate.

llm-foundry's convention: a config file, dotlist overrides, interpolation, and a wrong type or a broken
interpolation as one ConfigError line that names the key and the fix.
"""

from __future__ import annotations

import pytest

from hbpe.schemas.errors import ConfigError
from hbpe.training.train.config_io import load_config

BASE = """\
run_name: exp1
seed: ${data.shuffle_seed}
data:
  train: /shards/${run_name}
  shuffle_seed: 5
save_folder: runs/${run_name}
log_file: \\${literal}.log
"""


def _load(tmp_path, *overrides: str, text: str = BASE):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return load_config(str(p), list(overrides), check_paths=False)


def test_interpolations_resolve_after_the_overrides_with_their_types(tmp_path, monkeypatch):
    cfg = _load(tmp_path)
    assert (cfg.run_name, cfg.seed, cfg.data.train, cfg.save_folder) == ("exp1", 5, "/shards/exp1", "runs/exp1")
    assert type(cfg.seed) is int  # an interpolation keeps the type of what it names
    assert cfg.log_file == "${literal}.log"  # \${ is a literal ${
    # overrides land before resolution: every ${run_name} follows run_name=, whatever the order
    cfg = _load(tmp_path, "save_folder=/out/${run_name}/ckpt", "run_name=exp2", "data.shuffle_seed=9")
    assert (cfg.save_folder, cfg.data.train, cfg.seed, cfg.data.shuffle_seed) == (
        "/out/exp2/ckpt",
        "/shards/exp2",
        9,
        9,
    )
    monkeypatch.setenv("HBPE_TEST_SHARDS", "/mnt/shards")
    assert _load(tmp_path, "data.train=${oc.env:HBPE_TEST_SHARDS}/train").data.train == "/mnt/shards/train"


def test_dotlist_sets_whole_values_and_reaches_into_lists(tmp_path):
    # a mapping value replaces the block (small.yaml's FSDP1 keys do not leak into an FSDP2 block)
    assert load_config("small", ["fsdp={version: 2}"], check_paths=False).fsdp == {"version": 2}
    assert load_config("small", ["fsdp.version=2"], check_paths=False).fsdp["sharding_strategy"] == "FULL_SHARD"
    cfg = _load(
        tmp_path,
        "data.train=null",
        "data.streams=[{remote: /a, proportion: 1}, {remote: /b, proportion: 3}]",
        "data.streams.1.proportion=0.5",
    )
    assert [(s.remote, s.proportion) for s in cfg.data.streams] == [("/a", 1.0), ("/b", 0.5)]
    assert cfg.data.train_sources == ("/a", "/b")


@pytest.mark.parametrize(
    "overrides,text,match",
    [
        (
            ["save_folder=runs/${nope}"],
            BASE,
            r"^save_folder: Interpolation key 'nope' not found; an interpolation names a key from the top "
            r"\(e\.g\. \$\{run_name\}, \$\{data\.train\}\) or an environment variable \(\$\{oc\.env:NAME\}\); "
            r"write \\\$\{ for a literal \$\{$",
        ),
        (
            ["data.train=${oc.env:HBPE_NO_SUCH_VAR}"],
            BASE,
            r"^data\.train: .*Environment variable 'HBPE_NO_SUCH_VAR' not found",
        ),
        (["save_folder=${run_name"], BASE, r"^override 'save_folder=\$\{run_name': .*; an interpolation names a key"),
        (["save_folder=${nope:1}"], BASE, r"^save_folder: Unsupported interpolation type nope; an interpolation"),
        (["run_name=???"], BASE, r"^run_name is \?\?\? \(a value the config leaves to you\); set run_name=VALUE$"),
        ([], "run_name: ???\ndata: {train: s}\n", r"^run_name is \?\?\? .*; set run_name=VALUE$"),
        ([], "data: {train: '${nope'}\n", r"c\.yaml: data\.train: .*'\$\{nope'; an interpolation names a key"),
        ([], "data: {train: 2020-01-01}\n", r"c\.yaml: data\.train: Value 'date' is not a supported .*; quote it"),
        ([], "a: ${b}\nb: ${a}\ndata: {train: s}\n", r"^a: Recursive interpolation detected; an interpolation"),
        # the type check sees the resolved value: one line, as for a literal
        (
            ["optim.lr=${run_name}"],
            BASE,
            r"^optim\.lr: got 'exp1' \(a string\), expected a finite number; e\.g\. optim\.lr=0\.001$",
        ),
        (
            ["optim=3", "optim.lr=1"],
            BASE,
            r"^override optim\.lr: optim is 3, not a section; set optim\.KEY=VALUE only$",
        ),
        (["optim"], BASE, r"^override 'optim' is not key=value"),
        (
            ["data.streams.0.proportion=0.5"],
            BASE,
            r"^data\.streams: got \{'0': \{'proportion': 0\.5\}\} \(a mapping\), expected a list of sections",
        ),
    ],
)
def test_broken_interpolations_and_wrong_types_are_one_line(tmp_path, overrides, text, match):
    with pytest.raises(ConfigError, match=match) as e:
        _load(tmp_path, *overrides, text=text)
    assert "\n" not in str(e.value)


def test_run_files_record_the_resolved_config(tmp_path):
    cfg = _load(tmp_path, "run_name=exp3")
    d = cfg.to_dict()
    assert d["save_folder"] == "runs/exp3" and d["data"]["train"] == "/shards/exp3" and d["seed"] == 5
