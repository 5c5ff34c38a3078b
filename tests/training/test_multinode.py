"""Two "nodes" on this machine train one run over gloo (`hbpe train --nnodes 2`), and the run resumes on one
node with two processes in exactly the order it would have kept.

Each node is one CPU process under Composer's launcher. Nodes of a real cluster have their own /dev/shm
and /tmp, where streaming keeps its shared memory and file locks; the two "nodes" here get the same (a
mount namespace with its own /dev/shm, and a TMPDIR, each), or streaming's local leaders would take the
same shared-memory names and wait on one lock across a barrier that needs both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.training.train.launch_command import launcher_command
from tests.conftest import REPO, shared_between_workers
from tests.helpers import free_port

UNSHARE = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh"]


def _can_isolate_shm() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run([*UNSHARE, "true"], capture_output=True).returncode == 0


needs_isolation = pytest.mark.skipif(
    not _can_isolate_shm(), reason="needs `unshare -m` to give each node its own /dev/shm"
)


def _train(args: list[str], *, tmpdir) -> subprocess.Popen:
    """`hbpe train ARGS --json` as one machine: its own /dev/shm and TMPDIR (apart from other tests' datasets too)."""
    cmd = [sys.executable, "-m", "hbpe.cli", "train", *args, "--json"]
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    tmpdir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [*UNSHARE, *cmd],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, (out[-3000:], err[-3000:])
    lines = out.splitlines()
    start = max(i for i, ln in enumerate(lines) if ln == "{")  # `--json` prints the result last
    return json.loads("\n".join(lines[start:]))


def _state(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)["state"]


def _common(sample_shards, folder) -> list[str]:
    train_dir, _ = sample_shards
    return [
        "tiny",
        f"data.train={train_dir}",
        "data.eval=null",
        f"save_folder={folder}",
        "max_duration=4ba",
        "save_interval=2ba",
        "console=false",
    ]


@pytest.fixture(scope="session")
def two_node_run(sample_shards, tmp_path_factory):
    """One run of 4 batches on 2 nodes x 1 process (DDP over gloo), checkpoints at 2 and 4 batches (once per suite)."""

    def build(root) -> None:
        folder = root / "run"
        nodes = ["--nproc", "1", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
        nodes += ["--rendezvous-timeout", "600"]  # a loaded CI machine starts the two nodes seconds apart
        args = [*_common(sample_shards, folder), *nodes]
        node0 = _train([*args, "--node-rank", "0"], tmpdir=root / "tmp0")
        node1 = _train([*args, "--node-rank", "1"], tmpdir=root / "tmp1")
        (root / "results.json").write_text(json.dumps([_result(node0), _result(node1)]))

    root = shared_between_workers(tmp_path_factory, "two-node-run", build)
    return root / "run", json.loads((root / "results.json").read_text())


@needs_isolation
def test_two_nodes_train_one_run_over_gloo(two_node_run):
    folder, results = two_node_run
    for r in results:  # each node's `hbpe train` prints the run's result
        assert r["world_size"] == 2 and r["batches"] == 4 and r["device"] == "cpu"
    assert sorted(p.name for p in (folder / "stream-cache").iterdir()) == ["node0", "node1"]  # a cache per node
    state = _state(folder / "ep0-ba4-rank0.pt")
    # streaming's guidance: as many canonical nodes as the nodes the run started on, saved for resumption
    assert state["dataset_state"]["train"] == {
        "epoch": 0,
        "sample_in_epoch": 32,
        "num_canonical_nodes": 2,
        "shuffle_seed": 17,
        "initial_physical_nodes": 2,
    }


@needs_isolation
def test_a_two_node_run_resumes_on_one_node_in_the_same_order(two_node_run, sample_shards, tmp_path):
    folder, _ = two_node_run
    resumed = tmp_path / "resumed"
    args = [*_common(sample_shards, resumed), f"load_path={folder / 'ep0-ba2-rank0.pt'}"]
    r = _result(_train([*args, "--nproc", "2", "--master-port", str(free_port())], tmpdir=tmp_path / "tmp"))
    assert r["world_size"] == 2 and r["batches"] == 4
    full, cut = _state(folder / "ep0-ba4-rank0.pt"), _state(resumed / "ep0-ba4-rank0.pt")
    assert cut["dataset_state"]["train"]["num_canonical_nodes"] == 2  # the checkpoint's, not this node count's 1
    assert full["model"].keys() == cut["model"].keys()
    for k in full["model"]:  # the same samples on the same ranks: the same weights, bit for bit
        torch.testing.assert_close(cut["model"][k], full["model"][k], rtol=0, atol=0, msg=k)


def test_the_launcher_command_of_one_node_of_several():
    argv = launcher_command(
        "tiny", ["max_duration=2ba"], nproc=8, nnodes=4, node_rank=3, master_addr="10.0.0.1", master_port=29500
    )
    assert argv[1:] == [
        "-m",
        "composer.cli.launcher",
        "-n",
        "8",
        "--world_size",
        "32",
        "--node_rank",
        "3",
        "--master_addr",
        "10.0.0.1",
        "--master_port",
        "29500",
        "-m",
        "hbpe.training.train.launch",
        "tiny",
        "max_duration=2ba",
    ]


@pytest.mark.parametrize(
    "flags,match",
    [
        (["--nnodes", "2"], r"^Error: --nnodes 2 needs --node-rank, --master-addr, --master-port: every node runs"),
        (["--nnodes", "2", "--node-rank", "0", "--master-addr", "h"], r"^Error: --nnodes 2 needs --master-port:"),
        (
            ["--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--master-port", "29500"],
            r"^Error: --node-rank 2 is not a node of --nnodes 2 \(0\.\.1\)$",
        ),
        (["--node-rank", "1"], r"^Error: --node-rank and --master-addr are for several nodes: add --nnodes N$"),
        (["--master-port", "29500"], r"^Error: --master-port is for several processes: add --nproc N or --nnodes N$"),
        (
            ["--nproc", "3"],
            r"^error: global_batch_size 8 is not divisible by the 3 processes \(--nnodes 1 x --nproc 3\); "
            r"e\.g\. global_batch_size=6$",
        ),
    ],
)
def test_node_flags_are_checked_before_anything_starts(flags, match, tmp_path):
    r = CliRunner().invoke(main, ["train", "tiny", f"data.train={tmp_path}", "data.eval=null", *flags])
    assert r.exit_code == 2, r.output
    [line] = [ln for ln in r.output.splitlines() if ln.lower().startswith("error: ")]
    assert re.match(match, line), line


def test_a_new_run_needs_canonical_nodes_that_divide_its_nodes(tmp_path):
    from hbpe.schemas.errors import ConfigError
    from hbpe.training.train.config_io import load_config
    from hbpe.training.train.trainer import check_canonical_nodes

    def cfg(*extra):
        return load_config("tiny", ["data.train=s", f"save_folder={tmp_path}", *extra], check_paths=False)

    check_canonical_nodes(cfg(), nodes=3)  # null: streaming takes the node count itself
    check_canonical_nodes(cfg("data.num_canonical_nodes=8"), nodes=2)
    check_canonical_nodes(cfg("data.num_canonical_nodes=2"), nodes=8)
    with pytest.raises(ConfigError, match=r"^data\.num_canonical_nodes=3 and the 2 nodes of this run do not divide"):
        check_canonical_nodes(cfg("data.num_canonical_nodes=3"), nodes=2)
    # resuming, streaming takes the checkpoint's value and re-partitions the same order for any node count
    (tmp_path / "latest-rank0.pt").write_bytes(b"")
    check_canonical_nodes(cfg("data.num_canonical_nodes=3", "autoresume=true"), nodes=2)
