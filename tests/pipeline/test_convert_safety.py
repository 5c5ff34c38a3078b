"""`hbpe convert` never destroys what the user had, and bad input files become rejects.

Real DirectRunner runs on small real files; the interruption tests start the real CLI with
multi_processing workers and signal it.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard

from hbpe.pipeline.beam.convert import run_convert
from hbpe.pipeline.corpus.inputs import resolve_inputs
from hbpe.pipeline.shards.reader import ShardDir
from hbpe.pipeline.shards.tools import verify
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ConfigError, HbpeError
from tests.conftest import REPO, SAMPLE_EN, SAMPLE_ZH, SHARED_DATA
from tests.helpers import IN_MEMORY, convert, dir_bytes, exported


def leftovers(out: Path) -> list[str]:
    """hbpe's build and staging folders (in the output, or beside it): none may be left after a run."""
    inside = sorted(p.name for p in out.glob(".hbpe-*")) if out.is_dir() else []
    return inside + sorted(p.name for p in out.parent.glob(out.name + ".*"))


@pytest.fixture
def previous(tmp_path, gpt2_tokenizer_dir) -> tuple[Path, dict[str, bytes]]:
    """A committed output and its bytes: what an --overwrite must not lose when it fails."""
    out = tmp_path / "out"
    convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out, tail="pad")
    return out, dir_bytes(out)


def test_failed_overwrite_leaves_the_previous_output_intact(tmp_path, gpt2_tokenizer_dir, previous):
    out, before = previous
    with pytest.raises(ConfigError, match="matches no file"):  # a typo in --input used to delete the output
        convert(gpt2_tokenizer_dir, [tmp_path / "nope-*.jsonl"], out, overwrite=True)
    with pytest.raises(ConfigError, match="bad Beam pipeline option: Unexpected pipeline runner: NoSuchRunner"):
        convert(gpt2_tokenizer_dir, [SAMPLE_EN], out, args=[*IN_MEMORY, "--runner=NoSuchRunner"], overwrite=True)
    with pytest.raises(ConfigError, match="bad Beam pipeline option: argument --direct_running_mode: invalid choice"):
        convert(gpt2_tokenizer_dir, [SAMPLE_EN], out, args=["--direct_running_mode=bogus"], overwrite=True)
    assert dir_bytes(out) == before and leftovers(out) == []

    def break_the_workers_tokenizer(units) -> None:
        # the workers load the tokenizer copy in the build's staging folder: a real failure inside a worker
        (spec,) = out.glob(".hbpe-new-*/.hbpe-staging/tokenizer/hbpe_tokenizer.json")
        spec.write_text("{not json")

    cfg = ConvertConfig(inputs=(str(SAMPLE_EN),), output=str(out), tokenizer=str(gpt2_tokenizer_dir), seq_len=128)
    with pytest.raises(HbpeError, match=f"(?s)nothing was committed to {out}; {out} is as it was.*not valid JSON"):
        run_convert(cfg, IN_MEMORY, overwrite=True, progress=False, on_start=break_the_workers_tokenizer)
    assert dir_bytes(out) == before and leftovers(out) == []
    assert verify(ShardDir(out)) == []


def test_overwrite_replaces_an_earlier_output_once_complete(tmp_path, gpt2_tokenizer_dir):
    out = tmp_path / "out"
    old = convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out, shard_bytes=1 << 18)
    assert len(old["shards"]) > 1
    m = convert(gpt2_tokenizer_dir, [SAMPLE_EN], out, overwrite=True, seq_len=256)
    assert m["seq_len"] == 256 and json.loads((out / "manifest.json").read_text()) == m
    assert sorted(p.name for p in out.glob("shard.*")) == m["shards"] == ["shard.00000.mds.zstd"]  # old ones gone
    assert leftovers(out) == [] and verify(ShardDir(out)) == []


