"""Shared fixtures: small real data and tiny trained tokenizers, built once per session."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import strict_skips

REPO = Path(__file__).resolve().parents[1]
SAMPLE_EN = REPO / "data" / "sample" / "en-sotu-sample.jsonl.zst"
SAMPLE_ZH = REPO / "data" / "sample" / "zh-kernel-docs-sample.jsonl.zst"
SHARED_DATA = REPO.parent / "shared" / "data"

if "TIKTOKEN_CACHE_DIR" not in os.environ and (SHARED_DATA / "tiktoken-cache").is_dir():
    os.environ["TIKTOKEN_CACHE_DIR"] = str(SHARED_DATA / "tiktoken-cache")


def pytest_configure(config):
    # one torch thread per test process: `make test` runs 2 workers on 2 cores, and 2 intra-op threads
    # each made the tiny models' small ops wait milliseconds for one another (generation tests 140 s -> 2.5 s)
    import torch

    torch.set_num_threads(1)
    strict_skips.register(config)  # HBPE_STRICT_SKIPS=1 (`make test`): a skip not in its allow-list fails the run


# the tiers (README: `make test-fast` runs the fast one): a test is end to end (`e2e`) when it converts a
# corpus, trains, or starts an object-store server, through these fixtures or by a mark of its own
E2E_FIXTURES = {
    "sample_shards", "train_copy", "eval_copy", "tiny_run", "sharded_run", "s3_server", "gcs_server", "object_store",
}  # fmt: skip


# files whose tests convert, train or start processes themselves (measured: each over 3 s of the fast tier)
E2E_MODULES = {
    "test_convert", "test_convert_safety", "test_convert_resume", "test_convert_inprocess", "test_convert_hardening",
    "test_portable_runner", "test_workers_die_with_launcher", "test_first_stage_trainers", "test_hbpe_train",
    "test_dask_runner", "test_experiment", "test_experiment_inputs", "test_experiment_seeds", "test_generate_sampling",
    "test_zero_shot_lm_eval", "test_launch_stop",
}  # fmt: skip


# fixtures that launch several training processes, built once per suite however xdist deals out their tests
# (`shared_between_workers`); the first test of each comes first, so the runs are under way early and the
# other tests that read them find them built (or wait on the lock) instead of starting them late
SHARED_FIXTURES = ("sharded_run", "two_node_run")


def pytest_collection_modifyitems(config, items):
    builders: set[str] = set()
    for item in items:
        module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
        fixtures = set(getattr(item, "fixturenames", ()))
        if E2E_FIXTURES & fixtures or module in E2E_MODULES:
            item.add_marker(pytest.mark.e2e)
        first = [name for name in SHARED_FIXTURES if name in fixtures and name not in builders]
        builders.update(first)
        item.stash[_TIER] = 0 if first else 1 if item.get_closest_marker("e2e") else 2
    # longest first: xdist deals tests out in this order (and `make test` lets an idle worker take queued tests
    # from a busy one: --dist worksteal), so the multi-process runs and the end-to-end tests start early and the
    # quick unit tests fill the gaps at the end (stable: files keep their order within each tier)
    items.sort(key=lambda item: item.stash[_TIER])


_TIER = pytest.StashKey[int]()


def shared_between_workers(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name`, built by `build(folder)` once per test session: by the first xdist worker to ask (under a
    file lock), then reused by the others. Tests read it; those that change files take a copy."""
    import fcntl
    import shutil

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's temporary folder, which holds each worker's own
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when a killed worker's process ends
        failed = root / f"{name}.failed"
        if failed.exists():  # another worker's build failed: say so at once rather than launch it again
            pytest.fail(f"building the shared {name} failed on another worker:\n{failed.read_text()}")
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)  # what an earlier failed attempt left
            folder.mkdir()
            try:
                build(folder)
            except BaseException as e:
                failed.write_text(f"{type(e).__name__}: {e}"[-5000:])
                raise
            (folder / ".built").touch()
    return folder


@pytest.fixture(autouse=True)
def library_chatter_restored():
    """A `hbpe -q` command run in-process leaves the libraries quiet (and their variables in os.environ) for the
    rest of the process, as the next command of the CLI would not: put them back after every test."""
    yield
    from hbpe.pipeline.library_chatter import quiet_libraries

    quiet_libraries(False)


