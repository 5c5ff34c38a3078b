"""`hbpe export --format hf`: transformers loads the folder offline and computes what hbpe computes."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local: a network call would be a bug

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("hf_modules")  # each test loads the remote code into its own folder


@pytest.fixture(scope="module")
def hf_dir(tiny_run, tmp_path_factory):
    from hbpe.training import export_model

    out = tmp_path_factory.mktemp("hf") / "model"
    summary = export_model(str(tiny_run), str(out), format="hf")
    assert summary["format"] == "hf"
    return out


def _eval_batches(data: str, tok, model_cfg, *, batch_size: int = 8):
    """The batches `hbpe eval` scores, in its order (evaluate.py's dataloader)."""
    import tempfile

    from hbpe.training.data.loader import build_dataloader, check_compatible, read_manifest, stop_downloads
    from hbpe.training.data.schemes import build_scheme

    manifest = read_manifest(data)
    scheme = build_scheme(model_cfg, tok, derive=check_compatible(manifest, tok, where=data).derive)
    with tempfile.TemporaryDirectory() as cache:
        dl = build_dataloader(
            data, tok, batch_size=batch_size, cache_dir=cache, shuffle=False, shuffle_seed=0, drop_last=False,
            manifest=manifest, scheme=scheme,
        )  # fmt: skip
        batches = list(dl)
        stop_downloads(dl)
        del dl
    return batches


def test_auto_classes_load_the_export_offline(hf_dir):
    names = {p.name for p in hf_dir.iterdir()}
    # one folder for both: hbpe's export and transformers' files
    assert {"hbpe_model.json", "model.safetensors", "tokenizer", "config.json", "modeling_hbpe.py"} <= names
    config = transformers.AutoConfig.from_pretrained(hf_dir, trust_remote_code=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True)
    info = json.loads((hf_dir / "hbpe_model.json").read_text())
    assert (config.model_type, type(model).__name__) == ("hbpe", "HbpeForCausalLM")
    assert (config.latent_layers, config.symbol_vocab_size) == (info["model"]["latent_layers"], info["vocab_size"])
    assert isinstance(model, transformers.PreTrainedModel) and model.can_generate()
    assert model.io.encoder.embed is model.io.decoder.embed is model.get_input_embeddings()  # E: one table, as in hbpe
    assert config.tie_word_embeddings and model.get_output_embeddings() is None  # E is shared; the head is its own
    assert sum(p.numel() for p in model.parameters()) == info["parameters"]
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
    # one first-stage token is one patch: the tokenizer's ids are the model's vocabulary
    assert len(tok) == config.vocab_size == info["n_vocab"] == 50257
    assert tok.eos_token == tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id == config.eos_token_id == config.pad_token_id == 50256
    batch = tok(["a b c", "a"], padding=True, return_tensors="pt")  # left padding with eos, as generate() wants
    assert batch["input_ids"][1].tolist() == [50256, 50256, 64] and batch["attention_mask"][1].tolist() == [0, 0, 1]


def test_hf_logits_equal_hbpe_logits_on_a_sample_batch(hf_dir, sample_shards):
    from hbpe.training import load_model

    hbpe_model, tok, _ = load_model(str(hf_dir))
    assert hbpe_model.cfg.latent_layers >= 2
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True).eval()
    batch = {k: torch.as_tensor(v) for k, v in _eval_batches(str(sample_shards[1]), tok, hbpe_model.cfg)[0].items()}
    with torch.inference_mode():
        want, targets = hbpe_model(batch)  # (M, V), (M,)
        got = model(patches=batch["patches"]).logits  # (B, T-1, S, V)
    B, N, S = batch["patches"].shape
    assert got.shape == (B, N - 1, S, tok.vocab_size)
    assert (targets != -100).sum() > 1000  # a real batch, mostly text
    slots = hbpe_model.io.decoded_slots(batch)  # hbpe's packed decoder has a row per real target only
    torch.testing.assert_close(got.reshape(-1, tok.vocab_size)[slots], want, rtol=1e-5, atol=1e-5)


