"""Helpers shared by test files (one home, so that no test file imports another).

Fixtures stay in conftest.py; these are plain functions and constants: running the CLI and
checking its failure, converting and comparing shard directories, damaging shards, small models.
"""

from __future__ import annotations

import bz2
import gzip
import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import torch
import zstandard
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.pipeline.beam.convert import run_convert
from hbpe.pipeline.shards.reader import ShardDir
from hbpe.pipeline.shards.tools import export_text_to
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.train_config import model_config
from hbpe.training.model.build import build_model
from hbpe.training.model.patch_lm import VocabSpec
from hbpe.training.train.config_io import load_config
from tests.object_stores import free_port  # noqa: F401  (one definition; light module, test files import it here)


def cli_fails(r, code: int, message: str) -> None:
    """Exit `code`, exactly one line of output that starts `error: ` and contains `message`, no traceback."""
    assert r.exit_code == code, r.output
    assert isinstance(r.exception, SystemExit), repr(r.exception)  # nothing escaped to click's runner
    assert "Traceback" not in r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.output


def without_timing(files: dict[str, bytes]) -> dict[str, bytes]:
    """A shard directory's files less what differs by design: the manifest's `timing` (wall time, runner, units
    reused) and the output path it records. All else must be the same bytes."""
    out = dict(files)
    m = json.loads(out.pop("manifest.json"))
    del m["timing"], m["config"]["output"]
    out["manifest.json"] = json.dumps(m, sort_keys=True).encode()
    return out


IN_MEMORY = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def convert(tok_dir, inputs, out, *, args=IN_MEMORY, overwrite=False, **kw):
    cfg = ConvertConfig(
        inputs=tuple(str(i) for i in inputs), output=str(out), tokenizer=str(tok_dir), **{"seq_len": 128, **kw}
    )
    return run_convert(cfg, args, progress=False, overwrite=overwrite)


def exported(out: Path, tmp_path: Path) -> list[str]:
    dest = tmp_path / f"export-{out.name}.jsonl"
    export_text_to(dest, ShardDir(out))
    return [json.loads(line)["text"] for line in dest.read_text().splitlines()]


def dir_bytes(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def bad_inputs(d: Path) -> None:
    lines = [
        b'{"id": "ok1", "text": "first good document"}',
        b'{"id": "bad-json", "text": "unterminated',
        b'["not", "an", "object"]',
        b'{"id": "no-text", "body": "x"}',
        b'{"id": "int-text", "text": 42}',
        b'{"id": "bad-utf8", "text": "caf\xe9"}',
        b'{"id": "surrogate", "text": "\\ud800 alone"}',
        b'{"id": "empty", "text": ""}',
        b"   ",
        b'{"id": "big", "text": "' + b"y" * 500 + b'"}',
        b'{"id": "ok2", "meta": {}, "text": "second good document"}',
    ]
    (d / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    good = b'{"id": "z1", "text": "zstd document"}\n' * 50
    z = zstandard.ZstdCompressor()
    (d / "b.jsonl.zst").write_bytes(z.compress(good) + z.compress(good)[:-12])  # second frame truncated
    (d / "c.jsonl.gz").write_bytes(gzip.compress(b'{"text": "gzip ok"}\n')[:-6])  # truncated trailer
    (d / "d.jsonl.bz2").write_bytes(bz2.compress(b'{"text": "bz2 ok"}\n'))


def train_cfg(sample_shards, folder, *extra):
    train_dir, eval_dir = sample_shards
    return load_config(
        "tiny",
        [f"data.train={train_dir}", f"data.eval={eval_dir}", f"save_folder={folder}", "log_interval=100ba", *extra],
    )


class CacheHolder:
    """Another process holding a stream cache, as a live run does (the real `claim`), until `end`."""

    def __init__(self, root: Path, *, run_name: str = "other-run", save_folder: str = "s3://bucket/other") -> None:
        code = (
            "import sys; from hbpe.training.data.stream_cache import claim; "
            "claim(sys.argv[1], run_name=sys.argv[2], save_folder=sys.argv[3]); print('held', flush=True); "
            "sys.stdin.read()"
        )
        argv = [sys.executable, "-c", code, str(root), run_name, save_folder]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"  # it holds the lock now

    def end(self, sig: int = signal.SIGKILL) -> None:
        self.proc.send_signal(sig)  # kill -9: the kernel releases the lock, nothing is left stale
        self.proc.wait(timeout=30)


SHARD = "shard.00001.mds.zstd"


def damage(d, kind: str, name: str = SHARD) -> None:
    """Flip one byte in the middle of a shard, cut its last 1000 bytes, or delete it."""
    p = d / name
    data = bytearray(p.read_bytes())
    if kind == "flip":
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
    elif kind == "truncate":
        p.write_bytes(bytes(data[:-1000]))
    elif kind == "missing":
        p.unlink()
    else:
        raise ValueError(kind)


DAMAGE = {
    "flip": "xxh64 does not match index.json",
    "truncate": "69144 bytes, index.json records 70144",  # a lean shard (tokens, num_bytes)
    "missing": "missing",
}


def make_special(path: Path, kind: str) -> None:
    """Replace `path` with a FIFO (a reader waits for a writer) or a link to /dev/zero (a read never ends)."""
    import os

    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


def scaled_model(io: str, tok, seed: int):
    """A 2-layer model whose weights are drawn wide enough that log-probs are far from uniform."""
    torch.manual_seed(seed)
    model = build_model(model_config("tiny", io=io), VocabSpec.from_tokenizer(tok)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 2.5 / math.sqrt(p.shape[1]))
    return model


def get_dir(server, uri: str, local: Path) -> dict[str, bytes]:
    """Every object under `uri`, also written below `local` (a local copy for the tools to compare with)."""
    files = {name: get_object(server, f"{uri}/{name}") for name in server.list(uri)}
    for name, data in files.items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)
    return files


def hbpe_cli(*args: str, code: int = 0) -> str:
    """The CLI's stdout when it succeeds, else all it printed (errors go to stderr)."""
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert r.exit_code == code, r.output
    return r.output if code else r.stdout


def comparable(files: dict[str, bytes]) -> dict[str, bytes]:
    """A shard directory's files less where its data came from: the manifest's timing, the paths it records
    (config output/inputs/tokenizer, each input's path and mtime). All else must be the same bytes."""
    out = dict(files)
    m = json.loads(out.pop("manifest.json"))
    del m["timing"], m["config"]["output"], m["config"]["inputs"], m["config"]["tokenizer"]
    m["inputs"] = [i["size"] for i in m["inputs"]]
    out["manifest.json"] = json.dumps(m, sort_keys=True).encode()
    return out


def get_object(server, uri: str) -> bytes:
    """One object's bytes, read with the store's own client (not hbpe's)."""
    return server.get(uri)
