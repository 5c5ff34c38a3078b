"""What hbpe's typed results hand out is a copy (issue 35): the deprecated `result[key]` returned the report's own
object, so changing what it gave changed the result, its `as_dict()` and every later `result[key]`."""

from __future__ import annotations

import json

import pytest

import hbpe


def _run(tmp_path):
    """A 4-batch run's metrics.jsonl with one damaged line (its summary counts it in a dict: a mutable value)."""
    run = tmp_path / "run"
    run.mkdir()
    lines = []
    for b in range(1, 5):
        values = {"loss/train/total": 6.0 - b / 4, "metrics/train/BitsPerByte": 4.0 - b / 8}
        lines.append(json.dumps({"kind": "train", "batch": b, "samples": 4 * b, "bytes": 500 * b, **values}))
    (run / "metrics.jsonl").write_text("\n".join([*lines, "{not json"]) + "\n")
    return run


def test_the_deprecated_item_access_hands_out_a_copy(tmp_path):
    r = hbpe.plot(_run(tmp_path), out=tmp_path / "curves.png")
    before = r.as_dict()
    assert sum(before["skipped_lines"].values()) == 1 and r.train_points == 4
    with pytest.warns(DeprecationWarning, match=r"PlotResult\['skipped_lines'\] is deprecated"):
        skipped = r["skipped_lines"]
    assert skipped == before["skipped_lines"]
    skipped["changed by the caller"] = 99  # the caller's copy, not the report
    skipped.clear()
    with pytest.warns(DeprecationWarning):
        assert r["skipped_lines"] == before["skipped_lines"]
    assert r.as_dict() == before and r.report["skipped_lines"] == before["skipped_lines"]
    mine = r.as_dict()  # as_dict() too: a copy
    mine["skipped_lines"]["x"] = 1
    assert r.as_dict() == before
