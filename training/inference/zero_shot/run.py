"""`hbpe eval-tasks`: a checkpoint's zero-shot accuracies on the paper's tasks, as JSON and as its Table 3."""

from __future__ import annotations

import time
from typing import Any

from hbpe.schemas.errors import ConfigError
from hbpe.training.checkpoint.load import load_model
from hbpe.training.inference.zero_shot.metrics import aggregate, doc_metrics
from hbpe.training.inference.zero_shot.pairs import scheme_for
from hbpe.training.inference.zero_shot.scorer import score_pairs
from hbpe.training.inference.zero_shot.tasks import TASKS
from hbpe.training.model.devices import resolve_device


def check_args(tasks: list[str], *, limit: int | None, batch_size: int) -> None:
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ConfigError(f"tasks {unknown or tasks!r}: choose from {', '.join(TASKS)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit={limit!r}: must be an integer >= 1 (documents per task); e.g. --limit 100")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r}: must be an integer >= 1; e.g. --batch-size 16")


def evaluate_model(
    model, tok, tasks: list[str], *, limit: int | None = None, batch_size: int = 16, progress: bool = True
) -> dict[str, dict[str, Any]]:
    """{task: {docs, acc, acc_stderr, [acc_norm, acc_norm_stderr, acc_bytes, ...], [perplexity, ...], seconds}}."""
    check_args(tasks, limit=limit, batch_size=batch_size)
    scheme = scheme_for(model, tok)
    out = {}
    for name in tasks:
        spec, t0 = TASKS[name], time.perf_counter()
        docs = spec.load(limit)
        pairs = [r for d in docs for r in d.requests]
        scores = score_pairs(model, scheme, pairs, batch_size=batch_size, progress=name if progress else None)
        per_doc, i = [], 0
        for d in docs:
            per_doc.append(doc_metrics(spec, d, scores[i : i + len(d.requests)]))
            i += len(d.requests)
        out[name] = {
            **aggregate(per_doc),
            "requests": len(pairs),
            "split": spec.split,
            "seconds": round(time.perf_counter() - t0, 3),
        }
    return out


def evaluate_tasks(
    checkpoint: str,
    tasks: list[str],
    *,
    limit: int | None = None,
    batch_size: int = 16,
    device: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint (training/checkpoint/load.py) and score it on `tasks`; the result `render_table` prints."""

    check_args(tasks, limit=limit, batch_size=batch_size)  # before loading a model
    dev = str(resolve_device(device))  # checked before any model is loaded; a string for the JSON result
    model, tok, meta = load_model(checkpoint, device=dev)
    results = evaluate_model(model, tok, tasks, limit=limit, batch_size=batch_size, progress=progress)
    return {"checkpoint": checkpoint, "io": meta["model"]["io"], "device": dev, "limit": limit, "tasks": results}


def _cell(r: dict[str, Any], key: str) -> str:
    if r.get(key) is None:
        return "–"
    se = r.get(f"{key}_stderr")
    return f"{100 * r[key]:.1f} ± {100 * se:.1f}" if se is not None else f"{100 * r[key]:.1f}"


def render_table(result: dict[str, Any]) -> str:
    """The paper's Table 3 form (a column per task, accuracies in %, ± the standard error), then the details."""
    tasks = {t: result["tasks"][t] for t in TASKS if t in result["tasks"]}  # the paper's column order
    head = "| model | metric | " + " | ".join(TASKS[t].title for t in tasks) + " | avg acc |"
    rule = "|---|---|" + "---|" * len(tasks) + "---|"
    avg = sum(r["acc"] for r in tasks.values()) / len(tasks)
    label = f"{result['io']} ({result['checkpoint']})"
    lines = [
        head,
        rule,
        f"| {label} | acc | " + " | ".join(_cell(r, "acc") for r in tasks.values()) + f" | {100 * avg:.1f} |",
        f"| {label} | acc_norm | " + " | ".join(_cell(r, "acc_norm") for r in tasks.values()) + " | |",
        "",
        "| task | split | docs | acc | acc_norm | perplexity | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in tasks.items():
        ppl = "–" if r.get("perplexity") is None else f"{r['perplexity']:.4g}"
        if r.get("perplexity_stderr") is not None:
            ppl += f" ± {r['perplexity_stderr']:.2g}"
        lines.append(
            f"| {name} | {r['split']} | {r['docs']} | {_cell(r, 'acc')} | {_cell(r, 'acc_norm')} | {ppl} | {r['seconds']:.1f} |"
        )
    limit = f"; --limit {result['limit']} documents per task (MMLU: per subject)" if result["limit"] else ""
    lines.append(f"\nzero-shot, lm-eval prompt formats, on {result['device']}{limit}")
    return "\n".join(lines)
