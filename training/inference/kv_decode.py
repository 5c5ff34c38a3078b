"""KV-cached forward passes of a hierarchical PatchLM for generation, one patch and one symbol at a time.

Generation runs the model in hundreds of tiny steps (at 1 KB of output on the tiny model:
~250 latent steps, ~250 encoder passes over one patch, ~750 decoder steps), each a few
64-wide matmuls, so its cost is the Python and dispatch overhead per tensor op (~2 us each
on CPU), not arithmetic. Profiling the module path (`Transformer.forward` with
`layers.KVCache`, cProfile, 1 KB greedy) put 30% of the time in `rope` rebuilding its cos/sin
tables on every call, and most of the rest in the ~75 small ops and 14 module calls of each
block. Here the same math runs from the model's own weights in about 25 ops per block:

- RoPE from tables computed once (the same formula as `layers.rope`), applied to the fused
  qkv row in four ops, q and k together;
- each RMSNorm gain folded into the matmul that reads the normed vector, the norm itself as
  ||x|| and one fused `eps + ||x||^2 / d` (F.rms_norm's mean alone costs more);
- residual adds inside the matmuls (addmm), gate and up as one matmul, PAD excluded from
  the logits by the head's bias (-inf), one-key attention skipped (it returns the value);
- no nn.Module calls, rows flat (B*L, d), masks only where a batch is ragged;
- the local encoder run over the real symbols of a patch only (the module masks PAD keys:
  the same attention);
- rows of a batch at their own latent positions: each row's keys are stored already rotated
  with its own positions, so rows need not agree on how many patches they have seen; slots
  a row did not fill are masked out.

The result is the modules' function up to float rounding (~1e-6 on fp32; folded gains are
not bit for bit), so greedy output matches recomputation: tests/training/test_generate_batched.py
checks every logit against the modules at 1e-5 on a 3-layer model with scaled weights.
Model code stays free of generation tricks; `generate.py` drives this class (patch_decode.py its symbol loop),
and so does the generate() of `hbpe export --format hf` folders, which ship a copy of this module.
Shapes: B rows, L new positions, S symbols per patch, H heads, Dh head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hbpe.schemas.errors import HbpeError
from hbpe.schemas.symbols import PAD
from hbpe.training.model.layers import Transformer
from hbpe.training.model.patch_lm import PatchLM

_Cache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (B, H, K, Dh), keys rotated


class _Rope:
    """`layers.rope` as two tables over the fused qkv row, for every position up to a growing bound.

    layers.rope rotates each pair (x1, x2) of q and k to (x1 c - x2 s, x1 s + x2 c). With the
    pairs swapped (x2, x1) by one index_select, that is qkv * cos + swapped * sin where, per
    pair, cos = (c, c) and sin = (-s, s) over q and k, and cos = 1, sin = 0 over v: the same
    products and sums as the rotation `layers.rope` computes (as a complex product there: equal to float
    rounding), in four ops instead of eleven, with v passing through.
    """

    def __init__(self, heads: int, head_dim: int, theta: float, device: torch.device, dtype: torch.dtype) -> None:
        self.heads, self.dh, self.theta, self.device, self.dtype = heads, head_dim, theta, device, dtype
        pairs = torch.arange(heads * head_dim, device=device).view(-1, 2).flip(-1).reshape(-1)  # 1, 0, 3, 2, ...
        self.swap = torch.cat([pairs, pairs + heads * head_dim, pairs + 2 * heads * head_dim])  # (3D,)
        self.cos = self.sin = torch.empty(0, 3 * heads * head_dim, device=device, dtype=dtype)

    def _grow(self, n: int) -> None:
        n = max(n, 2 * self.cos.shape[0], 64)
        dh, H = self.dh, self.heads
        inv = 1.0 / (self.theta ** (torch.arange(0, dh, 2, device=self.device, dtype=torch.float32) / dh))
        ang = torch.arange(n, device=self.device).to(torch.float32)[:, None] * inv[None, :]  # (n, Dh/2)
        c, s = ang.cos().to(self.dtype), ang.sin().to(self.dtype)
        qk_cos = torch.stack([c, c], dim=-1).flatten(-2).repeat(1, H)  # (n, D)
        qk_sin = torch.stack([-s, s], dim=-1).flatten(-2).repeat(1, H)  # (n, D)
        self.cos = torch.cat([qk_cos, qk_cos, torch.ones_like(qk_cos)], dim=-1)  # (n, 3D)
        self.sin = torch.cat([qk_sin, qk_sin, torch.zeros_like(qk_sin)], dim=-1)

    def span(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions start..start+n-1, the same for every row -> cos, sin (n, 3D)."""
        if start + n > self.cos.shape[0]:
            self._grow(start + n)
        return self.cos[start : start + n], self.sin[start : start + n]

    def gather(self, positions: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's own positions (B lists of L) -> cos, sin (B, L, 3D)."""
        bound = 1 + max(max(row) for row in positions)
        if bound > self.cos.shape[0]:
            self._grow(bound)
        pos = torch.tensor(positions, device=self.device)  # (B, L)
        return self.cos[pos], self.sin[pos]


def _normalize(x: torch.Tensor, eps: torch.Tensor, inv_dim: float) -> torch.Tensor:
    """RMSNorm without its gain (folded into the matmul after it): x * rsqrt(mean(x^2) + eps), over rows (N, d).

    As ||x|| and one fused eps + ||x||^2 / d: three small ops where `F.rms_norm` runs five
    inside (its mean alone costs more than the norm).
    """
    r = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # (N, 1)
    return x * torch.rsqrt(torch.addcmul(eps, r, r, value=inv_dim))


class _Stack:
    """One `layers.Transformer`'s weights, read once, run on new positions with an optional KV cache.

    Rows are flat (N = B*L, d), so every matmul is one 2-D addmm with the residual as its
    bias. Each RMSNorm gain is folded into the matmul that reads it (qkv, gate|up); the final
    norm's gain is left to the caller (`out_gain`) to fold into what reads the stack's output.
    Gate and up are one matmul (their weights stacked: the same dot products).
    """

    def __init__(self, t: Transformer) -> None:
        first = t.blocks[0]
        self.heads = first.attn.heads
        self.dim = first.attn.qkv.weight.shape[1]
        self.head_dim = self.dim // self.heads
        w = t.norm.weight
        self.blocks = [
            (
                b.attn.qkv.weight * b.norm1.weight,  # (3D, D): norm1's gain folded in
                torch.tensor(b.norm1.eps, dtype=w.dtype, device=w.device),
                b.attn.out.weight,
                torch.cat([b.mlp.gate.weight, b.mlp.up.weight]) * b.norm2.weight,  # (2F, D): norm2's gain folded in
                torch.tensor(b.norm2.eps, dtype=w.dtype, device=w.device),
                b.mlp.down.weight,
            )
            for b in t.blocks
        ]
        self.eps, self.out_gain = torch.tensor(t.norm.eps, dtype=w.dtype, device=w.device), w
        self.rope = _Rope(self.heads, self.head_dim, first.attn.theta, w.device, w.dtype)

    def __call__(
        self,
        x: torch.Tensor,
        B: int,
        rot: tuple[torch.Tensor, torch.Tensor],
        cache: _Cache | None,
        mask: torch.Tensor | None,
        *,
        causal: bool,
    ) -> torch.Tensor:
        """x (B*L, d), B rows of L new positions at the positions `rot` holds -> normed states (B*L, d), gain not applied.

        Appends to `cache`. `mask` (B or 1, 1, L, K) True = attend, over the cached and new
        keys. Without one, a causal stack attends to every key (one new position) or in plain
        causal order (several positions and nothing cached, SDPA's is_causal); callers pass a
        mask in other cases.
        """
        N, D = x.shape
        L = N // B
        cos, sin = rot
        swap, H, dh, inv_dim = self.rope.swap, self.heads, self.head_dim, 1.0 / D
        causal = causal and mask is None and L > 1
        for i, (wqkv, e1, wout, wgu, e2, wd) in enumerate(self.blocks):
            qkv = F.linear(_normalize(x, e1, inv_dim), wqkv).view(B, L, 3 * D)
            qkv = qkv * cos + qkv.index_select(-1, swap) * sin  # q, k rotated (layers.rope), v as it was
            if L == 1:
                q, k, v = qkv.view(B, 3, H, 1, dh).unbind(1)  # 3 x (B, H, 1, Dh)
            else:
                q, k, v = qkv.view(B, L, 3, H, dh).permute(2, 0, 3, 1, 4)  # 3 x (B, H, L, Dh)
            alone = not cache and L == 1 and mask is None  # one key: attention returns its value as it is
            if cache is not None:
                if i < len(cache):
                    k = torch.cat([cache[i][0], k], dim=2)  # (B, H, K, Dh)
                    v = torch.cat([cache[i][1], v], dim=2)
                    cache[i] = (k, v)
                else:
                    cache.append((k, v))
            y = v if alone else F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
            y = y.reshape(N, D) if L == 1 else y.transpose(1, 2).reshape(N, D)  # (N, D)
            x = F.linear(y, wout, x)  # x + attention
            gate, up = F.linear(_normalize(x, e2, inv_dim), wgu).chunk(2, dim=-1)  # 2 x (N, F)
            x = F.linear(F.silu(gate) * up, wd, x)  # x + SwiGLU
        return _normalize(x, self.eps, inv_dim)


class CachedPatchLM:
    """g_phi, f_theta and m_psi of a hierarchical PatchLM for generation, with KV caches in f_theta and m_psi.

    Rows of a batch each hold a latent context of their own length. Use:
        h = m.prefill(contexts)        # prompts as patch lists -> h (B, D) after each prompt
        logits = m.decoder_start(h)    # (B, V) of each row's first symbol of the next patch (PAD: -inf)
        logits = m.decoder_next(syms)  # (B, V) after one more symbol per row
        h = m.advance(new_patches)     # encode each row's new patches, one latent step
        m.keep(rows)                   # drop finished rows from every cache
    `h` is f_theta's output before its final norm gain, which is folded into m_psi's input projection.
    """

    def __init__(self, model: PatchLM, *, never_generated: tuple[int, ...] = ()) -> None:
        """`never_generated`: symbols the scheme's decoder may emit but never should (SchemeSpec.never_generated)."""
        io = model.io
        enc, dec = io.encoder, io.decoder
        if enc.embed.weight.dtype != torch.float32:
            raise HbpeError(
                f"KV-cached generation runs fp32 weights, this model holds {enc.embed.weight.dtype}; load it with "
                "hbpe.training.load_model (fp32), or generate with use_cache=False"
            )
        self.S, self.pooling, self.conditioning = io.S, enc.pooling, dec.conditioning
        self.encoder, self.latent, self.decoder = _Stack(enc.transformer), _Stack(model.latent), _Stack(dec.transformer)
        self.embed = enc.embed.weight  # E, shared by g_phi and m_psi
        # each stack's final norm gain, folded into the one matmul that reads its output (pooling is linear)
        self.to_latent = enc.to_latent.weight * self.encoder.out_gain  # (D, d)
        self.from_latent = dec.from_latent.weight * self.latent.out_gain  # (d, D)
        self.head = dec.head.weight * self.decoder.out_gain  # (V, d)
        self.start = dec.start  # (d,) for `add` conditioning
        self.device = self.embed.device
        self.enc_rot = [self.encoder.rope.span(0, n) for n in range(self.S + 1)]  # positions 0..n-1 of a patch
        cos, sin = self.decoder.rope.span(0, self.S + 1)
        self.dec_rot = [(cos[k], sin[k]) for k in range(self.S + 1)]  # decoder positions 0..S, (3d,) each
        # added to m_psi's logits: PAD is never generated (+0 leaves every other logit as it was)
        self.never_pad = torch.zeros(self.head.shape[0], dtype=self.head.dtype, device=self.device)
        self.never_pad[PAD] = float("-inf")
        self.never_pad[list(never_generated)] = float("-inf")  # never a target
        self.lat_cache: _Cache = []
        self.positions: list[int] = []  # next latent position of each row
        self.valid: torch.Tensor | None = None  # (B, K) filled latent slots, None while every slot is filled
        self.dec_cache: _Cache = []
        self.cond: torch.Tensor | None = None  # (B, d) h projected, for `add` conditioning

    # ---- g_phi and f_theta
    def _encode(self, patches: list[list[int]]) -> torch.Tensor:
        """Patches (M lists of real symbols, no PAD) -> e (M, D); PAD keys masked where lengths differ."""
        M, lengths = len(patches), [len(p) for p in patches]
        n = max(lengths)
        ragged = min(lengths) < n
        ids = torch.tensor([p + [PAD] * (n - len(p)) for p in patches], dtype=torch.long, device=self.device)
        mask = None
        if ragged:
            real = ids != PAD  # (M, n)
            key_mask = real.clone()
            key_mask[:, 0] = True  # an all-PAD filler row attends somewhere: no NaN in the cache
            mask = key_mask[:, None, None, :]  # (M, 1, 1, n)
        x = F.embedding(ids.view(-1), self.embed)  # (M*n, d)
        x = self.encoder(x, M, self.enc_rot[n], None, mask, causal=False).view(M, n, -1)  # (M, n, d)
        if self.pooling == "mean":
            if ragged:
                w = real.unsqueeze(-1).to(x.dtype)  # (M, n, 1)
                pooled = (x * w).sum(1) / w.sum(1).clamp_min(1.0)  # (M, d)
            else:
                pooled = x.sum(1) / float(n)  # (M, d)
        elif ragged:
            last = torch.tensor([max(m, 1) - 1 for m in lengths], device=self.device)  # (M,)
            pooled = x[torch.arange(M, device=self.device), last]  # (M, d)
        else:
            pooled = x[:, -1]  # (M, d)
        return F.linear(pooled, self.to_latent)  # (M, D)

    def _latent_rot(self, L: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of each row's next L positions, (L, 3D) for all rows alike or (B, L, 3D)."""
        p = self.positions[0]
        if len(self.positions) == 1 or (L == 1 and all(q == p for q in self.positions)):
            return self.latent.rope.span(p, L)  # broadcast over rows
        return self.latent.rope.gather([[q + j for j in range(L)] for q in self.positions])

    def advance(self, new: list[list[list[int]]]) -> torch.Tensor:
        """Each row's new patches -> h (B, D) at each row's last new position.

        A row given no patches keeps its position (its slots this step are masked fillers) and its h is not
        meaningful; at least one row has a patch (the HF generate() advances only the rows that need it).
        """
        B, counts = len(new), [len(ps) for ps in new]
        L = max(counts)
        flat = [p for ps in new for p in ps + [[]] * (L - len(ps))]  # fillers: all PAD, masked below
        e = self._encode(flat)  # (B*L, D)
        K = (self.lat_cache[0][0].shape[2] if self.lat_cache else 0) + L  # latent slots after this step
        ragged = min(counts) < L
        if ragged or self.valid is not None:
            old = self.valid if self.valid is not None else torch.ones(B, K - L, dtype=torch.bool, device=self.device)
            fresh = torch.arange(L, device=self.device)[None, :] < torch.tensor(counts, device=self.device)[:, None]
            self.valid = torch.cat([old, fresh], dim=1)  # (B, K)
        mask = None
        if self.valid is not None or (L > 1 and self.lat_cache):
            causal = torch.ones(L, K, dtype=torch.bool, device=self.device).tril(diagonal=K - L)  # (L, K)
            mask = causal[None, None] if self.valid is None else self.valid[:, None, None, :] & causal
        h = self.latent(e, B, self._latent_rot(L), self.lat_cache, mask, causal=True).view(B, L, -1)  # (B, L, D)
        self.positions = [q + c for q, c in zip(self.positions, counts)]
        if not ragged:
            return h[:, -1]  # (B, D)
        last = torch.tensor([c - 1 for c in counts], device=self.device)
        return h[torch.arange(B, device=self.device), last]  # (B, D)

    def prefill(self, contexts: list[list[list[int]]]) -> torch.Tensor:
        """Each row's prompt patches (document marker first) -> h (B, D) after its last one."""
        self.lat_cache, self.valid, self.positions = [], None, [0] * len(contexts)
        return self.advance(contexts)

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (indices into the current batch) in the latent cache."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.lat_cache = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in self.lat_cache]
        self.positions = [self.positions[i] for i in rows]
        if self.valid is not None:
            self.valid = self.valid.index_select(0, idx)
            if bool(self.valid.all()):
                self.valid = None

    # ---- m_psi
    def _decode(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, d) at the next decoder position -> logits (B, V), PAD's at -inf."""
        k = self.dec_cache[0][0].shape[2] if self.dec_cache else 0
        out = self.decoder(x, x.shape[0], self.dec_rot[k], self.dec_cache, None, causal=True)  # (B, d) at position k
        return F.linear(out, self.head, self.never_pad)  # (B, V)

    def decoder_start(self, h: torch.Tensor) -> torch.Tensor:
        """A new patch after h (B, D): logits (B, V) of its first symbol (a fresh decoder cache)."""
        self.dec_cache = []
        c = F.linear(h, self.from_latent)  # (B, d)
        if self.conditioning == "prefix":
            self.cond = None
            return self._decode(c)
        self.cond = c
        return self._decode(self.start + c)

    def decoder_next(self, symbols: torch.Tensor) -> torch.Tensor:
        """symbols (B,) just chosen -> logits (B, V) of the next symbol of each row's patch."""
        x = F.embedding(symbols, self.embed)  # (B, d)
        return self._decode(x if self.cond is None else x + self.cond)
