"""Training compute as a run really spends it, two ways, and the paper's 8,192-byte convention beside them.

- paper count at the run's own context: the SPEC's formula (Chinchilla's appendix F, two MLP
  matrices) for Y = the text bytes one training sample covers as trained (about 680 bytes for
  128 gpt2 tokens), times 3 for forward + backward. The paper's Table 1 fixes Y = 8,192; at a
  mini width attention dominates, so that convention charges a byte-level run 112 GFLOPs per
  8 KB where its real 680-byte context costs about 15 per 8 KB' worth of text.
- executed: what each training step computes (training/model/flops.py `batch_train_flops`, as
  the Composer model's `flops_per_batch` counts it for MFU): SwiGLU's three matrices, the local
  models' positions as `model.local_layout` runs them (packed: the real symbols; padded: all S
  of every patch), attention at each batch's real lengths, forward + backward (3x forward).
  Counted batch by batch (lengths vary); `pad_share_executed` is the part spent on PAD.

Worked example, the table1-mini rows (gpt2, width 96, 128 tokens = 658 bytes per sample):
BPE / BPE-patch cost 2.53x under the 8,192-byte convention, 3.76x under the paper's count at
658 bytes (the 50K-row head dominates once attention is short), and 1.58x as executed (the
local models run all 10 positions of every patch with three MLP matrices).

Neither counts the entropy model that cuts an entropy run's patches in the data loader, nor
held-out evaluation.
"""

from __future__ import annotations

from typing import Any

from composer import State

from hbpe.schemas.train_config import ModelConfig
from hbpe.training import table1_row
from hbpe.training.train.callbacks import batch_flops


def paper_train_flops_per_byte(row: dict[str, Any]) -> float:
    """Training FLOPs per byte of text under the paper's count, from a `table1_row` at the run's own context.

    >>> paper_train_flops_per_byte({"gflops": {"total": 1.0}, "input_bytes": 500})  # 3 * 1e9 / 500
    6000000.0
    """
    return 3.0 * row["gflops"]["total"] * 1e9 / row["input_bytes"]


def context_row(cfg: ModelConfig, tok: Any, stats: Any, *, train_bytes: int, samples: int) -> dict[str, Any]:
    """`table1_row` at the run's own context: Y = the text bytes per training sample as trained."""

    return table1_row(cfg, tok, stats, input_bytes=train_bytes / max(samples, 1))


def executed_batch_flops(state: State) -> dict[str, float]:
    """{executed, pad}: training FLOPs of the batch just trained and their PAD part (the Composer model's
    `batch_flops`, whose executed figure is `flops_per_batch`).

    Composer puts the whole batch back into `state.batch` after its microbatches, so at
    BATCH_END this is the full batch.
    """
    return batch_flops(state)
