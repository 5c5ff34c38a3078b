"""A GPU rung for k: BPE vs BPE-patch at ~2M parameters, 20 tokens per parameter, in under 7 minutes.

Models this small leave a GPU idle, so the four runs (BPE and BPE-patch, each at lr 1e-3 and 3e-3) train at once,
one process each. Plain PyTorch (a lent machine's image has torch and no Composer): the model, loss and FLOP count
of hbpe's library, the experiments' fair objective (summed NLL over the batch's target bytes) and decay rule (every
matrix, embeddings too), AdamW, linear warm-up, a constant rate, and a linear cooldown to 0 over the last 10%.

Sizes (RUNG): the paper's proportions at 2M: latent 6 x 128 (FFN 344), 4K first-stage embedding 0.52M = 0.44 of
the latent (the paper's small model: 0.45), local models 64 wide (0.2 of the latent), 3 + 3 layers; BPE 1.7M,
BPE-patch 1.4M parameters. 20 tokens per BPE-patch parameter = 28M tokens at batch 128 x 128 (1,730 steps), about
3 passes over the training split of en-sotu + en-open-docs (9.2M tokens at the 4K first stage): more text than
that is not at hand, and the table says so. Eval: 64 blocks of 16 rows spread over the held-out split (about
470 KB), every one of 20 curve points and the final one storing per-block NLL and bytes, so `hbpe experiment
k-along` reads k, its slope and the gap with document-bootstrap intervals from the results.json `report` writes.

    python infra/gpu/k_rung.py prepare runs/gpu-k/rows.npz [EXPERIMENT_DATA]   # here: the k-along data's split
    python infra/gpu/k_rung.py run runs/gpu-k/rows.npz OUT_DIR                  # on the GPU: 4 processes, <= 7 min
    python infra/gpu/k_rung.py report OUT_DIR                                   # results.json, k_rung.md, k-along

Support for the paper's level (the criteria set with k-along-training): k >= 0.7 and gap <= +0.05 at the end (best rate against best rate);
against: k <= 0.25 and gap >= +0.2. Each run's JSON is written after every curve point: a run cut short by the
time budget keeps what it measured, and says so.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: import hbpe from the tree

RUNG = dict(latent_layers=6, latent_dim=128, latent_ffn=344, latent_heads=4, local_dim=64, local_ffn=128,
            local_heads=4, encoder_layers=3, decoder_layers=3)  # fmt: skip
RATES = (1e-3, 3e-3)
RUNS = tuple(
    (f"{name}-lr{lr:g}", io, lr) for name, io in (("bpe", "bpe"), ("bpe-patch", "hierarchical")) for lr in RATES
)
TOKENS_PER_PARAM = 20
BATCH, SEQ_LEN, WARMUP, COOLDOWN = 128, 128, 100, 0.1
CURVE_POINTS, EVAL_BLOCKS, BLOCK_ROWS = 20, 64, 16
BUDGET_S = 400.0  # every process stops training here (evaluating what it has), under the 7 minutes asked
SUPPORT = {"k": 0.7, "gap": 0.05}
AGAINST = {"k": 0.25, "gap": 0.2}


def prepare(out: Path, data: Path, tokenizer: Path | None = None) -> None:
    """Token rows of the k-along-training data (`data`: an experiment's data folder, with corpus/ and v4096/;
    `tokenizer`: another tokenizer folder than its v4096/tokenizer)."""
    from hbpe.pipeline.tokenizer import artifact
    from hbpe.pipeline.tokenizer.stats import read_texts
    from hbpe.training.bench_step import save_token_batches, token_rows

    tok = artifact.load(str(tokenizer or data / "v4096" / "tokenizer"))
    rows = {}
    for split in ("train", "eval"):
        texts, _ = read_texts([str(data / "corpus" / f"{split}.jsonl")])
        rows[split] = token_rows(tok, texts, SEQ_LEN)
        print(split, len(texts), "documents", rows[split].shape, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_token_batches(tok, rows, out)


def eval_set(rows: Any, blocks: int, block_rows: int) -> list[list[int]]:
    """[[first row, rows, document, 0], ...]: blocks spread over the held-out rows (eval_set.eval_blocks), each
    attributed to the document its middle row starts in (documents counted by EOD tokens, EOD < 0)."""
    import numpy as np

    from hbpe.training.data.eval_set import eval_blocks

    eods = (np.asarray(rows)[:, :-1] < 0).sum(1)  # the last column is the next row's first token
    doc = np.concatenate([[0], np.cumsum(eods)[:-1]])  # EODs before each row
    return [[s, n, int(doc[s + n // 2]), 0] for s, n in eval_blocks(len(doc), blocks * block_rows, block_rows)]


def lr_factor(step: int, steps: int, warmup: int = WARMUP, cooldown: float = COOLDOWN) -> float:
    """Linear warm-up, constant, then linear to 0 over the last `cooldown` of the steps.

    >>> [round(lr_factor(s, 100, 10, 0.1), 2) for s in (0, 9, 50, 90, 95, 99)]
    [0.1, 1.0, 1.0, 1.0, 0.5, 0.1]
    """
    if step < warmup:
        return (step + 1) / warmup
    start = steps - int(round(cooldown * steps))
    return 1.0 if step < start else (steps - step) / max(steps - start, 1)


def train_one(npz: Path, out: Path, name: str, io: str, lr: float, *, sizes: dict[str, int], batch: int,
              tokens_per_param: float, budget_s: float, seed: int = 0, curve_points: int = CURVE_POINTS,
              eval_blocks: int = EVAL_BLOCKS, block_rows: int = BLOCK_ROWS) -> dict[str, Any]:  # fmt: skip
    """One run: train, evaluate at CURVE_POINTS points and at the end, write `out` after every point."""
    import torch

    from hbpe.schemas.train_config import model_config
    from hbpe.training.bench_step import TokenBatches
    from hbpe.training.model.build import build_model
    from hbpe.training.model.patch_io import cross_entropy_sum
    from hbpe.training.train.optimizer import param_groups

    start = time.perf_counter()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = TokenBatches(npz, dev)
    torch.manual_seed(seed)
    model = build_model(model_config("tiny", **sizes, io=io), data.spec).to(dev)
    params = sum(p.numel() for p in model.parameters())
    groups = param_groups(model, 0.1, decay_embeddings=True)  # the experiments' rule (FAIR_TRAINING)
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=dev.type == "cuda")
    n = data.rows["train"].shape[0]
    seq = data.rows["train"].shape[1] - 1
    # tokens per BPE-patch parameter: every run reads the same rows (the pair's budget), set by the BPE-patch model
    bp = sum(p.numel() for p in build_model(model_config("tiny", **sizes, io="hierarchical"), data.spec).parameters())
    steps = max(int(math.ceil(tokens_per_param * bp / (batch * seq))), 1)
    every = max(steps // curve_points, 1)
    blocks = eval_set(data.rows["eval"].cpu().numpy(), eval_blocks, block_rows)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    per_pass = n // batch  # steps per pass over the training rows; each pass in its own order
    run = {"name": name, "seed": seed, "lr": lr, "first_stage": "v4096", "io": io, "fingerprint": f"{name}-{seed}",
           "params": {"total": params}, "steps": steps, "batch": batch, "device": str(dev), "curve": [],
           "eval_blocks": blocks, "passes": steps / per_pass}  # fmt: skip
    order = None
    train_bytes = torch.zeros((), dtype=torch.long, device=dev)  # on the device: no host sync per step

    def evaluate(step: int) -> None:
        model.eval()
        nll, nbytes = [], []
        with torch.no_grad():
            for s, k, _, _ in blocks:
                b = data.batch("eval", torch.arange(s, s + k, device=dev))
                with amp:
                    logits, targets = model(b)
                nll.append(float(cross_entropy_sum(logits.float(), targets)))
                nbytes.append(int(b["target_bytes"].sum()))
        model.train()
        run["curve"].append({"batch": step, "train_bytes": int(train_bytes), "bpb": sum(nll) / math.log(2) / sum(nbytes),
                             "eval_batch_nll": nll, "eval_batch_bytes": nbytes})  # fmt: skip
        run["seconds"] = time.perf_counter() - start
        out.write_text(json.dumps(run))

    done = steps
    for step in range(steps):
        if time.perf_counter() - start > budget_s:
            run["stopped"] = f"time budget of {budget_s:.0f} s reached at step {step} of {steps}"
            done = step
            break
        for group in opt.param_groups:
            group["lr"] = lr * lr_factor(step, steps)
        if step % per_pass == 0:  # a new pass, in an order of its own (the same for every run of this seed)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + step // per_pass))
        j = step % per_pass * batch
        b = data.batch("train", order[j : j + batch].to(dev))
        with amp:
            logits, targets = model(b)
        target_bytes = b["target_bytes"].sum()
        loss = cross_entropy_sum(logits.float(), targets) / target_bytes.clamp_min(1)  # the fair objective
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        train_bytes += target_bytes
        if (step + 1) % every == 0 and step + 1 < steps:
            evaluate(step + 1)
    if done and (not run["curve"] or run["curve"][-1]["batch"] != done):
        evaluate(done)
    return run


def run_all(npz: Path, out: Path, **settings: Any) -> list[dict[str, Any]]:
    """The four runs at once, one process each; their JSON files in `out`. `settings`: train_one's keywords
    (sizes, batch, tokens_per_param, budget_s, curve_points, ...) over the rung's."""
    out.mkdir(parents=True, exist_ok=True)
    settings = {"sizes": RUNG, "batch": BATCH, "tokens_per_param": TOKENS_PER_PARAM, "budget_s": BUDGET_S, **settings}
    procs = [subprocess.Popen([sys.executable, __file__, "one", str(npz), str(out / f"{name}.json"), name, io,
                               str(lr), json.dumps(settings)]) for name, io, lr in RUNS]  # fmt: skip
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"runs ended with {codes}; their JSON files hold what they measured")
    return [json.loads((out / f"{name}.json").read_text()) for name, _, _ in RUNS]