@contextlib.contextmanager
def private_hf_modules(folder: Path) -> Iterator[Path]:
    """transformers copies the remote code of a `trust_remote_code` load into HF_MODULES_CACHE and imports it from
    there as `transformers_modules.<folder name>.*`; by default ~/.cache/huggingface/modules, which every test run
    and xdist worker rewrote. Here `folder` holds it (for subprocesses too), the modules are imported afresh from
    it, and everything is put back after. transformers reads the variable once, at import, into
    dynamic_module_utils.HF_MODULES_CACHE: that constant is patched. A model loaded here is used here."""
    import sys

    import transformers.dynamic_module_utils as dynamic
    import transformers.utils.hub as hub

    def remote_modules() -> dict:
        return {k: m for k, m in sys.modules.items() if k.split(".")[0] == "transformers_modules"}

    before = (os.environ.get("HF_MODULES_CACHE"), dynamic.HF_MODULES_CACHE, hub.HF_MODULES_CACHE, sys.path[:])
    modules = remote_modules()
    for name in modules:
        del sys.modules[name]
    os.environ["HF_MODULES_CACHE"] = dynamic.HF_MODULES_CACHE = hub.HF_MODULES_CACHE = str(folder)
    sys.path[:] = [p for p in sys.path if p not in before[1:3]]  # `transformers_modules` is found in folder only
    try:
        yield folder
    finally:
        if before[0] is None:
            os.environ.pop("HF_MODULES_CACHE", None)
        else:
            os.environ["HF_MODULES_CACHE"] = before[0]
        dynamic.HF_MODULES_CACHE, hub.HF_MODULES_CACHE, sys.path[:] = before[1], before[2], before[3]
        for name in remote_modules():
            del sys.modules[name]
        sys.modules.update(modules)


@pytest.fixture
def hf_modules(tmp_path) -> Iterator[Path]:
    """This test's own HF_MODULES_CACHE (private_hf_modules): `pytestmark = pytest.mark.usefixtures("hf_modules")`."""
    with private_hf_modules(tmp_path / "hf-modules") as folder:
        yield folder


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    from hbpe.pipeline.tokenizer import artifact

    return artifact.train_tokenizer("gpt2", max_patch_size=10)


@pytest.fixture(scope="session")
def gpt2_tokenizer_dir(tmp_path_factory, gpt2_tokenizer):
    from hbpe.pipeline.tokenizer import artifact

    return artifact.save(gpt2_tokenizer, tmp_path_factory.mktemp("tok") / "gpt2-s10")


@pytest.fixture(scope="session")
def sample_texts():
    from hbpe.pipeline.tokenizer.stats import read_texts

    texts, rejects = read_texts([str(SAMPLE_EN)])
    assert not rejects
    return texts


IN_MEMORY_BEAM = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def split_sample(out_dir: Path, n_train: int = 20) -> tuple[Path, Path]:
    """The bundled English sample as two jsonl files: train (first n docs) and held-out eval."""
    import zstandard

    lines = zstandard.ZstdDecompressor().stream_reader(SAMPLE_EN.read_bytes()).read().decode().splitlines()
    out_dir.mkdir(parents=True, exist_ok=True)
    train, held = out_dir / "train.jsonl", out_dir / "eval.jsonl"
    train.write_text("\n".join(lines[:n_train]) + "\n")
    held.write_text("\n".join(lines[n_train:]) + "\n")
    return train, held


@pytest.fixture(scope="session")
def sample_shards(tmp_path_factory, gpt2_tokenizer_dir):
    """(train, eval) shard directories of the bundled sample, seq_len 128."""
    from hbpe.pipeline.beam.convert import run_convert
    from hbpe.schemas.convert_config import ConvertConfig

    root = tmp_path_factory.mktemp("shards")
    train, held = split_sample(root / "corpus")
    outs = []
    for name, src in (("train", train), ("eval", held)):
        cfg = ConvertConfig(
            inputs=(str(src),),
            output=str(root / name),
            tokenizer=str(gpt2_tokenizer_dir),
            seq_len=128,
            shard_bytes=1 << 20,
        )
        run_convert(cfg, IN_MEMORY_BEAM, progress=False)
        outs.append(root / name)
    return tuple(outs)


