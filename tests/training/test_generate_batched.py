"""KV-cached, batched generation (training/inference/kv_decode.py) against the modules it reimplements.

The scaled model has 3 layers everywhere and weights far from the init (as in test_kv_cache.py),
so a wrong RoPE position, a stale key, a mask letting a filler slot in, or a misplaced norm gain
shows up as a large difference.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.symbols import EOD, PAD
from hbpe.schemas.train_config import model_config
from hbpe.training.inference.generate import generate, generate_batch
from hbpe.training.inference.kv_decode import CachedPatchLM
from hbpe.training.model.build import build_model
from hbpe.training.model.patch_lm import VocabSpec

VARIANTS = [("prefix", "mean"), ("prefix", "eop"), ("add", "mean"), ("add", "eop")]
TOL = 1e-5
PROMPTS = ["Mr. Speaker, the state of our Union is strong", "We the People", "To the Congress of the United States:"]


@pytest.fixture(autouse=True)
def _one_thread():
    """Numerics, not speed, are tested here: one intra-op thread keeps the module recomputations fast on a busy
    machine (two threads on two contended cores make each small op wait milliseconds for the other)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _scaled_model(tok, conditioning: str, pooling: str):
    torch.manual_seed(1)
    cfg = model_config(
        "tiny", latent_layers=3, encoder_layers=3, decoder_layers=3, conditioning=conditioning, pooling=pooling
    )
    model = build_model(cfg, VocabSpec.from_tokenizer(tok))
    with torch.no_grad():
        for p in model.parameters():  # far from the init: every layer changes its input noticeably
            p.copy_(torch.randn_like(p) * (0.1 if p.ndim > 1 else 0.3) + (1.0 if p.ndim == 1 else 0.0))
    return model.eval()


def _context(tok, text: str) -> list[list[int]]:
    return [[EOD]] + [row[row != PAD].tolist() for row in tok.patches(tok.encode(text))]


def _tensor(patches: list[list[int]], S: int) -> torch.Tensor:
    return torch.tensor([[p + [PAD] * (S - len(p)) for p in patches]])  # (1, T, S)


def _diff(cached: torch.Tensor, ref: torch.Tensor) -> float:
    """Max difference of two logit rows (V,); the cached path never offers PAD (-inf), the module's logits do."""
    assert cached[PAD] == float("-inf")
    keep = torch.arange(ref.shape[0]) != PAD
    return (cached[keep] - ref[keep]).abs().max().item()


def _module_h(model, context: list[list[int]], S: int) -> torch.Tensor:
    """h after the last patch, recomputed from scratch through the modules -> (1, D)."""
    return model.latent_step(model.io.encode_patches(_tensor(context, S)), None)[:, -1]


@pytest.mark.parametrize("conditioning,pooling", VARIANTS)
@torch.inference_mode()
def test_ragged_batch_matches_the_modules_row_by_row(gpt2_tokenizer, conditioning, pooling):
    """Rows of different prompt lengths, advancing by different numbers of patches: every logit equals recomputation."""
    tok, S = gpt2_tokenizer, gpt2_tokenizer.max_patch_size
    model = _scaled_model(tok, conditioning, pooling)
    contexts = [_context(tok, p) for p in PROMPTS]
    assert len({len(c) for c in contexts}) == 3  # ragged: three prompt lengths
    m = CachedPatchLM(model)
    h = m.prefill(contexts)  # (3, D)
    # each row gets new patches of its own: one, three (an out-of-vocabulary split), two
    new = [tok.encode_bytes(b" and"), tok.encode_bytes(b" xqzvkwj xqzvkwj xqzvkwj"), tok.encode_bytes(b" is")]
    new[2] = new[2] + tok.encode_bytes(b" strong")
    assert [len(n) for n in new] == [1, 3, 2]
    for step in range(2):
        logits = m.decoder_start(h)
        for k in range(3):  # the first symbols of the next patch: a fixed prefix, so every row is compared
            prefix = [104, 101, 108][:k]
            for b, context in enumerate(contexts):
                h_ref = _module_h(model, context, S)
                ref = model.io.symbol_logits(h_ref, torch.tensor([prefix], dtype=torch.long).reshape(1, k), None)[0]
                assert ref.abs().max() > 1.0  # non-trivial logits, so the tolerance means something
                assert _diff(logits[b], ref) < TOL, (step, b, k)
            logits = m.decoder_next(torch.tensor([[104, 101, 108][k]] * 3))
        if step == 0:
            h = m.advance(new)
            contexts = [c + n for c, n in zip(contexts, new)]
    m.keep([0, 2])  # drop the middle row: the others keep their positions and slots
    contexts = [contexts[0], contexts[2]]
    h = m.advance([[[32, 256]], [[32, 256]]])
    logits = m.decoder_start(h)
    for b, context in enumerate(contexts):
        ref = model.io.symbol_logits(_module_h(model, context + [[32, 256]], S), torch.zeros(1, 0).long(), None)[0]
        assert _diff(logits[b], ref) < TOL, b