def test_overwrite_refuses_an_output_holding_files_hbpe_did_not_write(tmp_path, gpt2_tokenizer_dir, previous):
    out, before = previous
    (out / "notes.txt").write_text("mine")
    (out / "eval").mkdir()
    with pytest.raises(
        ConfigError, match=r"holds files hbpe did not write: eval, notes.txt; --overwrite only replaces"
    ):
        convert(gpt2_tokenizer_dir, [SAMPLE_EN], out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "COMPLETED").exists()


def test_unfinished_output_needs_overwrite(tmp_path, gpt2_tokenizer_dir):
    out = tmp_path / "out"
    (out / ".hbpe-staging" / "units").mkdir(parents=True)  # what a run killed with SIGKILL leaves
    with pytest.raises(ConfigError, match=r"exists and is not empty \(an unfinished conversion: no COMPLETED\)"):
        convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out)
    convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out, overwrite=True)
    assert (out / "COMPLETED").exists() and not (out / ".hbpe-staging").exists()


def test_input_or_tokenizer_inside_the_output_is_refused(tmp_path, gpt2_tokenizer_dir, previous):
    out, before = previous
    # the tokenizer copy of an earlier run: the old code deleted it, then failed to copy it
    with pytest.raises(ConfigError, match=r"--tokenizer .*/out/tokenizer lies inside the output directory .*/out"):
        convert(out / "tokenizer", [SAMPLE_ZH], out, overwrite=True)
    with pytest.raises(ConfigError, match=r"--input .*/out/rejects/\*.jsonl lies inside the output directory"):
        convert(gpt2_tokenizer_dir, [out / "rejects" / "*.jsonl"], out, overwrite=True)
    with pytest.raises(ConfigError, match=r"--input .*/out lies inside the output directory"):
        convert(gpt2_tokenizer_dir, [out], out, overwrite=True)
    assert dir_bytes(out) == before


def test_an_output_inside_an_input_directory_is_not_read_back(tmp_path, gpt2_tokenizer_dir):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text('{"text": "one document"}\n')
    for _ in range(2):  # the rerun must not find the shards, index.json or rejects.jsonl as inputs
        m = convert(gpt2_tokenizer_dir, [data], data / "shards", overwrite=True, tail="pad")
        assert [i["path"] for i in m["inputs"]] == [str(data / "a.jsonl")]


def test_output_path_that_is_a_file_or_under_a_file(tmp_path, gpt2_tokenizer_dir):
    f = tmp_path / "corpus.jsonl"
    f.write_text('{"text": "x"}\n')
    with pytest.raises(ConfigError, match=r"--out .*corpus.jsonl is a file, not a directory"):
        convert(gpt2_tokenizer_dir, [SAMPLE_ZH], f)
    with pytest.raises(ConfigError, match=r"--out .*corpus.jsonl/shards cannot be created: .*corpus.jsonl is a file"):
        convert(gpt2_tokenizer_dir, [SAMPLE_ZH], f / "shards")
    deep = tmp_path / "runs" / "new-experiment" / "shards"  # missing parents are created, like mkdir -p
    convert(gpt2_tokenizer_dir, [f], deep, tail="pad")
    assert exported(deep, tmp_path) == ["x"]


def test_failed_fresh_run_leaves_no_output_folder(tmp_path, gpt2_tokenizer_dir):
    out = tmp_path / "new"
    with pytest.raises(HbpeError, match="not valid JSON"):
        cfg = ConvertConfig(inputs=(str(SAMPLE_ZH),), output=str(out), tokenizer=str(gpt2_tokenizer_dir))
        run_convert(
            cfg,
            IN_MEMORY,
            progress=False,
            on_start=lambda units: (out / ".hbpe-staging" / "tokenizer" / "hbpe_tokenizer.json").write_text("{"),
        )
    assert not out.exists()


