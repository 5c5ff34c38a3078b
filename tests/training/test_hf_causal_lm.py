"""`hbpe export --format hf` as a transformers causal LM: generate(), pipeline, input_ids and labels, checked
against hbpe's own generation and loss; and `hbpe eval`/`generate` on a save_pretrained folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local: a network call would be a bug

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("hf_modules")  # each test loads the remote code into its own folder

PROMPTS = ["The State of the Union", "Mr. Speaker, we must", "In 1950"]


@pytest.fixture(scope="module")
def lively(tiny_run, tmp_path_factory):
    """An HF export of the tiny run with seeded noise (2 std) on its weights: its greedy text is not one repeated
    token (the trained tiny model's is " o o o ..."), and many of its patches are no first-stage token's (their
    bytes are several ids), so generate()'s every path runs."""
    from hbpe.training import load_model
    from hbpe.training.checkpoint.export_format import write_export

    model, tok, _ = load_model(str(tiny_run))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * p.std() * 2.0)
    out = tmp_path_factory.mktemp("lively") / "model"
    write_export(model, tok, str(out), source={"test": "the tiny run, with noise"}, hf=True)
    return out


@pytest.fixture
def hf(lively, hf_modules):
    """The lively export through transformers, loaded by each test into its own modules folder (hf_modules)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(lively, trust_remote_code=True).eval()
    return model, transformers.AutoTokenizer.from_pretrained(lively, trust_remote_code=True)


def _new_text(tok, out: torch.Tensor, prompt_len: int) -> list[str]:
    return [tok.decode(row[prompt_len:], skip_special_tokens=True) for row in out]


def test_greedy_generate_writes_what_hbpe_generate_writes(lively, hf):
    from hbpe.training import load_model
    from hbpe.training.inference.generate import generate

    model, tok = hf
    hbpe_model, hbpe_tok, _ = load_model(str(lively))
    several = False  # a patch whose bytes are several first-stage tokens
    for prompt in PROMPTS:
        enc = tok(prompt, return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=30, do_sample=False)
        [text] = _new_text(tok, out, enc["input_ids"].shape[1])
        want = generate(hbpe_model, hbpe_tok, prompt, max_bytes=len(text.encode()))
        assert want.text == prompt + text and len(set(text)) > 3
        several |= out.shape[1] - enc["input_ids"].shape[1] > want.patches
    assert several


def test_a_padded_batch_generates_what_each_prompt_does_alone(hf):
    model, tok = hf
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    assert (enc["attention_mask"] == 0).any()  # left padding
    batch = _new_text(tok, model.generate(**enc, max_new_tokens=20), enc["input_ids"].shape[1])
    for prompt, text in zip(PROMPTS, batch):
        one = tok(prompt, return_tensors="pt")
        assert _new_text(tok, model.generate(**one, max_new_tokens=20), one["input_ids"].shape[1]) == [text]


def test_sampling_with_a_seed_is_reproducible(hf):
    model, tok = hf
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    args = dict(max_new_tokens=20, do_sample=True, temperature=0.9, top_k=40, top_p=0.95)
    runs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        runs.append(model.generate(**enc, **args))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    greedy = model.generate(**enc, max_new_tokens=20)
    assert not torch.equal(runs[0], greedy)


def test_the_hf_sampler_draws_from_the_distribution_hbpe_samples_from(hf):
    """A GenerationConfig becomes hbpe's own Sampling (the export's copy of sampling.py), which draws temperature,
    then top_k, then top_p on the tempered probabilities: its frequencies over many draws from torch's global
    generator (the HF path) and from a seeded one (hbpe generate's) against the rule's, not one seeded draw."""
    package = type(hf[0]).__module__.rsplit(".", 1)[0]
    sampling_of = sys.modules[f"{package}.generation_hbpe"].sampling_of
    Sampling = sys.modules[f"{package}.hbpe_sampling"].Sampling

    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0])
    temperature, top_k, top_p = 2.0, 6, 0.8
    # by hand: at T=2 the top 6 have probabilities .414 .251 .152 .092 .056 .034, and the nucleus of 0.8 keeps the
    # first 3 (.817); at T=1 it keeps 2: a sampler that divides by T after the cuts never draws symbol 2
    want = torch.cat([torch.softmax(logits[:3] / temperature, 0), torch.zeros(5)])  # .507 .307 .186
    n = 8000
    config = transformers.GenerationConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
    hbpe = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    assert sampling_of(config) == hbpe
    assert sampling_of(transformers.GenerationConfig(do_sample=True, top_k=0, top_p=1.0)) == Sampling(temperature=1.0)
    torch.manual_seed(0)
    hf_draws = torch.tensor([hbpe.choose(logits, None) for _ in range(n)])
    gen = torch.Generator().manual_seed(0)
    hbpe_draws = torch.tensor([hbpe.choose(logits, gen) for _ in range(n)])
    for draws in (hf_draws, hbpe_draws):
        freq = torch.bincount(draws, minlength=len(logits)).float() / n
        torch.testing.assert_close(freq, want, rtol=0, atol=0.03)  # over 5 standard deviations of a frequency


def test_the_generate_cache_holds_each_rows_states_as_the_row_alone(hf, sample_texts):
    """generate()'s latent cache (PatchCache) over a left-padded batch of a 3-token and a 40-token prompt, the rows
    advancing by different numbers of patches a step (as a patch of several tokens does), some not at all: each
    row's latent state after each step is the forward pass's over that row alone (no cache, no padding)."""
    model, tok = hf
    short, long = tok(PROMPTS[2])["input_ids"], tok(sample_texts[0])["input_ids"][:60]
    rows, done = [short + long[:12], long], [len(short), 40]  # each row's tokens; the prompt's length
    enc = tok.pad({"input_ids": [row[:n] for row, n in zip(rows, done)]}, return_tensors="pt")
    assert (enc["attention_mask"][0] == 0).sum() == 40 - len(short)  # left padding: filler slots in the cache
    with torch.inference_mode():
        # under the name this transformers' generate() uses (`cache` from 5.24 on, modeling_hbpe.CACHE_NAME)
        cache_name = sys.modules[type(model).__module__].CACHE_NAME
        cache = model.prepare_inputs_for_generation(enc["input_ids"])[cache_name]
        cache.step(enc["input_ids"], enc["attention_mask"])  # generate()'s first step: the marker, each prompt
        for step in ({0: 3, 1: 1}, {1: 1}, {0: 1, 1: 2}, {0: 2, 1: 1}):
            new = {b: [list(tok.token_patch(i)) for i in rows[b][done[b] : done[b] + k]] for b, k in step.items()}
            states = cache._advance(new)  # (n, D): after each listed row's last new patch
            for (b, k), got in zip(step.items(), states):
                done[b] += k
                alone = model(input_ids=torch.tensor([rows[b][: done[b] + 1]])).hidden_states[0, -1]
                # hbpe's KV-cached h leaves f_theta's final norm gain to the matmul that reads it (kv_decode.py)
                torch.testing.assert_close(got * cache.m.latent.out_gain, alone, rtol=1e-5, atol=1e-5)


def test_each_row_of_a_left_padded_batch_scores_as_it_does_alone(hf, sample_texts):
    model, tok = hf
    texts = [PROMPTS[2], sample_texts[1][:300]]  # 3 and about 60 tokens: the short row is mostly padding
    enc = tok(texts, return_tensors="pt", padding=True)
    assert (enc["attention_mask"][0] == 0).sum() > 40
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    with torch.inference_mode():
        batch = model(**enc)
        for b, text in enumerate(texts):
            one = tok(text, return_tensors="pt")
            alone = model(**one, labels=one["input_ids"])
            n = one["input_ids"].shape[1]
            torch.testing.assert_close(batch.logits[b, -n:], alone.logits[0], rtol=1e-5, atol=1e-5)
            only_b = labels.masked_fill((torch.arange(len(texts)) != b)[:, None], -100)  # this row's loss alone
            assert float(model(**enc, labels=only_b).nll_sum) == pytest.approx(float(alone.nll_sum), rel=1e-5)


def test_an_all_zero_attention_mask_row_is_the_empty_prompt_hbpe_generate_continues(lively, hf):
    from hbpe.training import load_model
    from hbpe.training.inference.generate import generate

    model, tok = hf
    enc = tok(["", PROMPTS[0]], return_tensors="pt", padding=True)
    assert not enc["attention_mask"][0].any()  # the tokenizer pads "" to a row of zeros
    [text, _] = _new_text(tok, model.generate(**enc, max_new_tokens=12), enc["input_ids"].shape[1])
    alone = model.generate(
        input_ids=torch.tensor([[tok.eos_token_id]]), attention_mask=torch.tensor([[0]]), max_new_tokens=12
    )
    assert _new_text(tok, alone, 1) == [text]
    hbpe_model, hbpe_tok, _ = load_model(str(lively))
    assert generate(hbpe_model, hbpe_tok, "", max_bytes=len(text.encode())).text == text and len(set(text)) > 3
    # the empty row's latent model reads the document marker alone, not its padding as more markers (whose states
    # barely differ from one marker's: the texts above cannot tell)
    cache = model.prepare_inputs_for_generation(enc["input_ids"])[sys.modules[type(model).__module__].CACHE_NAME]
    with torch.inference_mode():
        cache.step(enc["input_ids"], enc["attention_mask"])
    assert cache.m.positions == [1, 1 + int(enc["attention_mask"][1].sum())]


def test_generate_stops_at_eos_token_id_and_refuses_what_it_cannot_honour(hf):
    model, tok = hf
    enc = tok(PROMPTS[0], return_tensors="pt")
    n = enc["input_ids"].shape[1]
    full = model.generate(**enc, max_new_tokens=12)
    stop = int(full[0, n + 3])
    first = int((full[0, n:] == stop).nonzero()[0])
    short = model.generate(**enc, max_new_tokens=12, eos_token_id=stop)
    assert torch.equal(short[0], full[0, : n + first + 1])
    with pytest.raises(ValueError, match=r"num_beams=2, repetition_penalty=1.3 not supported: the local decoder"):
        model.generate(**enc, max_new_tokens=4, num_beams=2, repetition_penalty=1.3)


def test_pipeline_text_generation_returns_the_greedy_text(lively, hf):
    model, tok = hf
    pipe = transformers.pipeline("text-generation", model=str(lively), trust_remote_code=True)
    [out] = pipe(PROMPTS[1], max_new_tokens=15, do_sample=False)
    enc = tok(PROMPTS[1], return_tensors="pt")
    [text] = _new_text(tok, model.generate(**enc, max_new_tokens=15), enc["input_ids"].shape[1])
    assert out["generated_text"] == PROMPTS[1] + text and text


def test_loss_from_input_ids_and_labels_equals_hbpe_loss(lively, hf, sample_texts):
    import torch.nn.functional as F

    from hbpe.training import load_model

    model, tok = hf
    hbpe_model, hbpe_tok, _ = load_model(str(lively))
    texts = [t[:300] for t in sample_texts[:3]]
    enc = tok(texts, return_tensors="pt", padding=True)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    with torch.inference_mode():
        batch = model(**enc, labels=labels)
        nll = 0.0
        for text in texts:
            one = tok(text, return_tensors="pt")
            got = model(**one, labels=one["input_ids"])
            # hbpe: the document marker, then the text's patches, every token scored
            patches = torch.as_tensor(hbpe_tok.patches(hbpe_tok.encode(text)).astype("int64"))
            doc = torch.full((1, patches.shape[1]), 257, dtype=torch.long)
            doc[0, 0] = 258
            logits, targets = hbpe_model({"patches": torch.cat([doc, patches])[None]})
            want = F.cross_entropy(logits.float(), targets, ignore_index=-100)
            assert float(got.loss) == pytest.approx(float(want), abs=1e-5)
            nll += float(got.nll_sum)
    assert float(batch.nll_sum) == pytest.approx(nll, rel=1e-5)  # padding changes no token's loss


def test_the_export_generates_where_hbpe_is_not_installed(lively, hf, tmp_path):
    model, tok = hf
    script = f"""
import json, sys
sys.modules["hbpe"] = None  # any import of hbpe fails
import torch, transformers
d = {str(lively)!r}
tok = transformers.AutoTokenizer.from_pretrained(d, trust_remote_code=True)
model = transformers.AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True).eval()
enc = tok({PROMPTS[0]!r}, return_tensors="pt")
out = model.generate(**enc, max_new_tokens=10)
print(json.dumps({{"ids": out[0].tolist(), "loss": float(model(**enc, labels=enc["input_ids"]).loss)}}))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    enc = tok(PROMPTS[0], return_tensors="pt")
    with torch.inference_mode():
        assert got["ids"] == model.generate(**enc, max_new_tokens=10)[0].tolist()
        assert got["loss"] == pytest.approx(float(model(**enc, labels=enc["input_ids"]).loss), abs=1e-6)


