"""Every rung of the ladders in one table and one plot: `hbpe experiment summary FOLDER...`.

Each ladder experiment (ladder.py) reports its own pairs; the question of issue 29 is how the gap
and the data factor k move across all of them: with parameters (ladder-width, the paper's
proportions) and with tokens per parameter (ladder-data, a full pass). This reads the results.json
of finished experiments, takes each one's pairs (the BPE-patch run against the BPE run of its width)
and, for a sweep over widths, the tuned pairs (each kind at its best rate), and writes them side by
side. The files are read as untrusted: a bounded size, hbpe's format, numbers where numbers belong.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hbpe.experiments.ladder import tokens_trained
from hbpe.experiments.out_folder import RESULTS_FORMAT
from hbpe.experiments.spec import ExperimentSpec
from hbpe.schemas.errors import ConfigError

MAX_RESULTS_BYTES = 64 << 20  # a published ladder's results.json is 75-110 KB (the curves of every run and seed)
RUNGS_FILE, PLOT_FILE = "rungs.md", "rungs.png"


def read_results(folder: Path) -> dict[str, Any]:
    """FOLDER/results.json of a finished `hbpe experiment` (or that file itself), checked."""
    path = folder / "results.json" if folder.is_dir() else folder
    if not path.is_file():
        raise ConfigError(
            f"{path}: no results.json of a finished experiment here; pass the folder `hbpe experiment` wrote"
        )
    size = path.stat().st_size
    if size > MAX_RESULTS_BYTES:
        raise ConfigError(f"{path} is {size >> 20} MiB, over the {MAX_RESULTS_BYTES >> 20} MiB a results.json may be")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(
            f"{path} is not JSON ({type(e).__name__}); pass a results.json of `hbpe experiment`"
        ) from None
    if not isinstance(d, dict) or d.get("format") != RESULTS_FORMAT or not isinstance(d.get("spec"), dict):
        raise ConfigError(f"{path} was not written by `hbpe experiment` (no format {RESULTS_FORMAT!r})")
    return d


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _bound(b: Any) -> tuple[str, float] | None:
    """k's bound when BPE-patch's BPB lies outside BPE's curve: ("<=" or ">=", value)."""
    if isinstance(b, list) and len(b) == 2 and b[0] in ("<=", ">=") and _number(b[1]) is not None:
        return b[0], float(b[1])
    return None


def _params(rows: list[dict[str, Any]], name: str) -> float | None:
    row = next((r for r in rows if isinstance(r, dict) and r.get("name") == name), None)
    return _number(((row or {}).get("params") or {}).get("total"))


