"""Every rung of the ladders in one table and one plot: `hbpe experiment summary FOLDER...`.

Each ladder experiment (ladder.py) reports its own pairs; the question of issue 29 is how the gap
and the data factor k move across all of them: with parameters (ladder-width, the paper's
proportions) and with tokens per parameter (ladder-data, a full pass). This reads the results.json
of finished experiments, takes each one's pairs (the BPE-patch run against the BPE run of its width)
and, for a sweep over widths, the tuned pairs (each kind at its best rate), and writes them side by
side. The files are read as untrusted: a bounded size, hbpe's format, numbers where numbers belong and in
the ranges a finished experiment writes (else one error naming the file, the entry and the key). Both files
are made before either is written, then renamed into place: a failure leaves the output folder as it was.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

from hbpe.experiments.ladder import tokens_trained
from hbpe.experiments.out_folder import RESULTS_FORMAT
from hbpe.experiments.spec import ExperimentSpec
from hbpe.schemas.errors import ConfigError

MAX_RESULTS_BYTES = 64 << 20  # a published ladder's results.json is 75-110 KB (the curves of every run and seed)
RUNGS_FILE, PLOT_FILE = "rungs.md", "rungs.png"
MAX_NAME = 200  # characters of an experiment's or a run's name (the legend draws each)


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


# What each number of a rung may be: a finished experiment writes values well inside these ranges (a BPB gap of a
# few bits, models of millions of parameters, k near 1), and the plot's log axes need the positive ones positive.
_RANGES = {
    "gap": (-100.0, 100.0),  # BPB: 8 is a uniform guess over bytes
    "spread": (0.0, 100.0),  # a standard deviation of BPB (seeds', eval sampling)
    "params": (1.0, 1e15),
    "tokens_per_param": (1e-9, 1e9),
    "k": (1e-9, 1e9),  # a ratio of bytes or FLOPs
}


def _number(v: Any) -> float | None:
    """A JSON number as a finite float; None for anything else (a string, a bool, NaN, an integer past float's range)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:  # an integer of hundreds of digits
        return None
    return f if math.isfinite(f) else None


def _shown(v: Any) -> str:
    """A value as an error message quotes it: short, whatever its size."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**20:
        return f"an integer of {len(str(abs(v)))} digits"
    text = json.dumps(v) if isinstance(v, (dict, list, str)) else repr(v)
    return text if len(text) <= 60 else text[:60] + "…"


def _field(d: dict[str, Any], key: str, kind: str, where: str, *, required: bool = False) -> float | None:
    """d[key] as a float within _RANGES[kind]; None when absent (null) and not required; ConfigError naming
    `where` (the file and the entry) and the key otherwise."""
    v = d.get(key)
    if v is None and not required:
        return None
    return _in_range(v, kind, f"{where}.{key}")


def _in_range(v: Any, kind: str, where: str) -> float:
    lo, hi = _RANGES[kind]
    f = _number(v)
    if f is None or not lo <= f <= hi:
        raise ConfigError(
            f"{where} is {_shown(v)}: expected a number in [{lo:g}, {hi:g}]; this results.json was damaged or "
            "edited: pass the one `hbpe experiment` wrote"
        )
    return f


def _object(v: Any, where: str, expected: type) -> Any:
    """v when it is a dict (or list, as `expected` says), the empty one for null; ConfigError naming `where`."""
    if v is None:
        return expected()
    if not isinstance(v, expected):
        what = "an object" if expected is dict else "a list"
        raise ConfigError(
            f"{where} is {_shown(v)}: expected {what} (or null); pass the results.json `hbpe experiment` wrote"
        )
    return v


def _name(v: Any, where: str, what: str = "a run of the experiment") -> str:
    """A name the table and the plot's legend show: a string of at most MAX_NAME characters."""
    if not isinstance(v, str) or not 0 < len(v) <= MAX_NAME:
        raise ConfigError(f"{where} is {_shown(v)}: expected the name of {what} (1 to {MAX_NAME} characters)")
    return v


def _k_interval(v: Any, k: float | None, where: str) -> list[float] | None:
    """k's 95% interval [lo, hi] around k; None when there is none (one seed) or no k."""
    if v is None or k is None:
        return None
    if not isinstance(v, list) or len(v) != 2:
        raise ConfigError(f"{where} is {_shown(v)}: expected [low, high] of k's 95% interval, or null")
    lo, hi = (_in_range(x, "k", f"{where}[{i}]") for i, x in enumerate(v))
    if not lo <= k <= hi:
        raise ConfigError(f"{where} is {_shown(v)}: it does not hold k = {k:g}; expected low <= k <= high")
    return [lo, hi]


def _bound(b: Any, where: str) -> tuple[str, float] | None:
    """k's bound when BPE-patch's BPB lies outside BPE's curve: ("<=" or ">=", value)."""
    if b is None:
        return None
    if not isinstance(b, list) or len(b) != 2 or b[0] not in ("<=", ">="):
        raise ConfigError(f'{where} is {_shown(b)}: expected ["<=" or ">=", a number], or null')
    return b[0], _in_range(b[1], "k", f"{where}[1]")


def _params(rows: list[Any], name: str) -> float | None:
    row = next((r for r in rows if isinstance(r, dict) and r.get("name") == name), None)
    params = (row or {}).get("params")
    total = _number(params.get("total")) if isinstance(params, dict) else None
    return total if total is not None and _RANGES["params"][0] <= total <= _RANGES["params"][1] else None


def _ladder_rung(p: Any, name: str, where: str) -> dict[str, Any]:
    """One pair of `ladder.pairs`, every number checked (ConfigError naming `where` and the key)."""
    if not isinstance(p, dict):
        raise ConfigError(f"{where} is {_shown(p)}: expected a ladder pair (an object with a gap and parameters)")
    a, b, k = _name(p.get("a"), f"{where}.a"), _name(p.get("b"), f"{where}.b"), _field(p, "k", "k", where)
    return {
        "experiment": name, "kind": "equal width", "a": a, "b": b,
        "params_a": _field(p, "params_a", "params", where),
        "params_b": _field(p, "params_b", "params", where, required=True),
        "tokens_per_param": _field(p, "tokens_per_param", "tokens_per_param", where),
        "gap": _field(p, "gap", "gap", where, required=True), "gap_std": _field(p, "gap_std", "spread", where),
        "eval_sd": _field(p, "gap_eval_sd", "spread", where), "k": k,
        "k_ci95": _k_interval(p.get("k_ci95"), k, f"{where}.k_ci95"),
        "k_bound": _bound(p.get("k_bound"), f"{where}.k_bound"),
    }  # fmt: skip


def _tuned_rung(t: Any, name: str, rows: list[Any], tokens: float, where: str) -> dict[str, Any]:
    """One pair of `tuned_by_width` (each kind at its best rate), its parameters from the report's rows."""
    if not isinstance(t, dict):
        raise ConfigError(f"{where} is {_shown(t)}: expected a tuned pair (an object with a gap)")
    a, b = _name(t.get("a"), f"{where}.a"), _name(t.get("b"), f"{where}.b")
    params_b = _params(rows, b)
    if params_b is None:
        raise ConfigError(f"{where}.b is {b!r}: no row of that name with params.total in [1, 1e15]")
    noise = _object(t.get("eval_noise"), f"{where}.eval_noise", dict)
    return {
        "experiment": name, "kind": "tuned lr", "a": a, "b": b, "params_a": _params(rows, a), "params_b": params_b,
        "tokens_per_param": tokens / params_b, "gap": _field(t, "gap", "gap", where, required=True),
        "gap_std": _field(t, "gap_std", "spread", where), "eval_sd": _field(noise, "sd", "spread", f"{where}.eval_noise"),
        "k": None, "k_ci95": None, "k_bound": None,
    }  # fmt: skip


def rungs_of(d: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """The rungs of one experiment's results: its ladder pairs, and the tuned pairs of a sweep over widths.

    `source` names the file in errors; every number is checked (a ConfigError names the entry and its key)."""
    name = _name(d["experiment"], f"{source}: experiment", "an experiment") if "experiment" in d else source
    ladder = _object(d.get("ladder"), f"{source}: ladder", dict)
    pairs = _object(ladder.get("pairs"), f"{source}: ladder.pairs", list)
    out = [_ladder_rung(p, name, f"{source}: ladder.pairs[{i}]") for i, p in enumerate(pairs)]
    tuned = _object(d.get("tuned_by_width"), f"{source}: tuned_by_width", list)
    if tuned:
        rows = _object(d.get("rows"), f"{source}: rows", list)
        try:
            tokens = tokens_trained(ExperimentSpec.from_dict(d["spec"]))
        except (ConfigError, KeyError, TypeError) as e:
            raise ConfigError(f"{source}: its spec does not load ({e})") from None
        out += [_tuned_rung(t, name, rows, tokens, f"{source}: tuned_by_width[{i}]") for i, t in enumerate(tuned)]
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
    """rungs.md and rungs.png in `out` from the experiments in `folders` -> {rungs, table, files}.

    Both are made before either is written, and each is written to a temporary file renamed over its name only
    once both are on disk: a damaged results.json or a failing write leaves `out` as it was."""
    rungs = []
    for f in folders:
        rungs += rungs_of(read_results(f), str(f / "results.json" if f.is_dir() else f))
    if not rungs:
        raise ConfigError("none of these experiments has ladder pairs; pass the folders of ladder-* or lr-sweep-width")
    for name in (RUNGS_FILE, PLOT_FILE):  # written in place: never through a link, never over a folder or device
        target = out / name
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise ConfigError(f"{target} is a link or not a regular file; move it away or pass another --out")
    table = rungs_table(rungs)
    png = _plot(rungs)
    out.mkdir(parents=True, exist_ok=True)
    _write_both(out, {RUNGS_FILE: table.encode(), PLOT_FILE: png})
    return {"rungs": rungs, "table": table, "files": [str(out / RUNGS_FILE), str(out / PLOT_FILE)]}


def _write_both(out: Path, files: dict[str, bytes]) -> None:
    """Each file to a temporary name in `out`, then renamed over its own: none of them unless all were written."""
    temps: dict[str, Path] = {}
    try:
        for name, data in files.items():
            temps[name] = out / f".{name}.{secrets.token_hex(6)}.tmp"
            # O_EXCL: a new file of its own, never through a link planted under that name; 0o666 less the umask
            fd = os.open(temps[name], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        for name, tmp in temps.items():
            os.replace(tmp, out / name)
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)


def _plot(rungs: list[dict[str, Any]]) -> bytes:
    """The PNG of the rungs: the gap and k against parameters and against tokens per parameter."""
    import io

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
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()
