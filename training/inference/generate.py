"""Generation, patch by patch: the local decoder emits symbols until EOP (or S of them), the
patch is encoded by the local encoder, and the latent model advances one position.

With `use_cache` the latent model and the local decoder keep KV caches (kv_decode.py: the
modules' math with far fewer tensor ops per step, since a step of a small model costs its op
count, not its arithmetic), and `generate_batch` decodes several prompts together, each row at
its own latent position; without the cache every symbol and patch is recomputed from scratch
through the modules, one prompt at a time: the reference the cached path must match.

A patch that reaches S symbols without EOP is closed by the tokenizer's out-of-vocabulary
rule: its bytes are re-encoded with `encode_bytes` (greedy split into patches that fit S),
and each resulting patch advances the latent model. EOD ends generation.

Bounds: the output never holds more than `max_bytes` new bytes. A patch carries several
bytes (5 on average for gpt2), so the last one usually overshoots; it is cut at the last
whole UTF-8 character that fits, not at the patch boundary, which would lose up to a whole
token and leave `max_bytes=3` with nothing. Generation also stops when the latent context
(`model.max_patches` positions, prompt included) is full, so an absurd `max_bytes` (1e12)
ends there instead of growing the KV cache without end.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from hbpe.schemas.errors import ConfigError
from hbpe.schemas.symbols import EOD, PAD
from hbpe.training.inference.byte_generation import generate_bytes
from hbpe.training.inference.kv_decode import CachedPatchLM
from hbpe.training.inference.patch_decode import decode_patches, next_patches, op_threads
from hbpe.training.inference.sampling import MAX_TEMPERATURE, MIN_TEMPERATURE, Sampling, check_sampling_args
from hbpe.training.model.patch_lm import PatchLM
from hbpe.training.schemes.registry import scheme_spec


@dataclass
class Generation:
    text: str
    new_bytes: int  # <= max_bytes
    patches: int  # generated patches (the last one may be cut to fit max_bytes)
    symbols: int
    seconds: float
    # "max_bytes", "eod", "stop" (a stop string), "max_patches" (the caller's limit), "context" (model.max_patches is full)
    stopped: str
    stop: str | None = None  # the stop string that ended it (cut off, not in `text`)


MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit seed


def check_generate_args(prompt: str, *, max_bytes: int, temperature: float, seed: int | None = None) -> None:
    """The caller's arguments, checked before a model is loaded; one ConfigError each."""
    if not isinstance(prompt, str):
        raise ConfigError(
            f"prompt {prompt!r:.60} ({type(prompt).__name__}) is not a str; pass text, e.g. 'The State of the Union'"
        )
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        # click hands undecodable argv bytes over as lone surrogates (U+DC80..U+DCFF = bytes 0x80..0xFF)
        c = ord(prompt[e.start])
        what = f"byte 0x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"lone surrogate U+{c:04X}"
        raise ConfigError(
            f"the prompt is not valid UTF-8 ({what} at character {e.start}); pass UTF-8 text "
            "(a terminal or file in another encoding: convert it, e.g. with iconv -t UTF-8)"
        ) from None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ConfigError(f"max_bytes={max_bytes!r}: must be an integer >= 1; e.g. --max-bytes 200")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(
            f"temperature={temperature!r}: must be a finite number >= 0 (0 = greedy); e.g. --temperature 0.8"
        )
    if temperature != 0 and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
        # logits / 1e-40 overflows float32 to inf (softmax: nan), / 1e308 underflows to a uniform draw
        raise ConfigError(
            f"temperature={temperature!r}: must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]; "
            "e.g. --temperature 0.8 (use 0 for the most likely symbol)"
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED):
        raise ConfigError(f"seed={seed!r}: must be an integer in 0..{MAX_SEED} (torch's generator); e.g. --seed 0")


def cut_utf8(data: bytes, limit: int) -> bytes:
    r"""`data[:limit]`, moved back to the start of a UTF-8 character it would split.

    b"caf\xc3\xa9", limit 4 -> b"caf" (not b"caf\xc3"). Bytes that are not UTF-8 (a model can emit
    any) are cut at `limit`.
    """
    if len(data) <= limit:
        return data
    cut = limit
    while cut > max(limit - 3, 0) and data[cut] & 0xC0 == 0x80:  # a continuation byte: the character began earlier
        cut -= 1
    return data[:cut] if data[cut] & 0xC0 != 0x80 else data[:limit]


def _tensor(patches: list[list[int]], S: int, device: torch.device) -> torch.Tensor:
    return torch.tensor([[p + [PAD] * (S - len(p)) for p in patches]], dtype=torch.long, device=device)  # (1, T, S)


