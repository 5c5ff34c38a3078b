import os
import re
import subprocess
import tomllib

import pytest
from packaging.specifiers import SpecifierSet

from hbpe.pipeline.beam.convert import default_pipeline_options
from tests.conftest import REPO


def _names(reqs):
    return {re.split(r"[\[<>=!~ ]", r, maxsplit=1)[0].lower(): re.sub(r"\[.*?\]", "", r).replace(" ", "") for r in reqs}


def test_worker_requirements_match_pyproject():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    lines = [
        ln.strip()
        for ln in (REPO / "infra" / "worker-requirements.txt").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    # the same packages; a range in pyproject.toml is pinned in the images to the tested version (constraints.txt)
    tested = dict(
        ln.split("==", 1) for ln in (REPO / "constraints.txt").read_text().splitlines() if "==" in ln and ln[0] != "#"
    )
    want = _names(deps)
    for name, spec in _names(lines).items():
        pinned = spec.partition("==")[2]
        assert spec == want[name] or pinned == tested.get(name), (spec, want[name])
    assert set(_names(lines)) == set(want)


def test_runner_options_parse():
    from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, StandardOptions

    local = default_pipeline_options([])
    assert local.view_as(StandardOptions).runner == "DirectRunner"
    assert local.view_as(DirectOptions).direct_running_mode == "multi_processing"
    df = default_pipeline_options(
        ["--runner=DataflowRunner", "--project=p", "--region=europe-west4", "--temp_location=gs://b/tmp"]
    )
    assert df.view_as(StandardOptions).runner == "DataflowRunner"
    assert df.view_as(GoogleCloudOptions).region == "europe-west4"
    fl = default_pipeline_options(["--runner=FlinkRunner", "--flink_master=host:8081", "--parallelism=64"])
    assert fl.get_all_options()["flink_master"] == "host:8081" and fl.get_all_options()["parallelism"] == 64


def _script_command(tmp_path, script: str, *args: str) -> list[str]:
    """The `hbpe` command line an infra script builds: run it with `hbpe` and `gsutil` on PATH recording argv."""
    import os
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv"
    (bin_dir / "hbpe").write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" > {record}\n')
    (bin_dir / "gsutil").write_text("#!/usr/bin/env bash\nexit 0\n")  # the tokenizer copy: no bucket here
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", str(REPO / "infra" / script), *args], env=env, check=True, timeout=60)
    return record.read_bytes().decode().split("\0")[:-1]


def _check_convert_command(argv: list[str]) -> list[str]:
    """Parse it as `hbpe convert` does (click, then Beam's own parser for the rest); -> the Beam options,
    `--runner` (an hbpe option that hands it on to Beam) included."""
    from hbpe.cli.convert import convert
    from hbpe.pipeline.beam.options import check_pipeline_args

    assert argv[0] == "convert"
    ctx = convert.make_context("convert", argv[1:])
    assert ctx.params["seq_len"] == 1024
    check_pipeline_args(ctx.args)  # raises on an option neither hbpe nor Beam knows
    return [f"--runner={ctx.params['runner']}", *ctx.args]


def test_dataflow_script_builds_a_valid_command(tmp_path):
    argv = _script_command(
        tmp_path, "dataflow.sh", "proj", "europe-west4", "gs://b/tok", "gs://b/corpus/*.jsonl.zst", "gs://b/shards"
    )
    beam = _check_convert_command(argv)
    opts = default_pipeline_options(beam)
    from apache_beam.options.pipeline_options import GoogleCloudOptions, SetupOptions, StandardOptions

    assert opts.view_as(StandardOptions).runner == "DataflowRunner"
    assert opts.view_as(GoogleCloudOptions).project == "proj"
    assert opts.view_as(GoogleCloudOptions).temp_location == "gs://b/shards-tmp"
    assert opts.view_as(SetupOptions).setup_file == str(REPO / "setup.py") and (REPO / "setup.py").is_file()


def test_flink_script_builds_a_valid_command(tmp_path):
    argv = _script_command(tmp_path, "flink.sh", "flink:8081", "tok", "s3://b/c/*.jsonl", "s3://b/shards", "img:1")
    beam = _check_convert_command(argv)
    from apache_beam.options.pipeline_options import PortableOptions, StandardOptions

    opts = default_pipeline_options(beam)
    assert opts.view_as(StandardOptions).runner == "FlinkRunner"
    assert opts.view_as(PortableOptions).environment_config == "img:1"


def test_dask_script_builds_a_valid_command(tmp_path):
    from hbpe.pipeline.beam.options import DASK, choose_runner

    argv = _script_command(tmp_path, "dask.sh", "sched:8786", "s3://b/tok", "s3://b/c/*.jsonl.zst", "s3://b/shards")
    assert _check_convert_command(argv) == [f"--runner={DASK}"]  # no Beam option
    params = _convert_params(argv)
    choice = choose_runner(params["runner"], [], output="s3://b/shards", files=[], dask_address=params["dask_address"])
    assert (choice.name, choice.dask_address) == (DASK, "tcp://sched:8786")


def _convert_params(argv: list[str]) -> dict:
    from hbpe.cli.convert import convert

    return convert.make_context("convert", argv[1:]).params


def test_dockerfile_matches_the_launcher_and_the_package():
    """The SDK image is the installed apache-beam's (the harness must match the launcher), and every
    folder pyproject maps into the hbpe package is copied into the image."""
    import apache_beam

    text = (REPO / "infra" / "Dockerfile").read_text()
    assert f"FROM apache/beam_python3.11_sdk:{apache_beam.__version__}\n" in text
    _check_installs_the_package(text)


def _check_installs_the_package(text: str) -> None:
    """A Dockerfile installs the pinned stack, then hbpe from a copy of everything its build reads: the package root and
    every folder its links reach, setup.py (the C kernels), and the readme and license files pyproject names."""
    assert "COPY infra/worker-requirements.txt /tmp/worker-requirements.txt\n" in text
    assert "RUN pip install --no-cache-dir -r /tmp/worker-requirements.txt\n" in text
    assert "pip install --no-cache-dir --no-deps ." in text
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    # the package root (src/), and every folder its links reach (hbpe/ -> training/, data/sample, ...)
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    for root in ("src", "hbpe"):
        for link in (p for p in (REPO / root).iterdir() if p.is_symlink()):
            target = link.resolve().relative_to(REPO)
            folders.add(target.as_posix() if target.parts[0] == "data" else target.parts[0])
    assert {"src", "hbpe", "pipeline", "training", "schemas", "data/sample"} <= folders
    for folder in folders:
        assert f"COPY {folder} {folder}\n" in text, folder
    files = re.search(r"^COPY (.+) \./$", text, re.M).group(1).split()
    needed = ["pyproject.toml", "setup.py", pyproject["project"]["readme"], *pyproject["project"]["license-files"]]
    assert set(needed) <= set(files), set(needed) - set(files)
    assert all((REPO / f).is_file() for f in needed)


def test_train_dockerfile_installs_the_package_on_the_python_pyproject_requires():
    """The training image: a Python that `requires-python` allows, the pinned stack (torch's CUDA build), the
    package with its C kernels (checked importable at build time), and `hbpe` as the entry point."""
    text = (REPO / "infra" / "train.Dockerfile").read_text()
    _check_installs_the_package(text)
    requires = SpecifierSet(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"])
    assert "3.11" in requires and re.search(r"^FROM python:3\.11-slim-bookworm$", text, re.M)  # the pinned stack's
    # the tested stack, not a range: the torch wheel decides the image's CUDA (2.7.0: CUDA 12.6, as the comment says)
    assert "torch==2.7.0" in (REPO / "infra" / "worker-requirements.txt").read_text().splitlines()
    assert 'cd / && python -c "import hbpe.pipeline.tokenizer.second_stage._merge_core"' in text
    assert 'ENTRYPOINT ["hbpe"]\n' in text


def _parse_train(argv: list[str]):
    """Parse a command line as `hbpe train` does (click), and check its node flags as `hbpe train` does before it
    starts anything; -> click's parameters."""
    from hbpe.cli.train import check_nodes, train_cmd

    assert argv[:1] == ["train"], argv
    p = train_cmd.make_context("train", argv[1:]).params
    check_nodes(p["nproc"], p["nnodes"], p["node_rank"], p["master_addr"], p["master_port"])
    return p


def _fake_slurm(tmp_path, env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess, dict[int, list[str]]]:
    """Run infra/slurm/train.sbatch in bash as sbatch would on node 0, with `scontrol` expanding the nodelist,
    `srun` running its command once per node (SLURM_NODEID=0..SLURM_NNODES-1) and `hbpe` recording its argv;
    -> (the script's run, {node id: argv of its `hbpe`})."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shims = {
        "hbpe": f'printf "%s\\0" "$@" > {tmp_path}/hbpe.$SLURM_NODEID',
        "scontrol": '[ "$*" = "show hostnames gpu-a[07-08]" ] || exit 1; printf "gpu-a07\\ngpu-a08\\n"',
        "srun": (
            f'printf "%s\\0" "$@" > {tmp_path}/srun; while [[ $1 == --* ]]; do shift; done\n'
            'for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i "$@" || exit; done'
        ),
    }
    for name, body in shims.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    slurm_free = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SRUN_", "HBPE_"))}
    run = subprocess.run(
        ["bash", str(REPO / "infra" / "slurm" / "train.sbatch"), *args],
        env={**slurm_free, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    nodes = {int(f.suffix[1:]): f.read_bytes().decode().split("\0")[:-1] for f in tmp_path.glob("hbpe.*")}
    return run, nodes


# as sbatch sets them in the batch script, on node 0 (srun sets SLURM_NODEID per task)
SLURM_JOB = {"SLURM_JOB_NODELIST": "gpu-a[07-08]", "SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_ID": "4242"}
INDEX_ANNOTATION = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"  # apache.org/licenses/LICENSE-2.0.txt, byte for byte


@pytest.mark.parametrize(("env", "nproc"), [({"SLURM_GPUS_ON_NODE": "8"}, 8), ({"HBPE_NPROC": "2"}, 2)])
def test_slurm_script_runs_one_hbpe_train_per_node(tmp_path, env, nproc):
    overrides = ["data.train=s3://b/shards-train", "save_folder=/shared fs/runs/small"]  # a space survives
    run, nodes = _fake_slurm(tmp_path, {**SLURM_JOB, **env}, "small", *overrides)
    assert run.returncode == 0, run.stderr
    assert f"hbpe-train: 2 nodes x {nproc} processes, node 0 = gpu-a07:29500" in run.stderr
    srun = (tmp_path / "srun").read_bytes().decode().split("\0")
    assert "--ntasks-per-node=1" in srun and "--kill-on-bad-exit=1" in srun
    assert sorted(nodes) == [0, 1]
    for node_id, argv in nodes.items():
        p = _parse_train(argv)
        assert (p["config"], list(p["overrides"])) == ("small", overrides)
        assert (p["nproc"], p["nnodes"], p["node_rank"]) == (nproc, 2, node_id)
        assert (p["master_addr"], p["master_port"]) == ("gpu-a07", 29500)  # the nodelist's first host


def test_slurm_script_without_gpus_names_the_fix(tmp_path):
    run, nodes = _fake_slurm(tmp_path, SLURM_JOB, "small")
    assert run.returncode == 2 and not nodes
    assert run.stderr.strip() == (
        "error: no GPUs allocated (SLURM_GPUS_ON_NODE is unset): submit with --gpus-per-node=N, or set HBPE_NPROC=N"
    )


def _kubelet_expand(arg: str, env: dict[str, str]) -> str:
    """$(NAME) in a container's command/args is replaced by NAME from the container's env; $$ is a literal $."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]) if m[1] else "$", arg)


def test_kubernetes_job_runs_one_node_rank_per_index():
    import yaml

    docs = {d["kind"]: d for d in yaml.safe_load_all((REPO / "infra" / "k8s" / "train.yaml").read_text())}
    service, job = docs["Service"], docs["Job"]
    pod = job["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert service["spec"]["clusterIP"] == "None"  # headless: a DNS name per pod
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    assert pod["spec"]["restartPolicy"] == "Never"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    index_env = {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath": INDEX_ANNOTATION}}}
    assert index_env in container["env"]  # declared, so the kubelet expands $(JOB_COMPLETION_INDEX)
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert container["command"] == ["hbpe", "train"]
    for index in range(spec["completions"]):
        argv = [_kubelet_expand(a, {"JOB_COMPLETION_INDEX": str(index)}) for a in container["args"]]
        p = _parse_train(["train", *argv])
        assert spec["parallelism"] == spec["completions"] == p["nnodes"] == 2  # every node at once
        assert p["node_rank"] == index and p["nproc"] == gpus
        # pod i's host name is JOB-i, and the Service (the pods' subdomain) makes it resolvable
        assert p["master_addr"] == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
        assert p["master_port"] in {port["port"] for port in service["spec"]["ports"]}
        assert p["master_port"] in {port["containerPort"] for port in container["ports"]}
    from hbpe.training.train.config_io import load_config

    cfg = load_config(p["config"], list(p["overrides"]))
    assert cfg.global_batch_size % (p["nnodes"] * p["nproc"]) == 0 and cfg.autoresume
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}  # not the container's 64 MB


def test_license_file_and_the_setuptools_that_reads_its_metadata():
    """`license = "Apache-2.0"` (an SPDX expression) and `license-files` need setuptools 77 (PEP 639): an older
    one refuses the string; the file the metadata declares is the Apache License 2.0."""
    import hashlib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    (setuptools,) = [r for r in pyproject["build-system"]["requires"] if r.startswith("setuptools")]
    assert int(re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools)[1]) >= 77, setuptools
    assert pyproject["project"]["license-files"] == ["LICENSE"]
    assert hashlib.md5((REPO / "LICENSE").read_bytes()).hexdigest() == APACHE_2_MD5


def test_infra_readme_names_the_default_runner_of_convert():
    from hbpe.cli.convert import convert

    (default,) = [p.default for p in convert.params if p.name == "runner"]
    rows = re.findall(r"^\| ([^|]+?) \(default\) \|", (REPO / "infra" / "README.md").read_text(), re.M)
    assert rows == [default] == ["auto"]
