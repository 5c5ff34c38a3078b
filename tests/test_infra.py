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