@dataclass
class _Row:
    """One prompt's generation state; `finish_patch` is the bookkeeping both decoding paths share."""

    prompt: str
    context: list[list[int]]  # the document marker and the prompt's patches (the uncached path extends it)
    room: int  # latent positions left for generated patches
    limit: int  # the caller's max_patches
    max_bytes: int
    gen: torch.Generator
    stops: tuple[bytes, ...] = ()  # UTF-8 stop strings, searched in the generated bytes
    out: bytes = b""
    symbols: int = 0
    patches: int = 0
    stopped: str = ""
    stop: bytes | None = None
    seconds: float = 0.0

    def finish_patch(self, symbols: list[int], tok, t0: float) -> list[list[int]] | None:
        """The symbols of one decoded patch -> the patches that advance the latent model, or None: stop here."""
        self.symbols += len(symbols)
        if symbols[-1] == EOD:  # the model ends the document
            self.out += tok.decode_symbols_bytes(symbols[:-1])
            return self._stop("stop" if self._cut_at_stop(len(symbols) - 1) else "eod", t0)
        data = tok.decode_symbols_bytes(symbols)
        # a patch of S symbols without EOP is re-encoded by the tokenizer's out-of-vocabulary rule
        new = next_patches(symbols, data, tok)
        self.out += data
        self.patches += len(new)
        if self._cut_at_stop(len(data)):
            return self._stop("stop", t0)
        # stop before advancing the latent model: the next patch would not be used
        if len(self.out) >= self.max_bytes:
            return self._stop("max_bytes", t0)
        if self.patches >= self.limit:
            return self._stop("max_patches", t0)
        if self.patches > self.room:
            return self._stop("context", t0)
        return new

    def _cut_at_stop(self, added: int) -> bool:
        """Whether the output now holds a stop string that ends within max_bytes; if so, cut it there.

        Only the bytes a match could overlap are searched: the `added` new ones and the longest stop
        string's length before them. The first match in the output wins, the stop string excluded.
        """
        if not self.stops:
            return False
        start = max(0, len(self.out) - added - max(map(len, self.stops)) + 1)
        found = [(i, s) for s in self.stops if (i := self.out.find(s, start)) >= 0 and i + len(s) <= self.max_bytes]
        if not found:
            return False
        at, self.stop = min(found)
        self.out = self.out[:at]
        return True

    def _stop(self, why: str, t0: float) -> None:
        self.stopped, self.seconds = why, time.perf_counter() - t0
        return None

    def result(self) -> Generation:
        out = cut_utf8(self.out, self.max_bytes)
        text = self.prompt + out.decode("utf-8", errors="replace")
        stop = None if self.stop is None else self.stop.decode("utf-8")
        return Generation(text, len(out), self.patches, self.symbols, self.seconds, self.stopped, stop)


def _choose(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> int:
    """The next symbol from logits (V,) with PAD already excluded: argmax, or a draw (training/inference/sampling.py)."""
    return sampling.choose(logits, gen)


def generate(
    model: PatchLM,
    tok,
    prompt: str,
    *,
    max_bytes: int = 200,
    temperature: float = 0.0,
    use_cache: bool = True,
    seed: int = 0,
    max_patches: int | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    stop: tuple[str, ...] | list[str] = (),
) -> Generation:
    """Continue one prompt (`generate_batch` of one)."""
    [g] = generate_batch(
        model,
        tok,
        [prompt],
        max_bytes=max_bytes,
        temperature=temperature,
        use_cache=use_cache,
        seed=seed,
        max_patches=max_patches,
        top_k=top_k,
        top_p=top_p,
        stop=stop,
    )
    return g


@torch.inference_mode()
def generate_batch(
    model: PatchLM,
    tok,
    prompts: list[str],
    *,
    max_bytes: int = 200,
    temperature: float = 0.0,
    use_cache: bool = True,
    seed: int = 0,
    max_patches: int | None = None,
    batch_size: int = 16,
    top_k: int | None = None,
    top_p: float | None = None,
    stop: tuple[str, ...] | list[str] = (),
) -> list[Generation]:
    """Continue every prompt, `batch_size` of them decoded together; one Generation per prompt, in order.

    Greedy by default (temperature 0: the most likely symbol); with a temperature, a draw from the
    top_k most likely symbols and the top_p nucleus (training/inference/sampling.py). A prompt's generation ends
    at the first stop string its generated text contains, which is left out of `text` (`stopped` is
    "stop" and `stop` names it); a stop string is never matched inside the prompt.

    Prompt i (0-based) samples from its own generator seeded with `seed + i`, and rows never
    share states, so its output does not depend on `batch_size` or on the other prompts (it
    equals `generate(prompt, seed=seed + i)`, up to float rounding of batched matmuls), and
    the same prompt given twice gives two samples. Without the cache, prompts run one at a
    time through the modules (the reference).
    """
    spec = scheme_spec(model.cfg)
    tok = spec.generation_symbols(model, tok)  # the byte-patch schemes: bytes (+ EOP), cut by the model's patcher
    use_cache = use_cache and spec.cached_generation(model.cfg)
    if not prompts:
        raise ConfigError("no prompts to continue; pass at least one, e.g. --prompt 'The State of the Union'")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r}: must be an integer >= 1; e.g. --batch-size 8")
    for prompt in prompts:
        check_generate_args(prompt, max_bytes=max_bytes, temperature=temperature, seed=seed)
    check_sampling_args(top_k=top_k, top_p=top_p, stop=stop)
    sampling = Sampling(temperature, top_k, top_p)
    stops = tuple(s.encode("utf-8") for s in stop)
    limit = max_patches or max(4 * max_bytes, 16)
    rows = []
    for i, prompt in enumerate(prompts):
        context = [[EOD], *spec.prompt_patches(tok, prompt)]
        room = model.cfg.max_patches - len(context)
        if room < 1:
            which = "the prompt" if len(prompts) == 1 else f"prompt {i + 1} of {len(prompts)}"
            raise ConfigError(
                f"{which} is {len(context) - 1} patches and the model's latent context holds "
                f"{model.cfg.max_patches} (model.max_patches) with the document marker; shorten the prompt"
            )
        gen = torch.Generator(device="cpu").manual_seed((seed + i) % (MAX_SEED + 1))
        rows.append(_Row(prompt, context, room, limit, max_bytes, gen, stops))
    if spec.per_position_generation:
        for row in rows:
            generate_bytes(model, row, sampling, use_cache=use_cache, choose=_choose)
        return [r.result() for r in rows]
    for start in range(0, len(rows), batch_size if use_cache else 1):
        chunk = rows[start : start + batch_size]
        if use_cache:
            with op_threads(model.cfg, next(model.parameters()).device, len(chunk)):
                _generate_cached(model, tok, chunk, sampling)
        else:
            _generate_uncached(model, tok, chunk[0], sampling)
    return [r.result() for r in rows]