def test_hbpe_eval_and_generate_read_a_save_pretrained_folder(lively, hf, sample_shards, tmp_path):
    from hbpe.training import evaluate, load_model
    from hbpe.training.inference.generate import generate
    from tests.helpers import hbpe_cli

    model, tok = hf
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    tok.save_pretrained(saved)
    assert not (saved / "hbpe_model.json").exists()
    (m1, t1, _), (m2, t2, _) = load_model(str(lively)), load_model(str(saved))
    assert t1.fingerprint == t2.fingerprint and m1.cfg == m2.cfg
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert m2.io.encoder.embed.weight is m2.io.decoder.embed.weight  # tied again
    data = str(sample_shards[1])
    assert evaluate(str(saved), data, max_batches=2)["bpb"] == evaluate(str(lively), data, max_batches=2)["bpb"]
    out = hbpe_cli("generate", "--checkpoint", str(saved), "--prompt", PROMPTS[0], "--max-bytes", "30")
    assert out.strip() == generate(m1, t1, PROMPTS[0], max_bytes=30).text


def test_a_folder_that_is_no_model_names_what_was_looked_for(tmp_path):
    from click.testing import CliRunner

    from hbpe.cli import main
    from tests.helpers import cli_fails

    (tmp_path / "notes.txt").write_text("not a model")
    r = CliRunner().invoke(main, ["generate", "--checkpoint", str(tmp_path), "--prompt", "x"])
    cli_fails(r, 2, "is not a model folder hbpe reads: it is none of an `hbpe export` directory (hbpe_model.json), a")
    assert "transformers save_pretrained folder (config.json and model.safetensors)" in r.output


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (b"[1, 2]", "does not describe an hbpe model"),  # before: AttributeError, an internal error
        (b"{" * 100_000, "is not readable JSON"),
        (b" " * (17 << 20), "is over 16 MiB"),
    ],
)
def test_a_save_pretrained_config_that_is_not_an_hbpe_description_is_one_error(tmp_path, config, message):
    from click.testing import CliRunner

    from hbpe.cli import main
    from tests.helpers import cli_fails

    (tmp_path / "config.json").write_bytes(config)
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    r = CliRunner().invoke(main, ["generate", "--checkpoint", str(tmp_path), "--prompt", "x"])
    cli_fails(r, 2, message)


