"""A damaged `hbpe_run.json` (issue 20): eval, generate and export name the file and the fix in one
`error:` line. Before: internal JSONDecodeError, TypeError and KeyError tracebacks."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from tests.conftest import copy_run
from tests.helpers import cli_fails as _fails

FIX = "`hbpe train` writes it beside the checkpoints: restore it from a copy of the run"


def _damaged(meta: dict) -> list[tuple[str, bytes, str]]:
    """(case, the file's bytes, what the message says about it)."""

    def edited(**changes) -> bytes:
        return json.dumps({k: v for k, v in {**meta, **changes}.items() if v is not None}).encode()

    return [
        ("invalid JSON", b'{"model": {', "(invalid JSON: Expecting property name enclosed in double quotes"),
        ("cut short", json.dumps(meta).encode()[:-40], "(invalid JSON: "),
        ("not UTF-8", b"\xff\xfe{}", "(invalid JSON: "),
        ("a list", b"[]", "(a JSON list, not an object)"),
        ("empty object", b"{}", "(no model, tokenizer_fingerprint, vocab_size, max_patch_size, n_vocab)"),
        ("missing key", edited(tokenizer_fingerprint=None), "(no tokenizer_fingerprint)"),
        ("model not an object", edited(model=[]), "(model is [], expected an object)"),
        ("size not an integer", edited(vocab_size="470"), '(vocab_size is "470", expected an integer)'),
        (
            "unknown model key",
            edited(model={**meta["model"], "bogus": 1}),
            "(its model config does not fit this hbpe: unknown config keys ['model.bogus']",
        ),
    ]


@pytest.mark.parametrize("command", ["eval", "generate", "export"])
def test_a_damaged_run_file_is_one_error_line(tiny_run, sample_shards, tmp_path, command):
    run = copy_run(tiny_run, tmp_path / "run")
    meta = json.loads((run / "hbpe_run.json").read_text())
    extra = {
        "eval": ["--data", str(sample_shards[1]), "--max-batches", "1"],
        "generate": ["--prompt", "Fellow", "--max-bytes", "4"],
        "export": ["--out", str(tmp_path / "export")],
    }[command]
    for case, raw, said in _damaged(meta):
        (run / "hbpe_run.json").write_bytes(raw)
        r = CliRunner().invoke(main, [command, "--checkpoint", str(run), *extra])
        _fails(r, 2, f"{run / 'hbpe_run.json'} is not a readable hbpe_run.json {said}")
        assert FIX in r.output, case
    assert not (tmp_path / "export").exists()
