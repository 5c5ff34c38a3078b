import re
import tomllib

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
    assert _names(lines) == _names(deps)


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
    from hbpe.cli_data import convert
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


def test_dockerfile_matches_the_launcher_and_the_package():
    """The SDK image is the installed apache-beam's (the harness must match the launcher), and every
    folder pyproject maps into the hbpe package is copied into the image."""
    import apache_beam

    text = (REPO / "infra" / "Dockerfile").read_text()
    assert f"FROM apache/beam_python3.11_sdk:{apache_beam.__version__}\n" in text
    assert "pip install --no-cache-dir -r /tmp/worker-requirements.txt" in text
    folders = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    for folder in folders:
        assert f"COPY {folder} {folder}\n" in text, folder
