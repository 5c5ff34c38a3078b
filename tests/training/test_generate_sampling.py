"""Sampling options of generation (training/inference/sampling.py) and stop strings, on a trained patch model
(the `tiny_run` fixture) and a `bytes` model with scaled weights: top_k=1 and a tiny top_p are the
greedy choice, a stop string cuts the output before it, and a seeded draw is reproducible."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.errors import ArtifactError, ConfigError
from hbpe.training.inference.generate import generate, generate_batch
from hbpe.training.inference.sampling import Sampling, check_sampling_args

PROMPTS = ["Mr. Speaker, the state of our Union", "We the People", "To the Congress of the United States:"]


@pytest.fixture(scope="module")
def patch_model(tiny_run):
    from hbpe.training import load_model

    model, tok, _ = load_model(str(tiny_run))
    return model, tok


@pytest.fixture(scope="module")
def bytes_model(gpt2_tokenizer):
    from tests.helpers import scaled_model as _scaled_model

    return _scaled_model("bytes", gpt2_tokenizer, seed=3), gpt2_tokenizer


@pytest.fixture(params=["patch", "bytes"])
def model_tok(request):
    return request.getfixturevalue(f"{request.param}_model")


def _texts(gens) -> list[str]:
    return [g.text for g in gens]


def test_top_k_1_and_a_tiny_top_p_are_greedy(model_tok):
    model, tok = model_tok
    greedy = generate_batch(model, tok, PROMPTS, max_bytes=60)
    drawn = generate_batch(model, tok, PROMPTS, max_bytes=60, temperature=1.0, seed=1)
    assert _texts(drawn) != _texts(greedy)  # a draw at temperature 1 is not greedy: the cuts below make it so
    assert _texts(generate_batch(model, tok, PROMPTS, max_bytes=60, temperature=1.0, seed=1, top_k=1)) == _texts(greedy)
    assert _texts(generate_batch(model, tok, PROMPTS, max_bytes=60, temperature=1.0, seed=1, top_p=1e-6)) == _texts(
        greedy
    )
    # the uncached reference samples through the same rule
    assert generate(model, tok, PROMPTS[0], max_bytes=30, temperature=2.0, top_k=1, use_cache=False).text == (
        generate(model, tok, PROMPTS[0], max_bytes=30).text
    )


def test_a_seeded_draw_is_reproducible(model_tok):
    model, tok = model_tok
    kw = dict(max_bytes=60, temperature=1.0, top_k=20, top_p=0.95)
    first = generate_batch(model, tok, PROMPTS, seed=7, **kw)
    assert _texts(generate_batch(model, tok, PROMPTS, seed=7, **kw)) == _texts(first)
    assert _texts(generate_batch(model, tok, PROMPTS, seed=8, **kw)) != _texts(first)


def test_a_stop_string_cuts_the_output_before_it(model_tok):
    model, tok = model_tok
    prompt = PROMPTS[1]
    full = generate(model, tok, prompt, max_bytes=80)
    new = full.text[len(prompt) :]
    assert len(new) >= 20
    stop = new[8:11]  # text the greedy continuation holds: its first occurrence ends generation
    at = new.index(stop)
    cut = generate(model, tok, prompt, max_bytes=80, stop=["never in this text \u2603", stop])
    assert cut.text == prompt + new[:at] and cut.new_bytes < full.new_bytes
    assert (cut.stopped, cut.stop) == ("stop", stop) and full.stopped != "stop" and full.stop is None
    # a stop string inside the prompt does not count; one the output would reach only past max_bytes neither
    assert generate(model, tok, prompt, max_bytes=80, stop=[prompt[:4]]).text == full.text
    nb = new.encode()
    if full.new_bytes != len(nb):  # the scaled bytes model emits bytes that are not UTF-8: no text to pick from
        return
    late = nb[37:42].decode()  # straddles max_bytes=40: a stop only if an earlier copy ends within 40 bytes
    ends_within = 0 <= nb.find(late.encode()) <= 40 - len(late.encode())
    assert generate(model, tok, prompt, max_bytes=40, stop=[late]).stopped == ("stop" if ends_within else "max_bytes")


def test_sampling_arguments_are_checked():
    with pytest.raises(ConfigError, match=r"^top_k=0: must be an integer >= 1 \(1 = greedy\); e\.g\. --top-k 50$"):
        check_sampling_args(top_k=0, top_p=None)
    with pytest.raises(ConfigError, match=r"^top_p=1\.5: must be a number in \(0, 1\]"):
        check_sampling_args(top_k=None, top_p=1.5)
    with pytest.raises(ConfigError, match=r"^stop string '': must be a non-empty string"):
        check_sampling_args(top_k=None, top_p=None, stop=["."])  # fine
        check_sampling_args(top_k=None, top_p=None, stop=[""])
    with pytest.raises(ConfigError, match=r"^stop='\.': pass a list of strings"):
        check_sampling_args(top_k=None, top_p=None, stop=".")
    # nucleus: 0.5 keeps the first symbol only when it holds half the mass; 0.7 adds the second
    probs = torch.tensor([0.6, 0.3, 0.1]).log()
    gen = torch.Generator().manual_seed(0)
    assert {Sampling(1.0, top_p=0.5).choose(probs, gen) for _ in range(50)} == {0}
    assert {Sampling(1.0, top_p=0.7).choose(probs, gen) for _ in range(200)} == {0, 1}
    assert {Sampling(1.0, top_k=2).choose(probs, gen) for _ in range(200)} == {0, 1}


def test_generate_command_samples_and_stops(tiny_run, patch_model):
    model, tok = patch_model
    args = ["generate", "--checkpoint", str(tiny_run), "--prompt", PROMPTS[1], "--max-bytes", "60", "--json"]
    greedy = generate(model, tok, PROMPTS[1], max_bytes=60)
    stop = greedy.text[len(PROMPTS[1]) :][5:8]
    r = CliRunner().invoke(main, [*args, "--temperature", "0.7", "--top-k", "1", "--stop", "@@", "--stop", stop])
    assert r.exit_code == 0, r.output
    [out] = json.loads(r.stdout)
    expected = generate(model, tok, PROMPTS[1], max_bytes=60, stop=[stop])
    assert out["text"] == expected.text and (out["stopped"], out["stop"]) == ("stop", stop)
    r = CliRunner().invoke(main, [*args, "--temperature", "0.9", "--top-p", "0.8", "--seed", "4"])
    [out] = json.loads(r.stdout)
    assert out["text"] == generate(model, tok, PROMPTS[1], max_bytes=60, temperature=0.9, top_p=0.8, seed=4).text
    r = CliRunner().invoke(main, [*args, "--top-p", "0"])
    assert r.exit_code == 2 and "--top-p" in r.output
    help_text = CliRunner().invoke(main, ["generate", "--help"]).output
    assert "0 = greedy" in help_text and "[default: 0.0" in help_text and "--stop" in help_text


@pytest.mark.parametrize(
    "logits", [[0.0, float("nan"), 1.0], [0.0, float("inf"), 1.0], [float("-inf")] * 3], ids=["nan", "inf", "none-left"]
)
@pytest.mark.parametrize(
    "sampling", [Sampling(), Sampling(temperature=0.8, top_k=2, top_p=0.9)], ids=["greedy", "draw"]
)
def test_logits_that_are_not_finite_are_one_error_not_a_symbol(logits, sampling):
    """argmax picked NaN's symbol (NUL bytes with rc 0), the draw crashed: `probability tensor contains inf/nan`."""
    with pytest.raises(ArtifactError, match=r"the model's logits for the next symbol.* are not finite \(NaN or inf\)"):
        sampling.choose(torch.tensor(logits), torch.Generator())


def test_a_bytes_model_whose_logits_overflow_is_one_error(gpt2_tokenizer):
    """The byte-at-a-time path (byte_generation.py) chooses through the same rule."""
    from tests.helpers import scaled_model

    model = scaled_model("bytes", gpt2_tokenizer, seed=3)
    with torch.no_grad():
        model.latent.norm.weight.fill_(1e38)  # finite: passes the load check, overflows the head's logits
    for kw in ({}, {"temperature": 0.8}, {"use_cache": False}):
        with pytest.raises(ArtifactError, match=r"the model's logits for the next symbol.* are not finite"):
            generate(model, gpt2_tokenizer, PROMPTS[0], max_bytes=10, **kw)