def _closes(tok, rows: list[_Row]):
    """decode_patches' `closes` for these rows: the byte baselines' patcher (None for the tokenizer's patches)."""
    if getattr(tok, "closes_patch", None) is None:
        return None
    return lambda i, symbols: _patcher_closes(tok, rows[i], symbols)


def _patcher_closes(tok, row: _Row, symbols: list[int]) -> bool:
    """Given patch boundaries (byte baselines): the patcher, not a symbol, ends the patch (byte_generation.py)."""
    closes = getattr(tok, "closes_patch", None)
    return closes is not None and closes(row.prompt.encode("utf-8") + row.out, symbols)


def _generate_uncached(model: PatchLM, tok, row: _Row, sampling: Sampling) -> None:
    """The reference: every symbol and every patch recomputed from scratch through the modules."""
    io, S, device = model.io, tok.max_patch_size, next(model.parameters()).device
    never = list(getattr(tok, "never_symbols", ()))
    t0 = time.perf_counter()
    h = model.latent_step(io.encode_patches(_tensor(row.context, S, device)), None)[:, -1]  # (1, D)
    while True:
        symbols: list[int] = []
        while len(symbols) < S:
            prefix = torch.tensor([symbols], dtype=torch.long, device=device).reshape(1, len(symbols))  # (1, k)
            logits = io.symbol_logits(h, prefix, None)[0].float()  # (V,)
            logits[PAD] = float("-inf")
            logits[never] = float("-inf")
            symbols.append(_choose(logits, sampling, row.gen))
            if symbols[-1] == EOD or tok.symbol_ends_patch[symbols[-1]] or _patcher_closes(tok, row, symbols):
                break
        new = row.finish_patch(symbols, tok, t0)
        if new is None:
            return
        row.context += new
        h = model.latent_step(io.encode_patches(_tensor(row.context, S, device)), None)[:, -1]


def _generate_cached(model: PatchLM, tok, rows: list[_Row], sampling: Sampling) -> None:
    """All rows together, KV caches in the latent model and the local decoder (kv_decode.CachedPatchLM)."""
    t0 = time.perf_counter()
    m = CachedPatchLM(model, never_generated=scheme_spec(model.cfg).never_generated(model.cfg))
    ends = tok.symbol_ends_patch  # list[bool], per symbol id
    h = m.prefill([r.context for r in rows])  # (B, D)
    active = list(rows)
    while True:
        patches = decode_patches(
            m, h, ends=ends, max_patch_size=tok.max_patch_size, sampling=sampling, gens=[r.gen for r in active],
            closes=_closes(tok, active),
        )  # fmt: skip
        new, keep = [], []
        for i, (row, symbols) in enumerate(zip(active, patches)):
            advance = row.finish_patch(symbols, tok, t0)
            if advance is not None:
                new.append(advance)
                keep.append(i)
        if not keep:
            return
        if len(keep) < len(active):
            m.keep(keep)
            active = [active[i] for i in keep]
        h = m.advance(new)