def test_bad_zstd_files_are_rejects(tmp_path, gpt2_tokenizer_dir):
    src = tmp_path / "in"
    src.mkdir()
    good = b'{"id": "g", "text": "kept document"}\n' * 3
    (src / "a-not-zstd.jsonl.zst").write_bytes(good)  # plain text under a .zst name
    frame = zstandard.ZstdCompressor().compress(good)
    (src / "b-corrupt.jsonl.zst").write_bytes(frame + b"\x28\xb5\x2f\xfd" + os.urandom(64))  # bad second frame
    (src / "c.jsonl").write_bytes(good)
    out = tmp_path / "out"
    m = convert(gpt2_tokenizer_dir, [src], out, tail="pad")
    assert m["counts"]["rejected_by_reason"] == {"unreadable_input": 2}
    rejects = [json.loads(line) for line in (out / "rejects" / "rejects.jsonl").read_text().splitlines()]
    assert [(Path(r["source"]).name, r["reason"]) for r in rejects] == [
        ("a-not-zstd.jsonl.zst", "unreadable_input"),
        ("b-corrupt.jsonl.zst", "unreadable_input"),
    ]
    assert all("OSError: not zstd data, or corrupt: zstd decompressor error" in r["detail"] for r in rejects)
    assert exported(out, tmp_path) == ["kept document"] * 6  # the complete first frame, then c.jsonl