def test_rows_padded_on_either_side_or_empty_score_as_each_row_alone(hf, sample_texts):
    """An empty prompt and texts of three lengths, in an order the model's row grouping (by length) reorders, padded
    left and then right, with labels = input_ids padding included: each row's logits at its tokens are the row's
    alone, every position holds the latent state after the marker and the row's real tokens before it (a padded
    one too: the marker's for the empty row), and only real tokens are scored."""
    model, tok = hf
    texts = [sample_texts[1][:100], "", sample_texts[0][:300], PROMPTS[2]]
    eos = torch.tensor([tok.eos_token_id])
    with torch.inference_mode():
        for side in ("left", "right"):
            tok.padding_side = side
            enc = tok(texts, return_tensors="pt", padding=True)
            batch = model(**enc, labels=enc["input_ids"])  # padding is never scored, whatever its label
            nll = 0.0
            for b in range(len(texts)):
                real = enc["attention_mask"][b].bool()
                ids = enc["input_ids"][b][real][None]  # (1, n)
                after = model(input_ids=torch.cat([ids[0], eos])[None]).hidden_states[0]  # (n + 1, D): after 0..n
                before = real.long().cumsum(0) - real.long()  # real tokens before each position
                torch.testing.assert_close(batch.hidden_states[b], after[before], rtol=1e-5, atol=1e-5)
                if ids.shape[1]:
                    alone = model(input_ids=ids, labels=ids)
                    torch.testing.assert_close(batch.logits[b][real], alone.logits[0], rtol=1e-5, atol=1e-5)
                    nll += float(alone.nll_sum)
            assert float(batch.nll_sum) == pytest.approx(nll, rel=1e-5)


