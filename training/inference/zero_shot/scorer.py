"""The scheme-independent part of zero-shot scoring: log P(continuation | context) for many pairs, batched.

    encode each pair (training/inference/zero_shot/pairs.py) -> windows that fit the latent context ->
    sort by length -> pad to the longest, right-padded -> PatchLM's forward pass, its output side
    run at the continuation's target positions only -> log-softmax there -> sum per request

The log-likelihood of a request is the sum, over every target position of its continuation
(each symbol of each patch, EOP included, for BPE-patch; each token for BPE), of the log-probability
the model gives the true symbol: lm-eval's `loglikelihood`. `is_greedy` says whether the argmax
at each of those positions is the true symbol (greedy decoding, with teacher forcing, would emit
the continuation exactly; ids the model may emit but text never holds, like PAD, are excluded as in
generation). Right padding cannot reach a real position: the latent model and the local decoder
are causal and the local encoder reads one patch at a time.

A request longer than the latent context (`model.max_patches` positions) is scored in windows cut
from the end: each window holds at most max_patches + 1 positions and scores a disjoint run of the
continuation's targets, with as much preceding text as fits (lm-eval's rolling windows, which it
cuts from the start; for an ordinary request this is lm-eval's left truncation of the context).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hbpe.schemas.errors import HbpeError
from hbpe.training.inference.zero_shot.pairs import EncodedPair, PairScheme
from hbpe.training.model.patch_io import IGNORE


@dataclass(frozen=True)
class Score:
    loglikelihood: float  # nats, summed over the continuation's target positions
    is_greedy: bool
    targets: int  # scored target positions (symbols or tokens)


def windows(pair: EncodedPair, max_positions: int) -> list[EncodedPair]:
    """`pair`, or windows of at most max_positions + 1 positions that score disjoint runs of its targets.

    Cut from the end: the last window ends at the last scored target and starts max_positions
    targets earlier; each earlier window ends where the next one starts. A window with nothing
    to score is left out. E.g. 10 positions, targets 3..8 scored, max_positions 4: windows over
    positions [5, 10) (scoring targets 5..8) and [1, 6) (scoring 3..4; 1..2 are context).
    """
    if pair.length <= max_positions + 1:
        return [pair]
    scored_at = pair.scored.reshape(len(pair.scored), -1).any(axis=1)  # (L - 1,)
    out, end = [], len(scored_at)
    while True:
        left = np.flatnonzero(scored_at[:end])
        if not len(left):
            break
        end = int(left[-1]) + 1  # targets [start, end) predict positions start+1 .. end
        start = max(end - max_positions, 0)
        out.append(EncodedPair({k: v[start : end + 1] for k, v in pair.inputs.items()}, pair.scored[start:end]))
        end = start
    return out[::-1]


def collate(pairs: Sequence[EncodedPair], pad: dict[str, int], device: torch.device | str) -> tuple[dict, torch.Tensor]:
    """Right-pad to the longest: -> (batch dict of (B, L, ...) tensors, scored mask (B, L - 1, ...))."""
    L = max(p.length for p in pairs)
    batch = {}
    for key, first in pairs[0].inputs.items():
        arr = np.full((len(pairs), L, *first.shape[1:]), pad[key], dtype=np.int64)
        for i, p in enumerate(pairs):
            arr[i, : p.length] = p.inputs[key]
        batch[key] = torch.from_numpy(arr).to(device)
    mask = np.zeros((len(pairs), L - 1, *pairs[0].scored.shape[1:]), dtype=bool)
    for i, p in enumerate(pairs):
        mask[i, : p.length - 1] = p.scored
    return batch, torch.from_numpy(mask).to(device)


def predict_scored(model, batch: dict, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`PatchLM.forward` at the scored target positions only -> (logits (R, V), targets (R,), row of each (R,)).

    The model's three stages, run as its forward runs them: e = g_phi over every position,
    h = f_theta (causal), then the output side only where a target is scored. `PatchIO.decode`
    predicts position t + 1 from h_t alone, so the positions with a scored target are gathered
    into a batch of one-step sequences (h_t, inputs at t and t + 1): the local decoder (or the BPE
    head) runs on the continuation's patches, not on every context patch (half the local work, and
    a (B * L, V) logits tensor never exists). Equal to the plain forward pass (tested).
    """
    e = model.io.encode(batch)  # (B, T, D): e_t = g_phi(position t)
    h = model.latent(e, causal=True)  # (B, T, D): h_t = f_theta(e_<=t)
    B, T = h.shape[:2]
    at = mask.reshape(B, T, -1)  # (B, T, P): P targets per position (S symbols, or 1 token)
    b, t = at.any(-1).nonzero(as_tuple=True)  # (N,), (N,): positions with a scored target
    step = {k: torch.stack([v[b, t], v[b, t + 1]], dim=1) for k, v in batch.items()}  # (N, 2, ...)
    logits, targets = model.io.decode(h[b, t].unsqueeze(1), step)  # (R, V), (R,): R <= N * P slots decoded
    slots = model.io.decoded_slots(step)  # (N * P,): the slots decode's rows stand for (packed: no PAD)
    keep = at[b, t].reshape(-1)[slots]  # (R,)
    if keep.numel() != targets.numel():
        raise HbpeError(f"internal: {keep.numel()} scored slots but the model predicts {targets.numel()} targets")
    owner = b.repeat_interleave(at.shape[-1])[slots]  # (R,)
    return logits[keep], targets[keep], owner[keep]


