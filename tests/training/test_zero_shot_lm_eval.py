"""The lm-eval adapter: lm-eval's own task YAMLs build the same requests as `hbpe eval-tasks`, and its
evaluator, run on the "hbpe" model over local copies of the data, reports the same accuracies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval", reason="the eval extra: pip install -e '.[eval]'")

from hbpe.schemas.errors import ConfigError  # noqa: E402
from hbpe.training.inference.zero_shot.olmo_files import read_arrow, read_oe_requests  # noqa: E402
from hbpe.training.inference.zero_shot.tasks import TASKS  # noqa: E402
from tests.conftest import REPO  # noqa: E402

LM_EVAL_TASKS = Path(lm_eval.__file__).parent / "tasks"
N = 4  # documents per task

# hbpe task -> (lm-eval's own YAML, the rows it reads, the split lm-eval scores)
SOURCES = {
    "hellaswag": ("hellaswag/hellaswag.yaml", lambda: read_arrow("hellaswag/none/validation"), "validation"),
    "piqa": ("piqa/piqa.yaml", lambda: read_arrow("piqa/plain_text/validation"), "validation"),
    "winogrande": ("winogrande/default.yaml", lambda: read_arrow("winogrande/winogrande_xl/validation"), "validation"),
    "arc_easy": ("arc/arc_easy.yaml", lambda: read_arrow("ai2_arc/ARC-Easy/validation"), "test"),
    "arc_challenge": ("arc/arc_challenge.yaml", lambda: read_arrow("ai2_arc/ARC-Challenge/validation"), "test"),
    "lambada": (
        "lambada/lambada_openai.yaml",
        lambda: [
            {"text": r["request"]["context"] + r["request"]["continuation"]}
            for r in read_oe_requests("lambada/bpb_0shot")
        ],
        "test",
    ),
    "mmlu": (
        "mmlu/default/mmlu_abstract_algebra.yaml",
        lambda: read_arrow("hails/mmlu_no_train/abstract_algebra/test"),
        "test",
    ),
}


@pytest.fixture(scope="module")
def local_tasks(tmp_path_factory) -> Path:
    """`<task>_local` YAMLs that include lm-eval's own task YAML and read the first N rows from a local jsonl."""
    d = tmp_path_factory.mktemp("lm-eval-tasks")
    for name, (yaml, rows, split) in SOURCES.items():
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows()[:N]))
        other = "validation" if split == "test" else "test"
        (d / f"{name}_local.yaml").write_text(
            f"include: {LM_EVAL_TASKS / yaml}\ntask: {name}_local\ndataset_path: json\ndataset_name: null\n"
            f"training_split: null\nfewshot_split: null\n{other}_split: null\n"
            f"dataset_kwargs:\n  data_files:\n    {split}: {d / name}.jsonl\n  cache_dir: {d / 'hf-cache'}\n"
        )
    return d


def _evaluate(local_tasks: Path, model: str, model_args: str | None, tasks: list[str], **kw) -> dict:
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(local_tasks), include_defaults=False)
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks, task_manager=tm, **kw)


def test_simple_evaluate_on_hbpe_builds_our_requests_and_scores(local_tasks, tiny_run, monkeypatch):
    """lm-eval's real task definitions give our contexts, continuations and golds, and its evaluator
    on the "hbpe" model reports the accuracies (and standard errors, perplexity) of `hbpe eval-tasks`."""
    import hbpe.training.inference.zero_shot.lm_eval_adapter  # noqa: F401  (registers "hbpe")
    from hbpe.training.checkpoint.load import load_model
    from hbpe.training.inference.zero_shot.run import evaluate_model

    monkeypatch.setenv("DISABLE_MULTIPROC", "1")  # lm-eval bootstraps perplexity's stderr in a process pool otherwise
    res = _evaluate(
        local_tasks,
        "hbpe",
        f"checkpoint={tiny_run},progress=False",
        [f"{t}_local" for t in SOURCES],
        log_samples=True,
        bootstrap_iters=10,
    )
    for name in SOURCES:
        samples = sorted(res["samples"][f"{name}_local"], key=lambda s: s["doc_id"])
        ours = TASKS[name].load(N)[:N]  # MMLU: abstract_algebra is the first subject
        assert [[tuple(a) for a in s["arguments"]] for s in samples] == [list(d.requests) for d in ours], name
        if name not in ("winogrande", "lambada"):  # their targets are the continuation text, not an index
            assert [s["target"] for s in samples] == [d.gold for d in ours], name

    model, tok, _ = load_model(str(tiny_run))
    names = [t for t in SOURCES if t != "mmlu"]  # ours scores MMLU's 57 subjects, the local task one
    ours = evaluate_model(model, tok, names, limit=N, progress=False)
    for name in names:
        theirs = res["results"][f"{name}_local"]
        for key in [m for m in TASKS[name].metrics if m != "perplexity"]:  # lm-eval's metric_list per task
            assert theirs[f"{key},none"] == ours[name][key], (name, key)
            assert theirs[f"{key}_stderr,none"] == pytest.approx(ours[name][f"{key}_stderr"], rel=1e-12), (name, key)
    assert res["results"]["lambada_local"]["perplexity,none"] == pytest.approx(ours["lambada"]["perplexity"], rel=1e-5)