def _greedy_patch(hbpe_model, hbpe_tok, context: list[list[int]]) -> list[int]:
    """The symbols of the patch hbpe's greedy decoding emits after the latent model reads `context` (patches, the
    document marker first), through hbpe's own KV-cached modules."""
    from hbpe.training.inference.kv_decode import CachedPatchLM
    from hbpe.training.inference.patch_decode import decode_patches
    from hbpe.training.inference.sampling import Sampling

    m = CachedPatchLM(hbpe_model)
    h = m.prefill([context])  # (1, D)
    ends, S = hbpe_tok.symbol_ends_patch, hbpe_tok.max_patch_size
    [symbols] = decode_patches(m, h, ends=ends, max_patch_size=S, sampling=Sampling(), gens=[None])
    return symbols


def _prompt_context(hbpe_model, hbpe_tok, prompt: str) -> list[list[int]]:
    """The document marker and the prompt's patches, as `hbpe generate` starts."""
    from hbpe.schemas.symbols import EOD
    from hbpe.training.schemes.registry import scheme_spec

    return [[EOD], *scheme_spec(hbpe_model.cfg).prompt_patches(hbpe_tok, prompt)]


def test_a_patch_that_ends_the_document_gives_its_bytes_then_eos_as_hbpe_generate_ends(lively, hf):
    """The lively model never ends a document, so EOD's row of m_psi's head is set to 1.05 times that of the symbol
    greedy decoding picks 4th in the first patch after PROMPTS[0] (in hbpe's model and the HF one alike): EOD comes
    mid-patch. Each row of a batch writes what `hbpe generate` writes: the bytes before EOD as tokens, then eos
    (`stopped` "eod") and only padding after, each row ending at its own step."""
    from hbpe.schemas.symbols import EOD
    from hbpe.training import load_model
    from hbpe.training.inference.generate import generate

    model, tok = hf
    hbpe_model, hbpe_tok, _ = load_model(str(lively))
    s = _greedy_patch(hbpe_model, hbpe_tok, _prompt_context(hbpe_model, hbpe_tok, PROMPTS[0]))[3]
    with torch.no_grad():
        for m in (hbpe_model, model):
            m.io.decoder.head.weight[EOD] = m.io.decoder.head.weight[s] * 1.05
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    T = enc["input_ids"].shape[1]
    res = model.generate(**enc, max_new_tokens=16, return_dict_in_generate=True)
    out, ended = res.sequences, []
    for prompt, row in zip(PROMPTS, out[:, T:].tolist()):
        n = row.index(tok.eos_token_id) if tok.eos_token_id in row else len(row)
        text = tok.decode(row[:n])
        want = generate(hbpe_model, hbpe_tok, prompt, max_bytes=200 if n < len(row) else len(text.encode()))
        assert want.text == prompt + text and (want.stopped == "eod") == (n < len(row))
        assert set(row[n:]) <= {tok.eos_token_id}
        ended.append(n < len(row))
    assert ended[0] and len(out[0, T:].tolist()) > 1 and out[0, T] != tok.eos_token_id  # bytes before EOD
    assert [row.done for row in res.past_key_values.rows] == ended  # the cache takes no further patch for them