@pytest.mark.parametrize("conditioning,pooling", VARIANTS)
def test_cached_generation_equals_recomputation(gpt2_tokenizer, conditioning, pooling, monkeypatch):
    """Greedy text with the caches == without, for every variant (patches of S symbols without EOP included)."""
    tok = gpt2_tokenizer
    model = _scaled_model(tok, conditioning, pooling)
    splits = []  # patches of S symbols without EOP go back through encode_bytes: rows then advance unevenly
    encode_bytes = tok.encode_bytes
    monkeypatch.setattr(tok, "encode_bytes", lambda data: splits.append(encode_bytes(data)) or splits[-1])
    cached = generate_batch(model, tok, PROMPTS, max_bytes=40, batch_size=3)
    assert any(len(s) > 1 for s in splits), splits
    for prompt, c in zip(PROMPTS, cached):
        u = generate(model, tok, prompt, max_bytes=40, use_cache=False)
        assert (c.text, c.patches, c.symbols, c.stopped) == (u.text, u.patches, u.symbols, u.stopped)
        assert c.new_bytes > 0


def test_a_prompt_continues_the_same_alone_or_in_a_batch(tiny_run):
    from hbpe.training.checkpoint.load import load_model

    model, tok, _ = load_model(str(tiny_run))
    for temperature in (0.0, 0.8):
        batched = generate_batch(model, tok, PROMPTS, max_bytes=80, temperature=temperature, seed=3, batch_size=3)
        for i, (prompt, b) in enumerate(zip(PROMPTS, batched)):
            alone = generate(model, tok, prompt, max_bytes=80, temperature=temperature, seed=3 + i)
            assert (b.text, b.stopped) == (alone.text, alone.stopped) and b.text.startswith(prompt), (temperature, b)
        assert any(b.new_bytes >= 77 for b in batched)  # not trivially short: rows ran long enough to drift apart
    in_twos = generate_batch(model, tok, PROMPTS, max_bytes=30, batch_size=2)  # a batch of 2, then one of 1
    assert [g.text for g in in_twos] == [g.text for g in generate_batch(model, tok, PROMPTS, max_bytes=30)]
    same = generate_batch(model, tok, [PROMPTS[1]] * 4, max_bytes=40, temperature=1.0, seed=5)
    assert len({g.text for g in same}) == 4  # one prompt four times: four samples, not four copies


def test_batch_arguments_are_checked(gpt2_tokenizer):
    model = _scaled_model(gpt2_tokenizer, "prefix", "mean")
    with pytest.raises(ConfigError, match=r"no prompts to continue; pass at least one"):
        generate_batch(model, gpt2_tokenizer, [], max_bytes=10)
    with pytest.raises(ConfigError, match=r"batch_size=0: must be an integer >= 1"):
        generate_batch(model, gpt2_tokenizer, ["a"], max_bytes=10, batch_size=0)
    with pytest.raises(ConfigError, match=r"the prompt is not valid UTF-8"):
        generate_batch(model, gpt2_tokenizer, ["fine", "bad \udcff"], max_bytes=10)
    model.cfg = dataclasses.replace(model.cfg, max_patches=8)
    with pytest.raises(ConfigError, match=r"prompt 2 of 2 is 12 patches and the model's latent context holds 8"):
        generate_batch(model, gpt2_tokenizer, ["short", "a" + " a" * 11], max_bytes=10)


def test_generate_command_takes_several_prompts(tiny_run, tmp_path):
    import json

    from click.testing import CliRunner

    from hbpe.cli import main
    from hbpe.training.checkpoint.load import load_model

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("We the People\nTo the Congress of the United States:\n")
    args = ["generate", "--checkpoint", str(tiny_run), "--prompt", PROMPTS[0], "--prompts-file", str(prompts)]
    r = CliRunner().invoke(main, [*args, "--max-bytes", "25", "--temperature", "0.9", "--batch-size", "2", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    model, tok, _ = load_model(str(tiny_run))
    expected = generate_batch(model, tok, PROMPTS, max_bytes=25, temperature=0.9)
    assert [o["prompt"] for o in out] == PROMPTS and [o["text"] for o in out] == [g.text for g in expected]
    prompts.write_bytes(b"ok\n\xff\n")
    r = CliRunner().invoke(main, ["generate", "--checkpoint", str(tiny_run), "--prompts-file", str(prompts)])
    assert r.exit_code == 2 and "is not UTF-8 (at byte offset 3); convert it" in r.output
    r = CliRunner().invoke(main, ["generate", "--checkpoint", str(tiny_run)])
    assert r.exit_code == 2 and "no prompt: pass --prompt TEXT (repeatable) or --prompts-file FILE" in r.output


@pytest.mark.parametrize(
    "kind,message",
    [
        ("dev-zero", "is not a regular file (a character device); pass a text file with one prompt per line"),
        ("link-to-dev-zero", "is not a regular file (a character device)"),
        ("fifo", "is not a regular file (a FIFO); pass a text file"),
        ("missing", "does not exist; pass a text file"),
        ("too-large", "is over 16 MiB, the most hbpe generate reads; split it into smaller files"),
    ],
)
def test_a_prompts_file_is_a_regular_file_of_bounded_size(tmp_path, kind, message):
    """`--prompts-file /dev/zero` read until `internal error: MemoryError`; a FIFO waited for a writer forever."""
    from click.testing import CliRunner

    from hbpe.cli import main
    from tests.helpers import cli_fails, make_special

    path = "/dev/zero" if kind == "dev-zero" else str(tmp_path / kind)
    if kind in ("fifo", "link-to-dev-zero"):
        make_special(tmp_path / kind, kind)
    elif kind == "too-large":
        with open(path, "wb") as f:
            f.truncate((16 << 20) + 1)  # sparse: one byte over the limit, written at once
    # the prompts are read before the checkpoint is loaded: any existing path stands in for it
    r = CliRunner().invoke(main, ["generate", "--checkpoint", str(tmp_path), "--prompts-file", path])
    cli_fails(r, 2, f"--prompts-file {path} {message}")