def _score_batch(
    model, batch: dict, mask: torch.Tensor, never_predicted: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> per row: (sum of log-probs (B,) float64, all greedy (B,) bool, scored targets (B,))."""
    logits, tgt, owner = predict_scored(model, batch, mask)  # (R, V), (R,), (R,)
    if bool((tgt == IGNORE).any()):
        raise HbpeError("internal: a scored position of the continuation is one the model does not predict")
    sel = logits.float()  # (R, V)
    lp = sel.log_softmax(-1).gather(1, tgt.unsqueeze(1)).squeeze(1)  # (R,)
    if never_predicted:
        sel[:, list(never_predicted)] = float("-inf")
    miss = (sel.argmax(-1) != tgt).long()  # (R,)
    B = mask.shape[0]
    ll = torch.zeros(B, dtype=torch.float64, device=lp.device).index_add_(0, owner, lp.double())
    misses = torch.zeros(B, dtype=torch.long, device=lp.device).index_add_(0, owner, miss)
    counts = torch.zeros(B, dtype=torch.long, device=lp.device).index_add_(0, owner, torch.ones_like(miss))
    return ll.cpu().numpy(), (misses == 0).cpu().numpy(), counts.cpu().numpy()


@torch.no_grad()
def score_pairs(
    model,
    scheme: PairScheme,
    pairs: Sequence[tuple[str, str]],
    *,
    batch_size: int = 16,
    progress: str | None = None,
) -> list[Score]:
    """(context, continuation) pairs -> one Score each, in order, on the model's device.

    `progress`: a label for a tqdm bar on stderr (None: no bar). Results do not depend on
    `batch_size` beyond float rounding (~1e-6).
    """
    from tqdm import tqdm

    device = next(model.parameters()).device
    units = [(i, w) for i, (c, k) in enumerate(pairs) for w in windows(scheme.encode(c, k), model.cfg.max_patches)]
    order = sorted(range(len(units)), key=lambda u: (-units[u][1].length, u))  # longest first, as lm-eval
    ll = np.zeros(len(pairs), dtype=np.float64)
    greedy = np.ones(len(pairs), dtype=bool)
    counts = np.zeros(len(pairs), dtype=np.int64)
    bar = tqdm(total=len(units), desc=progress, unit="req", file=sys.stderr, disable=progress is None, leave=False)
    for lo in range(0, len(order), batch_size):
        chunk = order[lo : lo + batch_size]
        batch, mask = collate([units[u][1] for u in chunk], scheme.pad, device)
        row_ll, row_greedy, row_n = _score_batch(model, batch, mask, scheme.never_predicted)
        for row, u in enumerate(chunk):
            i = units[u][0]
            ll[i] += row_ll[row]
            greedy[i] &= bool(row_greedy[row])
            counts[i] += row_n[row]
        bar.update(len(chunk))
    bar.close()
    return [Score(float(ll[i]), bool(greedy[i]), int(counts[i])) for i in range(len(pairs))]