def test_generate_ends_where_the_latent_context_is_full_as_hbpe_generate_does(lively, hf_modules, sample_texts):
    """With model.max_patches 6 beyond the prompt, greedy text stops (eos) where `hbpe generate` stops for a full
    context (`stopped` "context"), a patch of several tokens included; a prompt the context cannot hold is refused."""
    import dataclasses

    from hbpe.training import load_model
    from hbpe.training.inference.generate import generate

    tok = transformers.AutoTokenizer.from_pretrained(lively, trust_remote_code=True)
    enc = tok(PROMPTS[0], return_tensors="pt")
    n = enc["input_ids"].shape[1]
    limit = n + 1 + 6  # the marker, the prompt, 6 patches
    model = transformers.AutoModelForCausalLM.from_pretrained(lively, trust_remote_code=True, max_patches=limit)
    hbpe_model, hbpe_tok, _ = load_model(str(lively))
    hbpe_model.cfg = dataclasses.replace(hbpe_model.cfg, max_patches=limit)
    row = model.eval().generate(**enc, max_new_tokens=60)[0, n:].tolist()
    assert row[-1] == tok.eos_token_id and len(row) < 60
    want = generate(hbpe_model, hbpe_tok, PROMPTS[0], max_bytes=10_000)
    assert want.stopped == "context" and want.text == PROMPTS[0] + tok.decode(row[:-1])
    assert len(row) - 1 > want.patches  # several tokens in a patch
    ids = torch.tensor([tok(sample_texts[0])["input_ids"][:limit]])
    with pytest.raises(ValueError, match=rf"^prompt 0 is {limit} tokens and the model's context holds {limit} patches"):
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2)


