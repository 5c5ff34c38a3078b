"""GPU checks in plain PyTorch (issues 25 and 29): packed vs padded local models, MFU of `small`, a width ladder.

Runs where torch and a GPU are but the pinned stack is not (a lent machine's image: torch 2.11, no
Composer). Input: the .npz that `prepare` writes here from the shared en-sotu corpus; output: one
JSON file, written after every measurement (a run cut short keeps what it measured).

    python infra/gpu/packed_and_ladder.py prepare runs/gpu/batches.npz          # here, with the full stack
    python infra/gpu/packed_and_ladder.py run runs/gpu/batches.npz OUT.json     # on the GPU machine
    python infra/gpu/packed_and_ladder.py run runs/gpu/batches.npz OUT.json 1   # the ladder alone, seed 1
    python infra/gpu/packed_and_ladder.py report docs/experiments/gpu-h100      # table.md + ladder.png of its JSONs
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: import hbpe from the tree

H100_BF16_DENSE = 989.4e12  # NVIDIA's H100 SXM dense bf16 peak: MFU's denominator
MINI = dict(
    latent_layers=4,
    latent_dim=96,
    latent_ffn=256,
    latent_heads=4,
    local_dim=64,
    local_ffn=128,
    local_heads=4,
    encoder_layers=3,
    decoder_layers=3,
)  # hbpe/experiments/presets.py MINI (that module needs omegaconf)


def prepare(out: Path, *, seq_len: int = 128, eval_every: int = 10) -> None:
    """en-sotu as 128-token rows (+1 for the shifted target), every 10th document held out (spread over 1790-2018)."""
    from hbpe.pipeline.tokenizer import artifact
    from hbpe.pipeline.tokenizer.stats import read_texts
    from hbpe.training.bench_step import save_token_batches, token_rows

    tok = artifact.load("runs/demo/tokenizer")  # gpt2 + hierarchical BPE, S = 10 (`make demo`)
    texts, _ = read_texts([str(Path(__file__).resolve().parents[3] / "shared/data/en-sotu.jsonl.zst")])
    splits = {"train": [], "eval": []}
    for i, t in enumerate(texts):
        splits["eval" if i % eval_every == 0 else "train"].append(t)
    rows = {}
    for name, docs in splits.items():
        rows[name] = token_rows(tok, docs, seq_len)
        print(name, len(docs), "documents", rows[name].shape, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_token_batches(tok, rows, out)


def run(batches: Path, out: Path, *, budget_s: float = 380.0, seed: int = 0, bench_first: bool = True) -> None:
    import torch

    from hbpe.schemas.train_config import model_config
    from hbpe.training.bench_step import TokenBatches, train_steps

    start = time.perf_counter()
    dev = torch.device("cuda")
    data = TokenBatches(batches, dev)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "bench": [], "ladder": []}

    def save() -> None:
        out.write_text(json.dumps(results, indent=1))

    def bench(name: str, cfg, batch_size: int, steps: int) -> None:
        r = train_steps(cfg, data, steps=steps, batch_size=batch_size, lr=1e-3, peak_flops=H100_BF16_DENSE)
        results["bench"].append({"name": name, **r})
        print(json.dumps(results["bench"][-1]), flush=True)
        save()

    # 1. packed vs padded (and BPE) at the small size (97M) and at the crossover-mini sizes, bf16
    if bench_first:
        for layout in ("packed", "padded"):
            bench(f"small-{layout}", model_config("small", local_layout=layout), 64, 25)
        bench("small-bpe", model_config("small", io="bpe"), 64, 25)
        for layout in ("packed", "padded"):
            bench(f"mini-{layout}", model_config("tiny", **MINI, local_layout=layout), 64, 40)
        bench("mini-bpe", model_config("tiny", **MINI, io="bpe"), 64, 40)

    # 2. a width ladder at fixed data: BPE and BPE-patch (packed) at x1..x8 of the mini widths
    for mult in (1, 2, 4, 8):
        sizes = {**MINI, **{k: MINI[k] * mult for k in ("latent_dim", "latent_ffn", "local_dim", "local_ffn")}}
        for io in ("hierarchical", "bpe"):
            if time.perf_counter() - start > budget_s:
                results["stopped"] = f"budget of {budget_s:.0f} s reached before x{mult} {io}"
                save()
                return
            lr = 3e-3 / mult**0.5  # not tuned: the mini's 3e-3 scaled by 1/sqrt(width)
            r = train_steps(model_config("tiny", **sizes, io=io), data, steps=600, batch_size=64, lr=lr,
                            warmup=40, eval_rows=2048, peak_flops=H100_BF16_DENSE, seed=seed)  # fmt: skip
            results["ladder"].append({"width": mult, "seed": seed, **r})
            print(json.dumps(results["ladder"][-1]), flush=True)
            save()
    results["seconds"] = time.perf_counter() - start
    save()


def report(folder: Path) -> None:
    """table.md and ladder.png from every JSON in `folder`: the bench rows, and the ladder's gap per width."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bench, ladder, device = [], [], None
    for f in sorted(folder.glob("*.json")):
        r = json.loads(f.read_text())
        bench += r.get("bench", [])
        ladder += r.get("ladder", [])
        device = device or r.get("device")
    lines = [f"Device: {device}, bf16 autocast, batch 64 x 128 patches (gpt2 + S=10, en-sotu).", ""]
    lines += ["| run | params | KB/s of text | executed MFLOP/B | paper MFLOP/B | executed / paper | PAD share | MFU | peak GB |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in bench:
        lines.append(
            f"| {r['name']} | {r['params'] / 1e6:.2f}M | {r['bytes_per_sec'] / 1e3:.0f} | "
            f"{r['executed_flops_per_byte'] / 1e6:.2f} | {r['paper_flops_per_byte'] / 1e6:.2f} | "
            f"{r['executed_flops_per_byte'] / r['paper_flops_per_byte']:.2f} | {r['pad_share']:.1%} | "
            f"{r['mfu']:.1%} | {r['peak_memory_bytes'] / 1e9:.1f} |"
        )
    widths = sorted({r["width"] for r in ladder})
    rows = []
    for w in widths:
        by = {io: [r for r in ladder if r["width"] == w and r["io"] == io] for io in ("hierarchical", "bpe")}
        seeds = sorted({r.get("seed", 0) for r in by["hierarchical"]} & {r.get("seed", 0) for r in by["bpe"]})
        gaps = [
            next(r["bpb"] for r in by["hierarchical"] if r.get("seed", 0) == s)
            - next(r["bpb"] for r in by["bpe"] if r.get("seed", 0) == s)
            for s in seeds
        ]
        mean = {io: statistics.mean(r["bpb"] for r in rs) for io, rs in by.items()}
        spread = statistics.stdev(gaps) if len(gaps) > 1 else float("nan")
        rows.append((w, by["hierarchical"][0]["params"], by["bpe"][0]["params"], mean, gaps, spread))
    lines += ["", "| width | BPE-patch params | BPE params | BPE-patch BPB | BPE BPB | gap (mean ± std over seeds) | seeds |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for w, ph, pb, mean, gaps, spread in rows:
        lines.append(
            f"| x{w} | {ph / 1e6:.2f}M | {pb / 1e6:.2f}M | {mean['hierarchical']:.3f} | {mean['bpe']:.3f} | "
            f"{statistics.mean(gaps):+.3f} ± {spread:.3f} | {len(gaps)} |"
        )
    (folder / "table.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.errorbar([r[1] for r in rows], [statistics.mean(r[4]) for r in rows], yerr=[r[5] for r in rows], marker="o")
    ax.set_xscale("log")
    ax.set_xlabel("BPE-patch parameters")
    ax.set_ylabel("BPB(BPE-patch) - BPB(BPE)")
    ax.set_title(f"width ladder on {device}, 600 steps", fontsize=9)
    fig.tight_layout()
    fig.savefig(folder / "ladder.png", dpi=110)


if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(Path(sys.argv[2]))
    elif sys.argv[1] == "report":
        report(Path(sys.argv[2]))
    else:  # run BATCHES OUT [SEED]: with a seed, the ladder alone with that seed (init and data order)
        seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
        run(Path(sys.argv[2]), Path(sys.argv[3]), seed=seed, bench_first=len(sys.argv) <= 4)
