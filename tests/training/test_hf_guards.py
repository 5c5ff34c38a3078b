"""The exported HF folder refuses what hbpe's own loader refuses, and generate() options it cannot honour: a
config.json out of range (checked before anything is allocated), weights or logits that are not finite, sampling
options that cannot draw, inputs whose shapes do not fit; each one ValueError naming the value and the fix."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local: a network call would be a bug

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("hf_modules")  # each test loads the remote code into its own folder

FIX = r"; config\.json was edited or damaged: export the model again \(`hbpe export --format hf`\)"


@pytest.fixture(scope="module")
def export_dir(gpt2_tokenizer, tmp_path_factory) -> Path:
    """`hbpe export --format hf` of the tiny config, untrained: these tests check refusals, not text."""
    from hbpe.schemas.train_config import model_config
    from hbpe.training.checkpoint.export_format import write_export
    from hbpe.training.model.build import build_model
    from hbpe.training.model.patch_lm import VocabSpec

    model = build_model(model_config("tiny"), VocabSpec.from_tokenizer(gpt2_tokenizer))
    out = tmp_path_factory.mktemp("hf-guards") / "model"
    write_export(model, gpt2_tokenizer, str(out), source={"test": "the tiny config, untrained"}, hf=True)
    return out


@pytest.fixture
def hf(export_dir, hf_modules):
    model = transformers.AutoModelForCausalLM.from_pretrained(export_dir, trust_remote_code=True).eval()
    return model, transformers.AutoTokenizer.from_pretrained(export_dir, trust_remote_code=True)


def _copy(export_dir: Path, tmp_path: Path, **config) -> Path:
    """A copy of the export whose config.json has `config`'s values."""
    folder = Path(shutil.copytree(export_dir, tmp_path / "model"))
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))  # NaN and Infinity as json writes them
    return folder


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # before: generate() returned [188, 188, 188] (NaN), ZeroDivisionError, SystemError, a 4 TB allocation
        ({"rope_theta": float("nan")}, r"rope_theta=nan must be a finite number > 0"),
        ({"rope_theta": float("inf")}, r"rope_theta=inf must be a finite number > 0"),
        ({"latent_heads": 0}, r"latent_heads=0 must be an integer in 1\.\.1024"),
        ({"latent_layers": 1e9}, r"latent_layers=1000000000\.0 must be an integer in 1\.\.1024"),
        ({"latent_dim": 1e12}, r"latent_dim=1000000000000\.0 must be an integer in 1\.\.65536"),
        ({"local_dim": 60}, r"local_dim=60 must split into an even head size over local_heads=4"),
        ({"encoder_layers": True}, r"encoder_layers=True must be an integer in 1\.\.1024"),
        ({"max_patch_size": 0}, r"max_patch_size=0 must be an integer in 1\.\.255"),
        ({"symbol_vocab_size": 1 << 20}, r"symbol_vocab_size=1048576 must be an integer in 259\.\.65536"),
        ({"dropout": float("nan")}, r"dropout=nan must be a number in \[0, 1\)"),
        ({"eos_token_id": 50257}, r"eos_token_id=50257 must be one token id in 0\.\.50256 \(the document marker\)"),
    ],
)
def test_a_config_out_of_range_is_one_error_before_anything_is_built(export_dir, tmp_path, change, message):
    folder = _copy(export_dir, tmp_path, **change)
    with pytest.raises(ValueError, match=rf"^HbpeConfig: {message}[^;]*{FIX}$"):
        transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)


def test_a_size_given_to_from_pretrained_is_checked_as_well(export_dir):
    # transformers sets such a field after HbpeConfig.__init__: the model checks its config again before building
    with pytest.raises(ValueError, match=rf"^HbpeConfig: local_heads=0 must be an integer in 1\.\.1024{FIX}$"):
        transformers.AutoModelForCausalLM.from_pretrained(export_dir, trust_remote_code=True, local_heads=0)


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
def test_weights_that_are_not_finite_are_refused_when_loaded(export_dir, tmp_path, value):
    from safetensors.torch import load_file, save_file

    folder = _copy(export_dir, tmp_path)
    weights = load_file(folder / "model.safetensors")
    weights["latent.blocks.1.mlp.down.weight"][3, 5] = value  # (64, 128)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ValueError,
        match=r"^HbpeForCausalLM: weight latent\.blocks\.1\.mlp\.down\.weight in .* holds 1 non-finite values \(NaN "
        r"or inf\) of 8192: the training run diverged .* export an earlier checkpoint",
    ):
        transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)


