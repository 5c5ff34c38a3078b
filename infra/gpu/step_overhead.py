"""GPU check of the training step's overhead: the loader's tiles against the length blocks, padded and BPE.

Runs where torch and a GPU are but the pinned stack is not (a lent machine's image: no Composer), on the
.npz that infra/gpu/packed_and_ladder.py `prepare` writes (en-sotu rows, gpt2 + hierarchical S = 10). For
`small` and the crossover mini, BPE-patch (tiles, blocks, padded) and BPE, eager and with every block
compiled, at batch 64 x 128 and 256 x 128: text KB/s, MFU against the card's dense bf16 peak, peak memory,
CUDA kernels launched per step, and whether a step runs under `torch.cuda.set_sync_debug_mode("error")`.
One JSON, written after every measurement, so a run cut short by its budget keeps what it measured.

    python infra/gpu/step_overhead.py runs/gpu/batches.npz OUT.json [BUDGET_S]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: import hbpe from the tree
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its neighbour packed_and_ladder.py

from packed_and_ladder import MINI  # noqa: E402 (the crossover mini; beside this script, no omegaconf needed)

# dense bf16 peaks (NVIDIA's datasheets, SXM): MFU's denominator by the card's name
PEAKS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}
# (name, size, model overrides): the order is the priority when the budget runs out
VARIANTS = [
    ("tiles", dict(packed_attention="tiles")),  # what auto takes on a GPU
    ("bpe", dict(io="bpe")),
    ("blocks", dict(packed_attention="blocks")),
    ("padded", dict(local_layout="padded")),
]


MODELS = {"small": ("small", {}), "mini": ("tiny", MINI)}  # name -> (preset, overrides)
SHAPES = (("small", 64), ("small", 256), ("mini", 64), ("mini", 256))


def plan(shapes: tuple = SHAPES) -> list[dict]:
    """Every measurement, most telling first: small at 64 (compiled, then eager), then 256, then the mini."""
    runs = []
    for size, batch in shapes:
        for compiled in (True, False):
            for name, extra in VARIANTS:
                if compiled and name in ("blocks", "padded"):  # they recompile for every patch-length mix
                    continue
                runs.append(dict(size=size, batch=batch, compiled=compiled, name=name, extra=extra))
    return runs


def peak_flops(device_name: str) -> float | None:
    return next((v for k, v in PEAKS.items() if k in device_name), None)


def run(
    batches: Path,
    out: Path,
    *,
    budget_s: float = 330.0,
    device: str = "cuda",
    steps: int = 20,
    models: dict = MODELS,
    shapes: tuple = SHAPES,
) -> dict:
    import torch

    from hbpe.schemas.train_config import model_config
    from hbpe.training.bench_step import TokenBatches, train_steps

    start = time.perf_counter()
    dev = torch.device(device)
    data = TokenBatches(batches, dev)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    results = {"device": name, "torch": torch.__version__, "peak_bf16_flops": peak_flops(name), "runs": []}

    def save() -> None:
        tmp = out.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)  # a leftover file or link in its place is removed, never written through
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(out)

    for r in plan(shapes):
        if time.perf_counter() - start > budget_s:
            results["stopped"] = f"budget of {budget_s:.0f} s reached before {r['size']} {r['name']} {r['batch']}"
            break
        preset, sizes = models[r["size"]]
        cfg = model_config(preset, **sizes, **r["extra"])
        t = time.perf_counter()
        try:
            m = train_steps(cfg, data, steps=steps, batch_size=r["batch"], lr=1e-3, compile=r["compiled"],
                            compile_backend="inductor" if dev.type == "cuda" else "aot_eager",
                            peak_flops=results["peak_bf16_flops"], probe=True)  # fmt: skip
        except Exception as e:  # an out-of-memory at 256 or a compile failure is a finding, not the end of the run
            m = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        results["runs"].append(
            {**{k: v for k, v in r.items() if k != "extra"}, "seconds": time.perf_counter() - t, **m}
        )
        print(json.dumps(results["runs"][-1]), flush=True)
        save()
    results["seconds"] = time.perf_counter() - start
    save()
    return results


if __name__ == "__main__":
    run(Path(sys.argv[1]), Path(sys.argv[2]), budget_s=float(sys.argv[3]) if len(sys.argv) > 3 else 330.0)
