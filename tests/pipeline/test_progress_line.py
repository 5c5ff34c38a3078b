"""pipeline/progress_line.py's closing line in a log (stderr not a terminal): it says where the step ended, also when
the step had nothing left to do (a resumed run already at its end), and is not repeated when the last line said it."""

from __future__ import annotations

import io

from hbpe.pipeline.progress_line import ProgressLine


def closed(line: ProgressLine, out: io.StringIO, fields=None) -> list[str]:
    line.close(fields)
    return [x.split(" [")[0] for x in out.getvalue().splitlines()]


def test_close_prints_its_line_when_nothing_was_done():
    """A run resumed at its end (initial == total, no update): before (a planted `self._drawn != self.n` alone),
    close() printed nothing, and the log ended without saying the run was complete."""
    out = io.StringIO()
    line = ProgressLine("train", 5, initial=5, stream=out, interval_s=3600)
    assert closed(line, out, lambda: {"loss": "1.000"}) == ["train: 100% 5/5 batches"]
    assert out.getvalue().rstrip().endswith(", loss 1.000]")


def test_close_prints_its_line_when_nothing_was_done_from_the_start():
    out = io.StringIO()
    assert closed(ProgressLine("eval", 3, stream=out, interval_s=3600), out) == ["eval:   0% 0/3 batches"]


def test_close_does_not_repeat_the_last_line_drawn():
    out = io.StringIO()
    line = ProgressLine("train", 4, initial=2, stream=out, interval_s=0)
    line.update(2)
    assert closed(line, out) == ["train: 100% 4/4 batches"]