def test_logits_that_overflow_are_one_error_not_a_token(hf):
    model, tok = hf
    with torch.no_grad():  # finite weights so large that the head's sums overflow float32 to inf
        model.io.decoder.head.weight.normal_(0.0, 1e38, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"logits for the next symbol are not finite \(NaN or inf\): its weights"):
        model.generate(**tok("In 1950", return_tensors="pt"), max_new_tokens=2)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        # before: RuntimeError: invalid multinomial distribution / probability tensor contains either inf, nan
        ({"top_p": 0.0}, r"top_p=0\.0 must be a number in \(0, 1\]"),
        ({"top_p": float("nan")}, r"top_p=nan must be a number in \(0, 1\]"),
        ({"temperature": float("inf")}, r"temperature=inf with do_sample=True must be a number in \[0\.0001, 10000\]"),
        ({"temperature": 1e-30}, r"temperature=1e-30 with do_sample=True must be a number in \[0\.0001, 10000\]"),
        ({"top_k": -1}, r"top_k=-1 must be an integer >= 0 \(0: every symbol\)"),
    ],
)
def test_sampling_options_that_cannot_draw_are_one_error(hf, options, message):
    model, tok = hf
    with pytest.raises(ValueError, match=rf"^HbpeForCausalLM\.generate: {message}"):
        model.generate(**tok("In 1950", return_tensors="pt"), max_new_tokens=2, do_sample=True, **options)


def test_inputs_whose_shapes_do_not_fit_are_one_error_naming_the_argument(hf):
    model, tok = hf
    enc = tok(["The State of the Union", "In"], return_tensors="pt", padding=True)
    ids, shape = enc["input_ids"], re.escape(str(tuple(enc["input_ids"].shape)))
    # before: a (2, 1) mask was broadcast over every column (other text, and a loss)
    short = torch.ones(2, 1, dtype=torch.long)
    wrong = rf"^attention_mask of shape \(2, 1\) for input_ids of shape {shape}: it must have input_ids' shape"
    with pytest.raises(ValueError, match=wrong):
        model.generate(input_ids=ids, attention_mask=short, max_new_tokens=2)
    with pytest.raises(ValueError, match=wrong):
        model(input_ids=ids, attention_mask=short, labels=ids)
    with pytest.raises(ValueError, match=r"^attention_mask holds values other than 0 and 1"):
        model.generate(input_ids=ids, attention_mask=enc["attention_mask"] * 2, max_new_tokens=2)
    # before: transformers' "max(): Expected reduction dim", an IndexError, torch reshape errors
    for empty in ((0, 3), (2, 0)):
        with pytest.raises(ValueError, match=rf"^input_ids of shape {re.escape(str(empty))}: generate\(\) continues"):
            model.generate(input_ids=torch.zeros(empty, dtype=torch.long), max_new_tokens=2)
        with pytest.raises(ValueError, match=rf"^input_ids of shape {re.escape(str(empty))}: the model reads a batch"):
            model(input_ids=torch.zeros(empty, dtype=torch.long))
    with pytest.raises(ValueError, match=r"takes patches of shape \(batch >= 1, T >= 2, S=10\), got \(2, 1, 10\)"):
        model(patches=tok.patches(["a", "b"]))


def test_the_exported_code_bounds_what_hbpe_bounds():
    """The shipped config (configuration_hbpe.py, which imports no hbpe) holds copies of hbpe's bounds, held equal
    here; the model and generate() read hbpe's own (the hbpe_*.py copies, test_hf_library.py)."""
    from hbpe.schemas.tokenizer_artifact import MAX_PATCH_SIZE_LIMIT, MAX_VOCAB_SIZE
    from hbpe.schemas.train_config import MODEL_SIZE_LIMITS
    from hbpe.training.checkpoint.hf import configuration_hbpe

    assert configuration_hbpe.SIZE_LIMITS == MODEL_SIZE_LIMITS
    assert configuration_hbpe.SYMBOLS_RANGE[1] == MAX_VOCAB_SIZE
    assert configuration_hbpe.PATCH_SIZE_RANGE[1] == MAX_PATCH_SIZE_LIMIT


def test_remote_code_is_imported_from_this_tests_own_modules_folder(export_dir, hf_modules):
    # before: ~/.cache/huggingface/modules, rewritten by every test run and xdist worker
    config = transformers.AutoConfig.from_pretrained(export_dir, trust_remote_code=True)
    module = sys.modules[type(config).__module__]
    assert Path(module.__file__).is_relative_to(hf_modules)
    assert (hf_modules / "transformers_modules" / "model" / "modeling_hbpe.py").is_file() is False  # not loaded yet
    transformers.AutoModelForCausalLM.from_pretrained(export_dir, trust_remote_code=True)
    assert (hf_modules / "transformers_modules" / "model" / "modeling_hbpe.py").is_file()


def test_labels_that_are_not_the_input_ids_are_one_error(hf):
    """A causal LM's labels are its input_ids (-100 where not scored): labels shifted by the caller, as some
    training loops do, would score each token as its successor's prediction."""
    model, tok = hf
    enc = tok(["The State of the Union", "In"], return_tensors="pt", padding=True)
    ids = enc["input_ids"]
    shifted = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
    with pytest.raises(ValueError, match=r"^labels differ from input_ids where they are scored: a causal LM's labels"):
        model(**enc, labels=shifted)
    out = model(**enc, labels=ids.masked_fill(enc["attention_mask"] == 0, -100))  # the ids themselves: scored
    assert torch.isfinite(out.loss) and float(out.loss) > 0
