"""`base:` in a training config: other configs merged under it in order (later wins, sections deeply), paths
relative to the including file and kept inside its folder or the shipped configs, loops and missing files
refused with one line (issue 27)."""

from __future__ import annotations

import re

import pytest

from hbpe.schemas.errors import ConfigError
from hbpe.training.train.config_io import MAX_BASE_DEPTH, load_config


def _write(folder, name: str, text: str):
    p = folder / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def _load(p, *overrides: str):
    return load_config(str(p), list(overrides), check_paths=False)


def test_bases_merge_in_order_sections_deeply_and_the_file_itself_last(tmp_path):
    _write(tmp_path, "common/a.yaml", "seed: 1\noptim: {lr: 0.01, weight_decay: 0.5}\ndata: {train: /shards/a}\n")
    _write(tmp_path, "common/b.yaml", "seed: 2\noptim: {lr: 0.02}\nmax_duration: 7ba\n")
    top = _write(tmp_path, "run.yaml", "base: [common/a.yaml, common/b.yaml]\noptim: {warmup: 3ba}\nrun_name: r\n")
    cfg = _load(top)
    assert cfg.seed == 2 and cfg.max_duration == "7ba"  # b over a
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.warmup) == (0.02, 0.5, "3ba")  # optim merged deeply
    assert (cfg.data.train, cfg.run_name) == ("/shards/a", "r")
    assert _load(top, "seed=9").seed == 9  # overrides still come last
    with pytest.raises(ConfigError, match="base is not an override: write `base: FILE` in the YAML file"):
        _load(top, "base=common/a.yaml")
    assert "base" not in cfg.to_dict()


def test_a_base_may_be_a_shipped_config_and_bases_chain(tmp_path):
    _write(tmp_path, "gpu.yaml", "base: tiny\nglobal_batch_size: 16\n")
    top = _write(tmp_path, "run.yaml", "base: gpu.yaml\nrun_name: mine\n")
    cfg, tiny = _load(top), _load("tiny")
    assert (cfg.run_name, cfg.global_batch_size) == ("mine", 16)
    assert (cfg.optim.lr, cfg.max_duration, cfg.model) == (tiny.optim.lr, tiny.max_duration, tiny.model)


def test_a_base_loop_is_one_error_naming_the_loop(tmp_path):
    _write(tmp_path, "a.yaml", "base: b.yaml\nseed: 1\n")
    _write(tmp_path, "b.yaml", "base: a.yaml\nseed: 2\n")
    top = _write(tmp_path, "run.yaml", "base: a.yaml\n")
    a, b = (tmp_path / "a.yaml").resolve(), (tmp_path / "b.yaml").resolve()
    with pytest.raises(ConfigError, match=re.escape(f"config bases loop: {a} -> {b} -> {a}; remove one")):
        _load(top)
    _write(tmp_path, "self.yaml", "base: self.yaml\n")
    with pytest.raises(ConfigError, match="config bases loop: .*self.yaml -> .*self.yaml"):
        _load(tmp_path / "self.yaml")


def test_a_missing_base_names_the_file_and_where_it_looked(tmp_path):
    top = _write(tmp_path, "run.yaml", "base: [nope.yaml]\n")
    want = f"base 'nope.yaml' not found (looked for {(tmp_path / 'nope.yaml').resolve()}); name a YAML file"
    with pytest.raises(ConfigError, match=re.escape(want)):
        _load(top)


@pytest.mark.parametrize(
    ("base", "match"),
    [
        ("../outside.yaml", r"resolves to .*outside.yaml, outside .*; a config may only build on files in its own"),
        ("/etc/hostname", r"resolves to /etc/hostname, outside"),
        ("gs://bucket/c.yaml", r"base 'gs://bucket/c.yaml' is a URI"),
        ("{a: 1}", r"base is \{'a': 1\}; write one config"),
        ("[]\nseed: [1", "invalid YAML"),
    ],
)
def test_a_base_stays_inside_the_configs_folder_and_is_a_name(tmp_path, base, match):
    _write(tmp_path, "outside.yaml", "seed: 1\n")
    top = _write(tmp_path, "inner/run.yaml", f"base: {base}\n")
    with pytest.raises(ConfigError, match=match):
        _load(top)


def test_a_symlink_out_of_the_folder_is_refused(tmp_path):
    _write(tmp_path, "secret.yaml", "seed: 1\n")
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "link.yaml").symlink_to(tmp_path / "secret.yaml")
    top = _write(tmp_path, "inner/run.yaml", "base: link.yaml\n")
    with pytest.raises(ConfigError, match="secret.yaml, outside"):
        _load(top)


def test_bases_nest_at_most_so_deep(tmp_path):
    for i in range(MAX_BASE_DEPTH + 2):
        _write(
            tmp_path, f"c{i}.yaml", f"base: c{i + 1}.yaml\n" if i <= MAX_BASE_DEPTH else "seed: 3\ndata: {train: /s}\n"
        )
    with pytest.raises(ConfigError, match=f"bases nested over {MAX_BASE_DEPTH} deep"):
        _load(tmp_path / "c0.yaml")
    assert _load(tmp_path / "c1.yaml").seed == 3  # one level less is fine


def _fifo(folder, name: str):
    import os

    p = folder / name
    os.mkfifo(p)
    return p


def test_a_fifo_or_a_device_as_a_config_is_not_a_regular_file_not_missing(tmp_path):
    """Issue 35: a FIFO, /dev/zero or /dev/stdin named as the config, or as a base, said "not found"."""
    import os
    import stat

    fifo = _fifo(tmp_path, "p.yaml")
    with pytest.raises(ConfigError, match=re.escape(f"config '{fifo}' is not a regular file (a FIFO); pass a YAML")):
        _load(fifo)
    with pytest.raises(ConfigError, match=re.escape("config '/dev/zero' is not a regular file (a device); pass")):
        _load("/dev/zero")
    if not stat.S_ISREG(os.stat("/dev/stdin").st_mode):  # a file given as stdin is read, as any file
        with pytest.raises(ConfigError, match=re.escape("config '/dev/stdin' is not a regular file (a")):
            _load("/dev/stdin")
    top = _write(tmp_path, "run.yaml", "base: p.yaml\n")
    with pytest.raises(
        ConfigError, match=re.escape(f"base 'p.yaml' is not a regular file (a FIFO) (looked for {fifo}")
    ):
        _load(top)


def test_reading_a_fifo_never_waits_for_a_writer(tmp_path):
    """read_config_file refuses what is not a regular file once it has it open (a FIFO swapped in after the checks)
    without blocking: a plain open() of a FIFO waits for a writer."""
    import os
    import threading

    from hbpe.training.train.config_io import read_config_file

    fifo = _fifo(tmp_path, "p.yaml")
    errors: list[BaseException] = []
    reader = threading.Thread(target=lambda: _catch(errors, read_config_file, fifo), daemon=True)
    reader.start()
    reader.join(timeout=10)
    blocked = reader.is_alive()
    if blocked:  # release it: open the write end, which the waiting reader's open() needs
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=10)
    assert not blocked, "read_config_file waited for a writer of the FIFO"
    assert [str(e) for e in errors] == [f"{fifo} is not a regular file (a FIFO); pass a YAML config file"]


def _catch(errors: list, f, *args) -> None:
    try:
        f(*args)
    except Exception as e:
        errors.append(e)