def test_utf8_bom_is_stripped(tmp_path, gpt2_tokenizer_dir):
    bom = b"\xef\xbb\xbf"
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_bytes(bom + b'{"text": "jsonl first"}\n{"text": "jsonl second"}\n')
    (src / "b.jsonl.gz").write_bytes(gzip.compress(bom + b'{"text": "gzip first"}\n'))
    (src / "c.txt").write_bytes(bom + "a text file, caf\u00e9".encode())
    (src / "d.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(bom + b"zstd text"))
    out = tmp_path / "out"
    m = convert(gpt2_tokenizer_dir, [src], out, tail="pad")
    assert m["counts"]["documents_rejected"] == 0
    texts = exported(out, tmp_path)
    assert texts == ["jsonl first", "jsonl second", "gzip first", "a text file, caf\u00e9", "zstd text"]
    lines = tmp_path / "lines"
    convert(gpt2_tokenizer_dir, [src / "c.txt"], lines, tail="pad", text_unit="line")
    assert exported(lines, tmp_path) == ["a text file, caf\u00e9"]


def test_directory_with_unknown_files_is_refused_with_a_list(tmp_path, gpt2_tokenizer_dir):
    src = tmp_path / "in"
    (src / "docs").mkdir(parents=True)
    (src / "a.jsonl").write_text('{"text": "the corpus"}\n')
    for name in ("README.md", "data.csv", "docs/guide.md", "docs/x.md", "docs/y.md", "docs/z.md"):
        (src / name).write_text("not a corpus")
    (src / ".DS_Store").write_bytes(b"\0\1")  # hidden files are skipped, as glob does
    with pytest.raises(
        ConfigError,
        match=r"6 file\(s\) of unknown format: .*in/README.md, .*in/data.csv, .*in/docs/guide.md, .*in/docs/x.md, "
        r".*in/docs/y.md \.\.\. \(6 in all\); hbpe reads .*: leave the others out with --exclude GLOB "
        r"\(repeatable, e.g. --exclude '\*.md'\), or select files with a glob such as --input 'DIR/\*.jsonl'",
    ):
        convert(gpt2_tokenizer_dir, [src], tmp_path / "o1")
    m = convert(gpt2_tokenizer_dir, [src], tmp_path / "o2", excludes=("*.md", "data.csv"), tail="pad")
    assert m["config"]["excludes"] == ["*.md", "data.csv"] and len(m["inputs"]) == 1
    assert exported(tmp_path / "o2", tmp_path) == ["the corpus"]
    assert resolve_inputs([str(src / "*.jsonl")]) == [str(src / "a.jsonl")]
    assert resolve_inputs([str(src)], excludes=["docs/*", "README.md", "*.csv"]) == [str(src / "a.jsonl")]
    with pytest.raises(ConfigError, match=r"--input '.*docs' matches no file \(all 4 excluded by --exclude\)"):
        resolve_inputs([str(src / "docs")], excludes=["*.md"])


# ------------------------------------------------------------------ interrupting the real CLI


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            table[int(entry)] = (int(fields[1]), fields[0].decode())
    return table


def _descendants(root: int) -> list[int]:
    table = _process_table()
    found, stack = [], [root]
    while stack:
        kids = [pid for pid, (ppid, _) in table.items() if ppid == stack[-1]]
        stack.pop()
        found += kids
        stack += kids
    return found


def _running(pids: list[int]) -> list[int]:
    table = _process_table()
    return [p for p in pids if p in table and table[p][1] != "Z"]  # a zombie has exited


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process tree from /proc")
@pytest.mark.parametrize(
    "sig, replacing", [(signal.SIGTERM, True), (signal.SIGINT, False)], ids=["SIGTERM-overwrite", "SIGINT-new"]
)
def test_signal_stops_workers_and_commits_nothing(tmp_path, gpt2_tokenizer_dir, sig, replacing):
    corpus = SHARED_DATA / "en-sotu.jsonl.zst"
    corpus = corpus if corpus.exists() else SAMPLE_EN
    src = tmp_path / "in"
    src.mkdir()
    for i in range(4):  # four units, big enough to be still encoding a few seconds in
        shutil.copy(corpus, src / f"part{i}.jsonl.zst")
    out = tmp_path / "out"
    before = {}
    if replacing:
        convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out, tail="pad")
        before = dir_bytes(out)
    cmd = [sys.executable, "-c", "from hbpe.cli import main; main()", "convert", "--tokenizer", str(gpt2_tokenizer_dir)]
    cmd += ["--input", str(src), "--out", str(out), "--direct_num_workers=2"]
    cmd += ["--direct_running_mode=multi_processing", *(["--overwrite"] if replacing else [])]
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # a loaded machine takes a while to start the workers
        while not list(out.glob("**/.hbpe-staging/units/*.bin")):
            assert proc.poll() is None and time.monotonic() < deadline, "the conversion never got going"
            time.sleep(0.2)
        workers = _descendants(proc.pid)
        assert len(workers) >= 2  # sh + python per Beam worker
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while _running(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(workers) == [], "Beam workers outlived the launcher"
    assert proc.returncode == 128 + sig
    name = signal.Signals(sig).name
    assert f"error: interrupted by {name}: the Beam workers were stopped and nothing was committed" in err
    assert "Traceback" not in err
    assert leftovers(out) == []
    if replacing:
        assert dir_bytes(out) == before
    else:
        assert not out.exists()


def test_signals_wait_for_the_output_swap():
    from hbpe.pipeline.beam.signals import signals_deferred

    done = []
    # Python's own SIGINT handler: importing Composer (in another test of this process) replaces it
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here, in the main thread: it only records the signal
            done.append("both renames")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done == ["both renames"]


def test_cli_exclude_option_and_unknown_files_error(tmp_path, gpt2_tokenizer_dir):
    from click.testing import CliRunner

    from hbpe.cli import main

    src = tmp_path / "in"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "the corpus"}\n')
    (src / "README.md").write_text("# about")
    args = ["convert", "--tokenizer", str(gpt2_tokenizer_dir), "--input", str(src), "--seq-len", "16", *IN_MEMORY]
    r = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "o1")])
    assert r.exit_code == 2 and "error: the inputs hold 1 file(s) of unknown format" in r.output
    assert "--exclude '*.md'" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "o2"), "--exclude", "*.md", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{") :])["config"]["excludes"] == ["*.md"]


# ------------------------------------------------------------------ object-store outputs (gs://, s3://)


def _object_store_fs():
    """A local folder seen as an object store under objtest://, standing in for gs:// and s3://.

    Like GCS and S3 it has no folders: exists() is True only for objects, listing is recursive,
    and renames and deletes go object by object (empty folders vanish, as prefixes do).
    """
    from apache_beam.io.filesystem import FileMetadata, MatchResult
    from apache_beam.io.localfilesystem import LocalFileSystem

    pre = "objtest://"

    def local(path: str) -> str:
        return path[len(pre) :] if path.startswith(pre) else path

    def prune(folder: str) -> None:
        while folder and os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
            folder = os.path.dirname(folder)

    class ObjectStoreFS(LocalFileSystem):
        @classmethod
        def scheme(cls):
            return "objtest"

        def join(self, base, *parts):
            return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])

        def mkdirs(self, path):
            pass

        def _list(self, prefix):
            for folder, _, names in os.walk(local(prefix)):
                for n in names:
                    p = os.path.join(folder, n)
                    yield FileMetadata(p, os.path.getsize(p), os.path.getmtime(p))

        def match(self, patterns, limits=None):
            results = super().match([local(p) for p in patterns], limits)
            return [
                MatchResult(pre + r.pattern, [FileMetadata(pre + m.path, m.size_in_bytes) for m in r.metadata_list])
                for r in results
            ]

        def create(self, path, *args, **kw):
            os.makedirs(os.path.dirname(local(path)), exist_ok=True)
            return super().create(local(path), *args, **kw)

        def open(self, path, *args, **kw):
            return super().open(local(path), *args, **kw)

        def copy(self, sources, destinations):
            for src, dst in zip(sources, destinations, strict=True):
                os.makedirs(os.path.dirname(local(dst)), exist_ok=True)
                shutil.copyfile(local(src), local(dst))

        def rename(self, sources, destinations):
            for src, dst in zip(sources, destinations, strict=True):
                os.makedirs(os.path.dirname(local(dst)), exist_ok=True)
                os.replace(local(src), local(dst))
                prune(os.path.dirname(local(src)))

        def exists(self, path):
            return os.path.isfile(local(path))

        def delete(self, paths):
            for p in paths:
                os.remove(local(p))  # a missing object is an error, as on GCS
                prune(os.path.dirname(local(p)))

    return ObjectStoreFS


