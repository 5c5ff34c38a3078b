"""infra/gpu/step_overhead.py (the GPU step's overhead check) at a tiny size on CPU: every variant measured, the
JSON written after each, the tiles step free of data-dependent ops where the blocks step is not."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from hbpe.pipeline.shards.reader import ShardDir
from hbpe.training.bench_step import save_token_batches

SCRIPT = Path(__file__).resolve().parents[2] / "infra" / "gpu" / "step_overhead.py"
TINY = dict(latent_layers=2, latent_dim=32, latent_ffn=64, latent_heads=2, local_dim=16, local_ffn=32, local_heads=2,
            encoder_layers=2, decoder_layers=2)  # fmt: skip


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("step_overhead", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_script_measures_every_variant_on_cpu(script, sample_shards, tmp_path):
    d = ShardDir(sample_shards[0])
    rows = np.stack([np.asarray(s["tokens"], dtype=np.int32)[:33] for _, s in zip(range(24), d.samples())])
    batches = tmp_path / "batches.npz"
    save_token_batches(d.tokenizer, {"train": rows}, batches)
    out = tmp_path / "out.json"
    result = script.run(batches, out, device="cpu", steps=4, models={"t": ("tiny", TINY)}, shapes=(("t", 4),))
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    runs = {(r["name"], r["compiled"]): r for r in result["runs"]}
    assert set(runs) == {("tiles", True), ("bpe", True), ("tiles", False), ("bpe", False), ("blocks", False),
                         ("padded", False)}  # fmt: skip
    for key, r in runs.items():
        assert "error" not in r, (key, r)
        assert r["bytes_per_sec"] > 0 and np.isfinite(r["train_loss"]) and r["kernels_per_step"] > 0, key
    assert (
        runs[("tiles", False)]["packed_attention"] == "tiles"
        and runs[("blocks", False)]["packed_attention"] == "blocks"
    )
    # the tiles step launches fewer ops than the length blocks (one attention call per layer, no permutations)
    assert runs[("tiles", False)]["kernels_per_step"] < runs[("blocks", False)]["kernels_per_step"]
    # eager and compiled train the same model from the same seed: the same losses to fp32 rounding
    assert runs[("tiles", True)]["train_loss"] == pytest.approx(runs[("tiles", False)]["train_loss"], rel=1e-4)