@pytest.fixture
def train_copy(sample_shards, tmp_path) -> Path:
    """A private copy of the train shards, for tests that damage or edit them (never the session fixture)."""
    import shutil

    return Path(shutil.copytree(sample_shards[0], tmp_path / "train"))


@pytest.fixture
def eval_copy(sample_shards, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(sample_shards[1], tmp_path / "eval"))


TINY_RUN_BATCHES = 20


@pytest.fixture(scope="session")
def tiny_run(sample_shards, tmp_path_factory) -> Path:
    """One real `hbpe train` save folder shared by every test that needs a trained model.

    The tiny config for 20 batches on `sample_shards` (enough to emit multi-byte patches, not
    enough to end documents): hbpe_run.json, tokenizer/, ep0-ba20-rank0.pt and the
    latest-rank0.pt symlink. Tests that change files take a `copy_run` of it.
    """
    from hbpe.training.train.config_io import load_config
    from hbpe.training.train.trainer import train

    train_dir, eval_dir = sample_shards
    folder = tmp_path_factory.mktemp("tiny-run") / "run"
    n = TINY_RUN_BATCHES
    overrides = [f"data.train={train_dir}", f"data.eval={eval_dir}", f"save_folder={folder}", "console=false"]
    train(load_config("tiny", [*overrides, f"max_duration={n}ba", f"eval_interval={n}ba", f"save_interval={n}ba"]))
    return folder


@dataclass(frozen=True)
class LaunchedRun:
    """A `hbpe train --nproc N` run as its user saw it: the save folder and what the command printed."""

    folder: Path
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def sharded_run(sample_shards, tmp_path_factory) -> LaunchedRun:
    """`hbpe train --nproc 2 --json` as a user types it: FSDP2 over gloo with its default sharded state dict.

    2 batches, evaluated and saved at the end: every tensor of the checkpoint is split over the 2 ranks (a
    folder, one data file per rank). One run, launched once per suite, serves the JSON-output, consolidation
    and sharded-checkpoint safety tests.
    """
    import subprocess
    import sys

    from tests.helpers import free_port

    def build(root: Path) -> None:
        train_dir, eval_dir = sample_shards
        cmd = [
            *(sys.executable, "-m", "hbpe.cli", "train", "tiny", "fsdp={version: 2}"),
            *(f"data.train={train_dir}", f"data.eval={eval_dir}", f"save_folder={root / 'run'}"),
            *("max_duration=2ba", "eval_interval=2ba", "save_interval=2ba", "eval_subset_num_batches=2"),
            *("--nproc", "2", "--master-port", str(free_port()), "--json"),
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "TMPDIR": str(root)}
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        (root / "stdout.txt").write_text(r.stdout)
        (root / "stderr.txt").write_text(r.stderr)

    root = shared_between_workers(tmp_path_factory, "sharded-run", build)
    folder = root / "run"
    ckpt = folder / "latest-rank0.pt"
    assert (ckpt / ".metadata").is_file() and (ckpt / "__1_0.distcp").is_file()  # a folder, one file per rank
    return LaunchedRun(folder, (root / "stdout.txt").read_text(), (root / "stderr.txt").read_text())


def copy_run(run: Path, dest: Path) -> Path:
    """A private copy of a run folder (symlinks kept, so latest-rank0.pt still points at its checkpoint)."""
    import shutil

    shutil.copytree(run, dest, symlinks=True, ignore=shutil.ignore_patterns("stream-cache"))
    return dest


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server on 127.0.0.1 for this test process (tests/object_stores.py)."""
    from tests.object_stores import s3_server as serve

    with serve(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """gcp-storage-emulator on 127.0.0.1 for this test process (tests/object_stores.py)."""
    from tests.object_stores import gcs_server as serve

    with serve(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture(params=["s3", "gs"])
def object_store(request, monkeypatch):
    """Each object store in turn, with its clients' environment set for the test (and subprocesses)."""
    server = request.getfixturevalue("s3_server" if request.param == "s3" else "gcs_server")
    for key, value in server.env.items():
        monkeypatch.setenv(key, value)
    return server
