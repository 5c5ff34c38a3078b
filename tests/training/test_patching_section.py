"""model.patching: the byte-patch baselines' settings in a section of their own (schemas/train_config.py), and the
flat keys of older configs and runs (`model.patch_max_bytes`, `model.entropy_threshold`, ...) read into it."""

from __future__ import annotations

import json

import pytest

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.train_config import FLAT_PATCHING_KEYS, PatchingConfig, model_config
from tests.conftest import copy_run

FLAT = {"patch_max_bytes": 4, "patch_boundaries": "given", "hash_ngram_buckets": 16, "entropy_bounded": False}
NESTED = PatchingConfig(max_bytes=4, boundaries="given", hash_ngram_buckets=16, entropy_bounded=False)


def test_a_yaml_config_with_the_flat_keys_loads_into_model_patching(tmp_path):
    from hbpe.training.train.config_io import load_config

    lines = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in FLAT.items())
    (tmp_path / "old.yaml").write_text(f"model_size: tiny\nmodel:\n  io: space\n{lines}")
    cfg = load_config(str(tmp_path / "old.yaml"), ["data.train=x"], check_paths=False)
    assert cfg.model.patching == NESTED
    assert cfg.model.io == "space" and "patch_max_bytes" not in cfg.to_dict()["model"]  # written back nested
    # and the overrides of older command lines
    again = load_config("tiny", ["data.train=x", "model.patch_max_bytes=4", "model.patching.boundaries=given"],
                        check_paths=False)  # fmt: skip
    assert (again.model.patching.max_bytes, again.model.patching.boundaries) == (4, "given")


def test_a_setting_given_flat_and_nested_is_refused():
    with pytest.raises(ConfigError, match=r"model.patch_max_bytes and model.patching.max_bytes are the same setting"):
        model_config(patch_max_bytes=4, patching={"max_bytes": 5})
    with pytest.raises(ConfigError, match=r"model.patching.max_bytes=0: must be at least 1"):
        model_config(patching={"max_bytes": 0})


def test_a_run_saved_with_the_flat_keys_loads_resumes_and_exports(tiny_run, sample_shards, tmp_path):
    """hbpe_run.json of a run trained before model.patching: its model section holds the flat keys."""
    from hbpe.training.checkpoint.export import export_model
    from hbpe.training.checkpoint.load import load_model
    from hbpe.training.checkpoint.run_files import read_run_files
    from hbpe.training.checkpoint.save_folder import check_resume_matches
    from hbpe.training.train.config_io import load_config

    run = copy_run(tiny_run, tmp_path / "run")
    meta = json.loads((run / "hbpe_run.json").read_text())
    patching = meta["model"].pop("patching")
    meta["model"].update({flat: patching[key] for flat, key in FLAT_PATCHING_KEYS.items()})
    (run / "hbpe_run.json").write_text(json.dumps(meta))

    model, _, _ = load_model(str(run))
    assert model.cfg.patching == PatchingConfig(**patching)
    data = [f"data.train={sample_shards[0]}", f"data.eval={sample_shards[1]}"]
    cfg = load_config("tiny", [*data, f"save_folder={run}", "autoresume=true", "max_duration=20ba"])
    check_resume_matches(cfg, read_run_files(str(run / "latest-rank0.pt"))[1])  # the same model: no change named
    export_model(str(run), str(tmp_path / "export"))
    assert json.loads((tmp_path / "export" / "hbpe_model.json").read_text())["model"]["patching"] == patching
    assert load_model(str(tmp_path / "export"))[0].cfg == model.cfg