class _Force(transformers.LogitsProcessor):
    """Each row's token at length `at` is `token`, whatever the model chose (a caller's logits processor)."""

    def __init__(self, at: int, token: int) -> None:
        self.at, self.token = at, token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] != self.at:
            return scores
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self.token] = 0.0
        return forced


def test_a_token_the_model_did_not_emit_is_read_as_its_own_patch_after_those_fed_back(lively, hf):
    """PROMPTS[0]'s first two generated patches are several tokens each. A token forced in place of one of them
    (the first, the third, the seventh) is read by the latent model as its own patch, after the tokens of the same
    patch already fed back (each its own patch too) and the patches hbpe read before: the next patch is the one
    hbpe's modules decode after that context, and from a prompt ending in those tokens generation goes on alike."""
    from hbpe.training import load_model
    from hbpe.training.inference.patch_decode import next_patches

    model, tok = hf
    hbpe_model, hbpe_tok, _ = load_model(str(lively))
    enc = tok(PROMPTS[0], return_tensors="pt")
    prompt, n = enc["input_ids"][0].tolist(), enc["input_ids"].shape[1]
    free = model.generate(**enc, max_new_tokens=8)[0, n:].tolist()
    context = _prompt_context(hbpe_model, hbpe_tok, PROMPTS[0])
    first = _greedy_patch(hbpe_model, hbpe_tok, context)
    data = hbpe_tok.decode_symbols_bytes(first)
    assert tok.decode(free[:5]).encode() == data  # the first patch is 5 tokens, the second starts at the 6th
    x = tok(" the")["input_ids"][0]
    second = context + next_patches(first, data, hbpe_tok)  # what the latent model reads once the 5 tokens are out
    # k: the forced token's place; read: the patches hbpe read before; start: the first token of the current patch
    for k, read, start in ((0, context, 0), (2, context, 0), (6, second, 5)):
        force = transformers.LogitsProcessorList([_Force(n + k, x)])
        res = model.generate(**enc, max_new_tokens=k + 8, logits_processor=force, return_dict_in_generate=True)
        out = res.sequences[0]
        assert out[: n + k + 1].tolist() == prompt + free[:k] + [x] != prompt + free[: k + 1]
        fed = [list(tok.token_patch(i)) for i in [*free[start:k], x]]
        after = hbpe_tok.decode_symbols_bytes(_greedy_patch(hbpe_model, hbpe_tok, read + fed))
        assert tok.decode(out[n + k + 1 :]).encode().startswith(after) and after
        if k < 5:  # the lively model's text barely depends on what the latent model read: its positions do
            again = model.generate(input_ids=out[None, : n + k + 1], max_new_tokens=7, return_dict_in_generate=True)
            assert torch.equal(out, again.sequences[0])
            assert res.past_key_values.m.positions == again.past_key_values.m.positions


def test_patches_of_s_symbols_without_eop_are_re_encoded_as_hbpe_generate_does(lively, hf):
    """With the head rows of every symbol that ends a patch (and EOD's) zeroed, in hbpe's model and the HF one alike,
    greedy decoding never closes a patch before S symbols: each patch is re-encoded by the tokenizer's
    out-of-vocabulary rule (several latent positions, a different number per row) and the batch writes what
    `hbpe generate` writes for each prompt."""
    from hbpe.schemas.symbols import EOD
    from hbpe.training import load_model
    from hbpe.training.inference.generate import generate

    model, tok = hf
    hbpe_model, hbpe_tok, _ = load_model(str(lively))
    closing = [s for s, ends in enumerate(hbpe_tok.symbol_ends_patch) if ends] + [EOD]
    with torch.no_grad():
        for m in (hbpe_model, model):
            m.io.decoder.head.weight[closing] = 0.0  # logit 0: below the largest of the others
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    T = enc["input_ids"].shape[1]
    for prompt, text in zip(PROMPTS, _new_text(tok, model.generate(**enc, max_new_tokens=24), T)):
        want = generate(hbpe_model, hbpe_tok, prompt, max_bytes=len(text.encode()))
        assert want.text == prompt + text and len(set(text)) > 3
        assert want.symbols % hbpe_tok.max_patch_size == 0  # every patch S symbols
