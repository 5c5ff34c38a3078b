"""Per-document metrics and their aggregates, as lm-eval 0.4 computes them (api/task.py, api/metrics.py).

- acc: the choice with the highest log-likelihood is the gold one (np.argmax: ties go to the first).
- acc_norm: the same after dividing each log-likelihood by the length of its choice string in
  characters (lm-eval's `completion_len = len(choice)`, without the target delimiter).
- acc_bytes: divided by the choice's UTF-8 bytes instead (lm-eval's optional `acc_bytes`); it
  equals acc_norm on ASCII choices.
- LAMBADA: acc = the last word is the greedy continuation; perplexity = exp(-mean log-likelihood).
- stderr: lm-eval's `mean_stderr`, the sample standard deviation (n - 1) over sqrt(n). For
  perplexity lm-eval bootstraps; here the delta method, perplexity * stderr(mean log-likelihood),
  which needs no random draws.
"""

from __future__ import annotations

import math

import numpy as np

from hbpe.training.inference.zero_shot.scorer import Score
from hbpe.training.inference.zero_shot.tasks import Doc, TaskSpec


def mean_stderr(values: list[float]) -> float | None:
    """lm-eval's `mean_stderr`: sqrt(sum (x - mean)^2 / (n - 1)) / sqrt(n); None below two values."""
    n = len(values)
    if n < 2:
        return None
    mu = sum(values) / n
    return math.sqrt(sum((x - mu) ** 2 for x in values) / (n - 1)) / math.sqrt(n)


def doc_metrics(task: TaskSpec, doc: Doc, scores: list[Score]) -> dict[str, float]:
    """One document's values: acc (and acc_norm, acc_bytes) for multiple choice; acc and the log-likelihood for LAMBADA."""
    if task.output == "loglikelihood":
        return {"acc": float(scores[0].is_greedy), "loglikelihood": scores[0].loglikelihood}
    lls = np.array([s.loglikelihood for s in scores])
    out = {"acc": float(np.argmax(lls) == doc.gold)}
    if "acc_norm" in task.metrics:
        chars = np.array([float(len(c)) for c in doc.choices])
        nbytes = np.array([float(len(c.encode("utf-8"))) for c in doc.choices])
        out["acc_norm"] = float(np.argmax(lls / chars) == doc.gold)
        out["acc_bytes"] = float(np.argmax(lls / nbytes) == doc.gold)
    return out


def aggregate(per_doc: list[dict[str, float]]) -> dict[str, float | int | None]:
    """Means and standard errors over the documents; perplexity from the mean log-likelihood."""
    out: dict[str, float | int | None] = {"docs": len(per_doc)}
    if not per_doc:
        return out
    for key in per_doc[0]:
        values = [d[key] for d in per_doc]
        mean = sum(values) / len(values)
        if key == "loglikelihood":
            se = mean_stderr(values)
            out["perplexity"] = math.exp(-mean)
            out["perplexity_stderr"] = None if se is None else math.exp(-mean) * se
        else:
            out[key], out[f"{key}_stderr"] = mean, mean_stderr(values)
    return out