def test_rolling_and_generation(tiny_run):
    from lm_eval.api.instance import Instance

    from hbpe.training.inference.generate import generate
    from hbpe.training.inference.zero_shot.lm_eval_adapter import HbpeLM

    lm = HbpeLM(checkpoint=str(tiny_run), batch_size="auto", device="cpu", progress=False)
    text = "Fellow citizens of the Senate and House of Representatives"
    rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])[0]
    assert rolling == pytest.approx(lm.loglikelihood([Instance("loglikelihood", {}, ("", text), 0)])[0][0], abs=1e-6)
    assert rolling < -10
    req = Instance("generate_until", {}, ("The State of the Union", {"until": ["\n\n"], "max_gen_toks": 6}), 0)
    out = lm.generate_until([req])[0]
    g = generate(lm.model, lm.tok, "The State of the Union", max_bytes=6 * 64, max_patches=6)
    assert out == g.text[len("The State of the Union") :].split("\n\n")[0] and len(out) > 0
    with pytest.raises(ConfigError, match=r"model_args \['pretrained'\] are not hbpe's; it takes checkpoint=PATH"):
        HbpeLM(checkpoint=str(tiny_run), pretrained="gpt2")


def test_lm_eval_command_line(local_tasks, tiny_run, monkeypatch, capsys, caplog):
    """lm_eval_cli.main() is lm-eval's CLI with "hbpe" registered; `--device cpu` is taken as given.
    (In-process: the `python -m` entry point runs as a process in the default-device test below.)"""
    from hbpe.training.inference.zero_shot.lm_eval_cli import main

    argv = ["lm_eval_cli", "run", "--model", "hbpe", "--model_args", f"checkpoint={tiny_run},progress=False"]
    argv += ["--tasks", "piqa_local", "--include_path", str(local_tasks), "--device", "cpu", "--batch_size", "4"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("DISABLE_MULTIPROC", "1")
    main()
    out = capsys.readouterr().out
    assert "piqa_local" in out and "acc_norm" in out
    assert "no CUDA GPU is visible" not in caplog.text  # an explicit device is used as asked, not fallen back from


@pytest.mark.parametrize("io", ["bpe", "bytes", "space"])
def test_lm_eval_equals_eval_tasks_for_every_scheme(io, local_tasks, gpt2_tokenizer, tmp_path, monkeypatch):
    """The baselines answer lm-eval's queries through the adapter exactly as through `hbpe eval-tasks`
    (a 2-layer model with scaled weights, exported, so log-probs are far from uniform)."""
    import hbpe.training.inference.zero_shot.lm_eval_adapter  # noqa: F401  (registers "hbpe")
    from hbpe.training.checkpoint.export_format import write_export
    from hbpe.training.checkpoint.load import load_model
    from hbpe.training.inference.zero_shot.run import evaluate_model
    from tests.helpers import scaled_model as _scaled_model

    model = _scaled_model(io, gpt2_tokenizer, seed=5)
    out = tmp_path / io
    write_export(model, gpt2_tokenizer, str(out), source={"test": io})
    monkeypatch.setenv("DISABLE_MULTIPROC", "1")
    names = ["piqa", "arc_easy", "hellaswag"]
    res = _evaluate(local_tasks, "hbpe", f"checkpoint={out},progress=False", [f"{t}_local" for t in names])
    loaded, tok, _ = load_model(str(out))
    ours = evaluate_model(loaded, tok, names, limit=N, progress=False)
    for name in names:
        for key in ("acc", "acc_norm"):
            assert res["results"][f"{name}_local"][f"{key},none"] == ours[name][key], (io, name, key)


def test_lm_eval_command_line_default_device_falls_back_to_cpu(local_tasks, tiny_run):
    """`python -m hbpe.training.inference.zero_shot.lm_eval_cli` runs as a process. lm-eval hands the model
    device="cuda:0" when --device is not given; without a GPU the adapter runs on the CPU and says so once
    on stderr (it raised "no CUDA GPU is visible" before); with one, cuda:0 is used as asked."""
    import torch

    cmd = [sys.executable, "-m", "hbpe.training.inference.zero_shot.lm_eval_cli", "run", "--model", "hbpe"]
    cmd += ["--model_args", f"checkpoint={tiny_run},progress=False", "--tasks", "piqa_local"]
    cmd += ["--include_path", str(local_tasks), "--batch_size", "4", "--limit", "2"]
    env = {**os.environ, "DISABLE_MULTIPROC": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "piqa_local" in r.stdout and "acc_norm" in r.stdout
    fallbacks = 0 if torch.cuda.is_available() else 1
    assert r.stderr.count("no CUDA GPU is visible: running on the CPU") == fallbacks, r.stderr[-3000:]