def rungs_of(d: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """The rungs of one experiment's results: its ladder pairs, and the tuned pairs of a sweep over widths."""
    name = str(d.get("experiment", source))
    out = []
    for p in (d.get("ladder") or {}).get("pairs") or []:
        if not isinstance(p, dict) or _number(p.get("gap")) is None or _number(p.get("params_b")) is None:
            raise ConfigError(f"{source}: a ladder pair without a gap or parameters: {str(p)[:120]}")
        out.append({
            "experiment": name, "kind": "equal width", "a": str(p["a"]), "b": str(p["b"]),
            "params_a": _number(p.get("params_a")), "params_b": _number(p["params_b"]),
            "tokens_per_param": _number(p.get("tokens_per_param")), "gap": _number(p["gap"]),
            "gap_std": _number(p.get("gap_std")), "eval_sd": _number(p.get("gap_eval_sd")),
            "k": _number(p.get("k")), "k_ci95": p.get("k_ci95") if isinstance(p.get("k_ci95"), list) else None,
            "k_bound": _bound(p.get("k_bound")),
        })  # fmt: skip
    tuned = d.get("tuned_by_width") or []
    if tuned:
        rows = d.get("rows") or []
        try:
            tokens = tokens_trained(ExperimentSpec.from_dict(d["spec"]))
        except (ConfigError, KeyError, TypeError) as e:
            raise ConfigError(f"{source}: its spec does not load ({e})") from None
        for t in tuned:
            if not isinstance(t, dict) or _number(t.get("gap")) is None:
                raise ConfigError(f"{source}: a tuned pair without a gap: {str(t)[:120]}")
            params_b = _params(rows, str(t.get("b")))
            out.append({
                "experiment": name, "kind": "tuned lr", "a": str(t.get("a")), "b": str(t.get("b")),
                "params_a": _params(rows, str(t.get("a"))), "params_b": params_b,
                "tokens_per_param": tokens / params_b if params_b else None, "gap": _number(t["gap"]),
                "gap_std": _number(t.get("gap_std")), "eval_sd": _number((t.get("eval_noise") or {}).get("sd")),
                "k": None, "k_ci95": None, "k_bound": None,
            })  # fmt: skip
    return out


def _cell(v: float | None, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def rungs_table(rungs: list[dict[str, Any]]) -> str:
    """Markdown: one line per rung, ordered by BPE-patch's parameters."""
    lines = [
        "Every rung: BPE-patch − BPE final BPB (± seeds' std; eval-sampling sd), data factor k [95%] (BPE reaches "
        "BPE-patch's BPB on k times its text), by BPE-patch's parameters:",
        "",
        "| experiment | pair | compared | params BPE / BPE-patch | tokens per parameter | gap | eval sd | k [95%] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rungs, key=lambda r: (r["params_b"] or 0, r["experiment"])):
        gap = f"{r['gap']:+.3f}" + (f" ± {r['gap_std']:.4f}" if r["gap_std"] is not None else "")
        k = _cell(r["k"], ".3g")
        if r["k"] is None and r["k_bound"]:  # BPE-patch's BPB outside BPE's curve: only bounded
            k = f"{'≤' if r['k_bound'][0] == '<=' else '≥'} {r['k_bound'][1]:.3g}"
        if r["k"] is not None and r["k_ci95"] and len(r["k_ci95"]) == 2:
            k += f" [{r['k_ci95'][0]:.3g}, {r['k_ci95'][1]:.3g}]"
        pa = "–" if r["params_a"] is None else f"{r['params_a'] / 1e6:.2f}M"
        lines.append(
            f"| {r['experiment']} | {r['b']} − {r['a']} | {r['kind']} | {pa} / {r['params_b'] / 1e6:.2f}M | "
            f"{_cell(r['tokens_per_param'], '.3g')} | {gap} | {_cell(r['eval_sd'], '.3f')} | {k} |"
        )
    return "\n".join(lines) + "\n"


def write_summary(folders: list[Path], out: Path) -> dict[str, Any]:
    """rungs.md and rungs.png in `out` from the experiments in `folders` -> {rungs, table, files}."""
    rungs = []
    for f in folders:
        rungs += rungs_of(read_results(f), str(f))
    if not rungs:
        raise ConfigError("none of these experiments has ladder pairs; pass the folders of ladder-* or lr-sweep-width")
    out.mkdir(parents=True, exist_ok=True)
    for name in (RUNGS_FILE, PLOT_FILE):  # written in place: never through a link, never over a folder or device
        target = out / name
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise ConfigError(f"{target} is a link or not a regular file; move it away or pass another --out")
    table = rungs_table(rungs)
    (out / RUNGS_FILE).write_text(table)
    _plot(rungs, out / PLOT_FILE)
    return {"rungs": rungs, "table": table, "files": [str(out / RUNGS_FILE), str(out / PLOT_FILE)]}


def _plot(rungs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    groups = dict.fromkeys((r["experiment"], r["kind"]) for r in rungs)
    for i, (name, kind) in enumerate(groups):  # one colour and marker per experiment, the same in every panel
        style = {"marker": "osD^v<>ph*"[i % 10], "color": f"C{i % 10}"}
        rs = sorted((r for r in rungs if (r["experiment"], r["kind"]) == (name, kind)), key=lambda r: r["params_b"])
        label = name if kind == "equal width" else f"{name} ({kind})"
        for col, key in ((0, "params_b"), (1, "tokens_per_param")):
            xs = [r[key] / (1e6 if key == "params_b" else 1) if r[key] else math.nan for r in rs]
            axes[0][col].errorbar(xs, [r["gap"] for r in rs], yerr=[r["gap_std"] or 0 for r in rs], capsize=3,
                                  label=label, **style)  # fmt: skip
            ks = [(x, r) for x, r in zip(xs, rs, strict=True) if r["k"] is not None]
            if ks:
                lo = [r["k"] - (r["k_ci95"] or [r["k"], r["k"]])[0] for _, r in ks]
                hi = [(r["k_ci95"] or [r["k"], r["k"]])[1] - r["k"] for _, r in ks]
                axes[1][col].errorbar([x for x, _ in ks], [r["k"] for _, r in ks], yerr=[lo, hi], capsize=3,
                                      label=label, **style)  # fmt: skip
    for col, xlabel in ((0, "BPE-patch parameters (M)"), (1, "first-stage tokens per BPE-patch parameter")):
        axes[0][col].axhline(0, color="black", linewidth=0.8)
        axes[0][col].set(xscale="log", xlabel=xlabel, ylabel="BPB gap, BPE-patch − BPE (> 0: BPE ahead)")
        axes[1][col].axhline(1, color="black", linewidth=0.8)
        axes[1][col].set(xscale="log", yscale="log", xlabel=xlabel, ylabel="data factor k (< 1: BPE needs less data)")
    axes[0][0].legend(fontsize=7)
    axes[0][0].set_title("the gap at the end of each rung", fontsize=9)
    axes[1][0].set_title("data factor k at the end of each rung", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
