"""`hbpe tokenizer info`: what a tokenizer artifact holds, as numbers and a histogram plot."""

from __future__ import annotations

import numpy as np

from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer


def describe(tok: HierarchicalTokenizer) -> dict:
    before, after = tok.vocabulary_patch_lengths()
    top = int(max(before.max(), after.max()))
    return {
        "first_stage": tok.encoding.name,
        "n_vocab": tok.encoding.n_vocab,
        "max_patch_size": tok.max_patch_size,
        "mode": tok.mode,
        "merges": len(tok.merges),
        "vocab_size": tok.vocab_size,
        "fingerprint": tok.fingerprint,
        "mean_symbols_before": float(before.mean()),
        "mean_symbols_after": float(after.mean()),
        "histogram_before": np.bincount(before, minlength=top + 1).tolist(),
        "histogram_after": np.bincount(after, minlength=top + 1).tolist(),
    }


def render(info: dict) -> str:
    lines = [
        f"first stage   {info['first_stage']} ({info['n_vocab']} tokens)",
        f"second stage  S={info['max_patch_size']} mode={info['mode']} merges={info['merges']} V'={info['vocab_size']}",
        f"fingerprint   {info['fingerprint']}",
        f"symbols per vocabulary patch: {info['mean_symbols_before']:.2f} (bytes+EOP) -> {info['mean_symbols_after']:.2f}",
        "length  before   after",
    ]
    for n, (b, a) in enumerate(zip(info["histogram_before"], info["histogram_after"], strict=True)):
        if b or a:
            lines.append(f"{n:>6} {b:>7} {a:>7}")
    return "\n".join(lines)


def plot_histograms(info: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before, after = np.array(info["histogram_before"]), np.array(info["histogram_after"])
    # a handful of very long first-stage tokens (gpt2 has one of 128 bytes) would squash the bars
    top = min(len(before), 3 * info["max_patch_size"] + 1)
    longer = int(before[top:].sum())
    x = np.arange(top)
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=120)
    ax.bar(
        x - 0.2,
        before[:top],
        width=0.4,
        label="bytes + EOP (first stage)" + (f"; {longer} longer not shown" if longer else ""),
    )
    ax.bar(x + 0.2, after[:top], width=0.4, label=f"after hierarchical BPE (S={info['max_patch_size']})")
    ax.axvline(info["max_patch_size"] + 0.5, color="k", linestyle="--", linewidth=0.8)
    ax.set_xlabel("symbols per vocabulary patch")
    ax.set_ylabel("tokens")
    ax.set_title(f"{info['first_stage']}: V'={info['vocab_size']}, {info['mode']} mode")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