def test_object_store_output_fresh_refused_failed_and_replaced(tmp_path, gpt2_tokenizer_dir):
    store = _object_store_fs()  # Beam finds FileSystem subclasses by scheme while they exist (weakly referenced)
    root = tmp_path / "bucket"
    out = f"objtest://{root}/out"

    def objects() -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    m = convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out, shard_bytes=1 << 18)
    first = objects()
    assert len(m["shards"]) > 1 and "out/COMPLETED" in first
    assert not [o for o in first if ".hbpe-" in o]  # staging deleted object by object: a prefix never "exists"
    with pytest.raises(ConfigError, match=f"output {out} exists and is not empty; pass --overwrite"):
        convert(gpt2_tokenizer_dir, [SAMPLE_ZH], out)

    def break_the_workers_tokenizer(units) -> None:
        (spec,) = (root / "out").glob(".hbpe-new-*/.hbpe-staging/tokenizer/hbpe_tokenizer.json")
        spec.write_text("{")

    cfg = ConvertConfig(inputs=(str(SAMPLE_EN),), output=out, tokenizer=str(gpt2_tokenizer_dir), seq_len=128)
    with pytest.raises(HbpeError, match=f"nothing was committed to {out}; {out} is as it was"):
        run_convert(cfg, IN_MEMORY, overwrite=True, progress=False, on_start=break_the_workers_tokenizer)
    assert objects() == first
    m = convert(gpt2_tokenizer_dir, [SAMPLE_EN], out, overwrite=True, seq_len=256)
    assert [o for o in objects() if "shard." in o] == ["out/shard.00000.mds.zstd"] == ["out/" + s for s in m["shards"]]
    assert not [o for o in objects() if ".hbpe-" in o] and verify(ShardDir(root / "out")) == []
    assert store.scheme() == "objtest"
