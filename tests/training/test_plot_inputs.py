"""`hbpe plot` on a damaged or hostile metrics.jsonl, and where it writes (issue 28). Before: a `\\xff` byte was an
internal UnicodeDecodeError, a deeply nested line a RecursionError, a BPB of 1e308 matplotlib's ValueError, lines
whose batch is 1e300 "no train or eval lines yet", `--out RUN/hbpe_run.json` an internal ValueError, and
`--out DIR` printed "wrote DIR" but wrote DIR.png."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.training.train import metrics_file
from hbpe.training.train.metrics_file import read_metrics
from tests.helpers import cli_fails

PNG = b"\x89PNG\r\n\x1a\n"


def _line(kind: str, batch, **values) -> bytes:
    return json.dumps({"kind": kind, "batch": batch, "samples": 4 * batch, "bytes": 500 * batch, **values}).encode()


def _good_lines() -> list[bytes]:
    """A 4-batch run evaluated at 2 and 4, as MetricsFile writes it."""
    lines = [json.dumps({"kind": "start", "batch": 0, "time": 1.0, "world_size": 1}).encode()]
    for b in range(1, 5):
        lines.append(_line("train", b, **{"loss/train/total": 6.0 - b / 4, "metrics/train/BitsPerByte": 4.0 - b / 8}))
        if b % 2 == 0:
            lines.append(_line("eval", b, **{"metrics/eval/LossPerSymbol": 5.0, "metrics/eval/BitsPerByte": 3.5}))
    return lines


DAMAGED = [
    b'{"kind": "train", "batch": 5, "loss/train/total": 1.0\xff}',  # not UTF-8
    b"[" * 100_000 + b"]" * 100_000,  # RecursionError in json
    b'{"kind": "train", "batch": 5, "loss/train/total": 1.0,',  # not JSON
    _line("train", 6, **{"metrics/train/BitsPerByte": 1e308}),  # matplotlib could not lay out its ticks
    b'{"kind": "train", "batch": 7, "loss/train/total": NaN}',  # json reads NaN
    _line("eval", 8, **{"metrics/eval/BitsPerByte": -2.0}),
    b'{"kind": "train", "batch": 1e300}',
    b'{"kind": "train", "batch": true}',
    b"[1, 2]",
]


@pytest.fixture
def damaged_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    good = _good_lines()
    lines = good[:3] + DAMAGED + good[3:]
    (run / "metrics.jsonl").write_bytes(b"\n".join(lines) + b"\n" + b'{"kind": "train", "batch": 9, "lo')
    return run


def test_damaged_lines_are_skipped_and_counted(damaged_run, tmp_path):
    path = damaged_run / "metrics.jsonl"
    data = read_metrics(str(path))
    assert [r["batch"] for r in data["train"]] == [1, 2, 3, 4] and [r["batch"] for r in data["eval"]] == [2, 4]
    expected = {"not UTF-8": 1, "nested too deep": 1, "not JSON": 1, "value out of range": 5, "not a JSON object": 1}
    assert data["skipped"] == {**expected, "cut short": 1}
    out = tmp_path / "c.png"
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(damaged_run), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert (summary["train_points"], summary["eval_points"], summary["last_batch"]) == (4, 2, 4)
    assert summary["skipped_lines"] == {**expected, "cut short": 1}
    assert out.read_bytes()[:8] == PNG
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(damaged_run), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[1] == (
        f"skipped 10 lines of {path} (not UTF-8: 1, nested too deep: 1, not JSON: 1, value out of range: 5, "
        "not a JSON object: 1, cut short: 1)"
    )


def test_a_file_of_unusable_lines_is_one_error_naming_them(tmp_path):
    path = tmp_path / "metrics.jsonl"
    # the batch of every line out of range: before, "holds no train or eval lines yet"
    path.write_text(
        "".join(json.dumps({"kind": "train", "batch": 1e300, "loss/train/total": 1.0}) + "\n" for _ in range(183))
    )
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(path)])
    cli_fails(r, 2, f"{path} holds no usable train or eval line: skipped 183 lines (value out of range: 183)")
    path.write_bytes(b"\xff\n" * 3)
    cli_fails(CliRunner().invoke(main, ["plot", "--checkpoint", str(path)]), 2, "skipped 3 lines (not UTF-8: 3)")
    path.write_text("")
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(path)])
    cli_fails(r, 2, f"{path} holds no train or eval lines yet; plot it once the run has trained a batch")
    assert not (tmp_path / "curves.png").exists()


def test_a_long_line_and_a_large_file_are_bounded(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    good = _good_lines()
    long_line = b'{"kind": "train", "batch": 5, "x": "' + b"a" * (metrics_file.MAX_LINE_BYTES + 10) + b'"}'
    (run / "metrics.jsonl").write_bytes(b"\n".join([*good[:2], long_line, *good[2:]]) + b"\n")
    data = read_metrics(str(run / "metrics.jsonl"))
    assert data["skipped"] == {"too long": 1} and [r["batch"] for r in data["train"]] == [1, 2, 3, 4]
    monkeypatch.setattr(metrics_file, "MAX_FILE_BYTES", 1000)
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(run)])
    cli_fails(r, 2, f"{run / 'metrics.jsonl'} is {(run / 'metrics.jsonl').stat().st_size} bytes, more than hbpe reads")


@pytest.mark.parametrize("name", ["hbpe_run.json", "ep0-ba4-rank0.pt", "train.log", "metrics.jsonl", "curves"])
def test_out_must_be_an_image_and_never_a_run_file(damaged_run, name):
    target = damaged_run / name
    if not target.exists():
        target.write_bytes(b"the run's own file")
    before = target.read_bytes()
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(damaged_run), "--out", str(target)])
    suffix = target.suffix or "no suffix"
    cli_fails(r, 2, f"--out {target}: {suffix}")
    assert "choose a file ending in .png, .svg or .pdf" in r.output
    assert target.read_bytes() == before and not (damaged_run / "curves.png").exists()


def test_out_through_a_link_to_a_run_file_is_refused(damaged_run):
    (damaged_run / "hbpe_run.json").write_text("{}")
    (damaged_run / "nice.png").symlink_to(damaged_run / "hbpe_run.json")
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(damaged_run), "--out", str(damaged_run / "nice.png")])
    cli_fails(r, 2, f"--out {damaged_run / 'nice.png'} is a link to {damaged_run / 'hbpe_run.json'}")
    assert (damaged_run / "hbpe_run.json").read_text() == "{}"
    metrics = damaged_run / "m.png"  # a metrics file under an image's name: never written over
    metrics.write_bytes((damaged_run / "metrics.jsonl").read_bytes())
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(metrics), "--out", str(metrics)])
    cli_fails(r, 2, f"--out {metrics} is the metrics file to plot: hbpe plot writes neither through a link nor over")
    assert metrics.read_bytes() == (damaged_run / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf", ".PNG"])
def test_out_writes_the_format_its_suffix_names(damaged_run, tmp_path, suffix):
    out = tmp_path / f"curves{suffix}"
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(damaged_run), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["out"] == str(out)
    magic = {".png": PNG, ".svg": b"<?xml", ".pdf": b"%PDF"}[suffix.lower()]
    assert out.read_bytes().startswith(magic)


def test_out_a_directory_writes_curves_png_inside_and_says_so(damaged_run, tmp_path):
    folder = tmp_path / "plots"
    folder.mkdir()
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(damaged_run), "--out", str(folder)])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"wrote {folder / 'curves.png'}: 4 train and 2 eval points")
    assert (folder / "curves.png").read_bytes()[:8] == PNG and not (tmp_path / "plots.png").exists()


def test_out_naming_a_folder_that_is_not_there_says_so(damaged_run, tmp_path):
    """Before: `--out newdir/` was "no suffix is not an image format": the folder went unnamed."""
    new = f"{tmp_path / 'newdir'}/"
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(damaged_run), "--out", new])
    cli_fails(r, 2, f"--out {new} names a folder that does not exist: pass an image file path such as {new}plot.png")
    assert not (tmp_path / "newdir").exists()
    (tmp_path / "afile").write_text("not a folder")
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(damaged_run), "--out", f"{tmp_path / 'afile'}/"])
    cli_fails(r, 2, f"names a folder, but {tmp_path / 'afile'} is a file: pass an image file path such as")
    (tmp_path / "d" / "curves.png").mkdir(parents=True)  # a folder's curves.png that is a folder itself
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(damaged_run), "--out", str(tmp_path / "d")])
    cli_fails(r, 2, f"--out {tmp_path / 'd' / 'curves.png'} is a folder: move it away or pass an image file path")
    r = CliRunner().invoke(main, ["plot", "--checkpoint", str(damaged_run), "--out", new + "plot.png"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "newdir" / "plot.png").read_bytes()[:8] == PNG
