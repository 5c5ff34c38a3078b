"""hbpe checkpoints as an lm-eval-harness model named "hbpe" (`lm_eval.api.model.LM`).

    import hbpe.training.inference.zero_shot.lm_eval_adapter  # registers "hbpe"
    lm_eval.simple_evaluate(model="hbpe", model_args="checkpoint=runs/demo/train", tasks=[...])

or, from the shell, lm-eval's own CLI with the model registered first (lm-eval 0.4 reads no entry
points: an external model exists only once code that registers it has run):

    python -m hbpe.training.inference.zero_shot.lm_eval_cli --model hbpe --model_args checkpoint=runs/demo/train --tasks ...

`loglikelihood` and `loglikelihood_rolling` are the scorer of `hbpe eval-tasks`
(training/inference/zero_shot/scorer.py), so both report the same numbers on the same requests.
`generate_until` is greedy patch-by-patch generation (training/inference/generate.py), cut at the first
stop string; it needs the hierarchical model.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from hbpe.schemas.errors import ConfigError
from hbpe.training.checkpoint.load import load_model
from hbpe.training.inference.generate import generate
from hbpe.training.inference.zero_shot.pairs import scheme_for
from hbpe.training.inference.zero_shot.scorer import score_pairs
from hbpe.training.model.devices import resolve_device

DEFAULT_BATCH_SIZE = 16
log = logging.getLogger(__name__)


def _device_or_cpu(device: str | None) -> str | None:
    """lm-eval passes device="cuda:0" unless told otherwise (its EvaluateConfig default), so a CUDA
    device on a machine without a GPU means "the default": run on the CPU and say so once on stderr."""
    import torch

    # only lm-eval's cuda default is forgiven; every other bad name is resolve_device's error
    if device and re.fullmatch(r"cuda(:\d+)?", device.strip().lower()) and not torch.cuda.is_available():
        # once per model; with no handler configured, logging's last resort prints it on stderr
        log.warning(f"hbpe: device={device} but no CUDA GPU is visible: running on the CPU")
        return "cpu"
    return device


def _batch_size(value: Any) -> int:
    """lm-eval hands over an int, a digit string, or "auto" / "auto:N" (here: the default)."""
    if value is None or (isinstance(value, str) and value.startswith("auto")):
        return DEFAULT_BATCH_SIZE
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = 0
    if size < 1:
        raise ConfigError(f"batch_size={value!r}: must be an integer >= 1 or auto; e.g. --batch_size 16")
    return size


@register_model("hbpe")
class HbpeLM(LM):
    """An hbpe checkpoint (a `hbpe train` save folder or a .pt inside one) for lm-eval.

    model_args: checkpoint=PATH (required), max_gen_toks=N (patches per `generate_until`, 256),
    progress=true|false; lm-eval's own batch_size and device are honoured (a CUDA device
    without a visible GPU, lm-eval's default cuda:0 on a CPU machine, runs on the CPU with one warning).
    """

    def __init__(
        self,
        checkpoint: str | None = None,
        *,
        device: str | None = None,
        batch_size: int | str | None = None,
        max_batch_size: int | None = None,
        max_gen_toks: int = 256,
        progress: bool = True,
        **unknown: Any,
    ) -> None:
        super().__init__()
        if unknown:
            raise ConfigError(
                f"model_args {sorted(unknown)} are not hbpe's; it takes checkpoint=PATH, max_gen_toks=N, progress=BOOL"
            )
        if not checkpoint:
            raise ConfigError("the hbpe model needs checkpoint=PATH; e.g. --model_args checkpoint=runs/demo/train")

        self.batch_size = _batch_size(batch_size)
        self.max_gen_toks = int(max_gen_toks)
        self.progress = bool(progress)
        self._device = resolve_device(_device_or_cpu(device))
        self.model, self.tok, self.meta = load_model(str(checkpoint), device=self._device)
        self.scheme = scheme_for(self.model, self.tok)

    def _score(self, pairs: list[tuple[str, str]], label: str):
        return score_pairs(
            self.model, self.scheme, pairs, batch_size=self.batch_size, progress=label if self.progress else None
        )

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(context, continuation) -> (sum of log-probs of the continuation's symbols, greedy?)."""
        pairs = [tuple(r.args) for r in requests]
        scores = self._score(pairs, "loglikelihood")
        out = []
        for r, s in zip(requests, scores, strict=True):
            answer = (s.loglikelihood, s.is_greedy)
            self.cache_hook.add_partial("loglikelihood", r.args, answer)
            out.append(answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """A whole text's log-likelihood after the document marker (windowed past the latent context)."""
        scores = self._score([("", r.args[0]) for r in requests], "loglikelihood_rolling")
        for r, s in zip(requests, scores, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, s.loglikelihood)
        return [s.loglikelihood for s in scores]

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy generation after each context, cut at the first of `until`; at most max_gen_toks patches."""

        out = []
        for r in requests:
            context, kwargs = r.args
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            patches = int(kwargs.get("max_gen_toks", self.max_gen_toks))
            # a patch is one first-stage token: max_gen_toks patches, with bytes enough for any of them
            g = generate(self.model, self.tok, context, max_bytes=64 * patches, temperature=0.0, max_patches=patches)
            text = g.text[len(context) :]
            for stop in until:
                if stop and stop in text:
                    text = text[: text.index(stop)]
            self.cache_hook.add_partial("generate_until", r.args, text)
            out.append(text)
        return out