def test_bpb_through_transformers_equals_hbpe_eval(hf_dir, sample_shards):
    from hbpe.training import evaluate, load_model

    data = str(sample_shards[1])
    # the first 4 batches of 8 in `hbpe eval`'s order (max_batches takes that prefix), not the whole held-out set
    want = evaluate(str(hf_dir), data, batch_size=8, max_batches=4)
    _, tok, _ = load_model(str(hf_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True).eval()
    nll = nbytes = 0.0
    with torch.inference_mode():
        for batch in _eval_batches(data, tok, load_model(str(hf_dir))[0].cfg)[:4]:
            patches = torch.as_tensor(batch["patches"])
            nll += float(model(patches=patches, labels=patches).nll_sum)
            # the denominator counted here, not taken from the scheme's target_bytes (which `hbpe eval` divides
            # by too): the UTF-8 bytes of the predicted text, tokens 2..N of each sample decoded by the tokenizer
            nbytes += sum(len(tok.decode_tokens(row[1:]).encode("utf-8")) for row in batch["tokens"].tolist())
    assert nbytes == want["bytes"] > 0
    assert nll / math.log(2) / nbytes == pytest.approx(want["bpb"], abs=1e-5)
    assert 1.0 < want["bpb"] < 8.0  # a trained model, not a uniform one (log2 V' = 8.9)


def test_a_one_dimensional_input_is_refused(hf_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True)
    with pytest.raises(ValueError, match=r"takes input_ids \(batch, T\) or patches \(batch, T, S=10\), got .* \(5,\)"):
        model(input_ids=torch.zeros(5, dtype=torch.long))


def test_only_the_hierarchical_model_exports_for_hf():
    from hbpe.schemas.errors import ConfigError
    from hbpe.schemas.train_config import model_config
    from hbpe.training.checkpoint.hf_export import check_hf_exportable

    with pytest.raises(ConfigError, match=r"model.io=bpe model; only the hierarchical .* without --format hf"):
        check_hf_exportable(model_config("tiny", io="bpe"))


def test_plain_export_over_an_hf_export_leaves_no_hf_files(hf_dir, tiny_run, tmp_path):
    import shutil

    from hbpe.training import export_model

    out = tmp_path / "m"
    shutil.copytree(hf_dir, out)
    export_model(str(tiny_run), str(out), overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["hbpe_model.json", "model.safetensors", "tokenizer"]
    export_model(str(tiny_run), str(out), overwrite=True, format="hf")  # and back
    assert (out / "config.json").is_file()


def _readme_example() -> str:
    from tests.conftest import REPO

    text = (REPO / "docs" / "huggingface.md").read_text()  # the README links to it
    return text[text.index("```python\n") + 10 : text.index("```\n", text.index("```python"))]


def test_readme_example_runs_and_round_trips_through_save_pretrained(hf_dir, tmp_path):
    from hbpe.pipeline.tokenizer import artifact

    env = {"DIR": str(hf_dir), "SAVED": str(tmp_path / "saved")}
    exec(compile(_readme_example(), "docs/huggingface.md", "exec"), env)  # the page's code, as written
    tok, out = env["tok"], env["out"]
    assert tok.decode(env["ids"]) == env["text"] == tok.decode_patches(env["patches"][0])
    hbpe_tok = artifact.load(hf_dir / "tokenizer")
    assert env["ids"] == hbpe_tok.encode(env["text"]).tolist()
    assert 0.5 < env["bpb"] < 8.0
    assert [t[: len(p)] for t, p in zip(env["texts"], ["Fellow citizens,", "The"])] == ["Fellow citizens,", "The"]
    assert all(len(t) > len("Fellow citizens,") for t in env["texts"]) and 0 < float(env["loss"]) < 10
    assert env["generated"][0]["generated_text"].startswith("Fellow citizens,")
    # save_pretrained -> from_pretrained: the same classes, the same numbers
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved", trust_remote_code=True).eval()
    tok2 = transformers.AutoTokenizer.from_pretrained(tmp_path / "saved", trust_remote_code=True)
    with torch.inference_mode():
        torch.testing.assert_close(again(patches=env["patches"]).logits, out.logits, rtol=0, atol=0)
    assert torch.equal(tok2.patches([env["text"]]), env["patches"])
    assert artifact.load(tmp_path / "saved" / "tokenizer").fingerprint == hbpe_tok.fingerprint  # hbpe reads it too


def test_hf_tokenizer_gives_hbpe_ids_and_patches_on_the_sample(hf_dir, sample_texts):
    from hbpe.pipeline.tokenizer import artifact

    hbpe_tok = artifact.load(hf_dir / "tokenizer")
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
    texts = [t[:2000] for t in sample_texts[:8]] + ["naïve café 日本語 <|endoftext|> \n\n  x"]
    batch = tok.patches(texts)  # (B, T, S), rows padded with all-PAD patches
    for i, text in enumerate(texts):
        ids, patches = hbpe_tok.encode_patches(text)
        assert tok(text)["input_ids"] == ids.tolist()  # special tokens stay text, as in hbpe's encode_ordinary
        assert np.array_equal(batch[i, : len(ids)].numpy(), patches)
        assert (batch[i, len(ids) :] == 257).all()
        assert tok.decode(ids.tolist()) == text == tok.decode_patches(batch[i])
        assert tok.nbytes(ids.tolist()) == hbpe_tok.nbytes(ids) == len(text.encode())


def test_an_export_with_an_old_style_tokenizer_json_still_loads(hf_dir, tmp_path):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(hf_dir, old)
    (old / "tokenizer" / "hbpe_tokenizer.json").rename(old / "tokenizer" / "tokenizer.json")
    tok = transformers.AutoTokenizer.from_pretrained(old, trust_remote_code=True)
    new = transformers.AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
    assert tok.fingerprint == new.fingerprint and torch.equal(tok.patches(["a b c"]), new.patches(["a b c"]))
    from hbpe.training import load_model

    assert load_model(str(old))[1].fingerprint == tok.fingerprint  # and hbpe eval/generate read it