def report(folder: Path) -> dict[str, Any]:
    """results.json (k_along's input), and k_rung.md: final BPB per run, the best-against-best gap and k, and the
    criteria. `hbpe experiment k-along FOLDER` reads the same results.json for the intervals."""
    from hbpe.experiments import k_along

    runs = [
        json.loads((folder / f"{name}.json").read_text()) for name, _, _ in RUNS if (folder / f"{name}.json").is_file()
    ]
    if not runs:
        raise SystemExit(f"no run JSON in {folder}")
    best = {
        io: min((r for r in runs if r["io"] == io), key=lambda r: r["curve"][-1]["bpb"])
        for io in ("bpe", "hierarchical")
    }
    named = {id(best["bpe"]): "bpe", id(best["hierarchical"]): "bpe-patch"}  # the pair k_along reads
    results = {
        "spec": {"global_batch_size": runs[0]["batch"], "seq_len": SEQ_LEN, "batches": runs[0]["steps"]},
        "runs": [{**r, "name": named.get(id(r), r["name"]), "run": r["name"]} for r in runs],
        "eval_set": {"v4096": {"blocks": runs[0]["eval_blocks"]}},
        "k_along_pair": ["bpe", "bpe-patch"],  # best rate against best rate
    }
    (folder / "results.json").write_text(json.dumps(results, indent=1))
    analysis = k_along.analyse([results], a_name="bpe", b_name="bpe-patch", readout=(5, 10, 20))
    end = analysis["points"][-1]
    k, gap = end["k"], end["gap"]
    if k is not None and k >= SUPPORT["k"] and gap <= SUPPORT["gap"]:
        reading = "supports the paper's level"
    elif k is not None and k <= AGAINST["k"] and gap >= AGAINST["gap"]:
        reading = "against the paper's level"
    else:
        reading = "between the two levels"
    lines = ["| run | params | lr | final BPB | passes |", "|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['params']['total'] / 1e6:.2f}M | {r['lr']:g} | {r['curve'][-1]['bpb']:.4f} | "
              f"{r.get('passes', 0):.2f}{' (stopped early)' if 'stopped' in r else ''} |" for r in runs]  # fmt: skip
    lines += ["", f"Best against best: gap {gap:+.4f}, k {'–' if k is None else f'{k:.3f}'} at the end: **{reading}** "
              f"(support: k >= {SUPPORT['k']} and gap <= +{SUPPORT['gap']}; against: k <= {AGAINST['k']} and gap >= "
              f"+{AGAINST['gap']})."]  # fmt: skip
    (folder / "k_rung.md").write_text("\n".join(lines) + "\n")
    return {"analysis": analysis, "reading": reading}


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "prepare":
        prepare(Path(sys.argv[2]), Path(sys.argv[3] if len(sys.argv) > 3 else "runs/k-along/bpe17/data"))
    elif cmd == "run":
        run_all(Path(sys.argv[2]), Path(sys.argv[3]))
        print(json.dumps(report(Path(sys.argv[3]))["reading"]))
    elif cmd == "report":
        print(json.dumps(report(Path(sys.argv[2]))["reading"]))
    elif cmd == "one":  # one run: NPZ OUT NAME IO LR SETTINGS (JSON)
        npz, out, name, io, lr, settings = sys.argv[2:8]
        train_one(Path(npz), Path(out), name, io, float(lr), **json.loads(settings))
    else:
        raise SystemExit(f"unknown command {cmd!r}: prepare, run, report")
