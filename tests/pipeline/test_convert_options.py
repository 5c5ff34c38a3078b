"""Options of `hbpe convert`: unknown ones are errors, a remote runner's job is shown, and progress is reported."""

from __future__ import annotations

import io
import json
import shutil
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from hbpe.pipeline.beam.convert import run_convert
from hbpe.pipeline.beam.options import check_pipeline_args, default_pipeline_options
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import ConfigError
from tests.conftest import SAMPLE_EN, SAMPLE_ZH
from tests.helpers import dir_bytes, without_timing


def test_cli_refuses_unknown_options_with_the_likely_fix(tmp_path, gpt2_tokenizer_dir):
    from hbpe.cli import main

    args = [
        "convert",
        "--tokenizer",
        str(gpt2_tokenizer_dir),
        "--input",
        str(SAMPLE_ZH),
        "--out",
        str(tmp_path / "o"),
    ]
    r = CliRunner().invoke(main, [*args, "--seq_len", "64"])  # it used to be dropped, and N=1024 used
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert (
        "error: unknown option(s) --seq_len 64: neither hbpe convert nor Beam knows them "
        "(did you mean --seq-len for --seq_len?)" in r.output
    )
    r = CliRunner().invoke(main, [*args, "--direct_num_worker=2"])
    assert r.exit_code == 2 and "(did you mean --direct_num_workers for --direct_num_worker?)" in r.output
    r = CliRunner().invoke(main, [*args, "stray"])
    assert r.exit_code == 2 and "error: unknown option(s) stray: neither hbpe convert nor Beam knows them;" in r.output
    assert not (tmp_path / "o").exists()


def test_a_mistyped_secret_option_is_named_without_its_value(tmp_path, gpt2_tokenizer_dir):
    """Issue 20: `--s3_secret_acces_key=...` (a typo) echoed the secret to stderr."""
    from hbpe.cli import main

    args = ["convert", "--tokenizer", str(gpt2_tokenizer_dir), "--input", str(SAMPLE_ZH), "--out", str(tmp_path / "o")]
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    for extra in (
        [f"--s3_secret_acces_key={secret}"],
        ["--s3_secret_acces_key", secret],
        [f"--aws_sesion_token={secret}"],
        [f"--db_pasword={secret}"],
    ):
        r = CliRunner().invoke(main, [*args, *extra])
        assert r.exit_code == 2 and "unknown option(s) " + extra[0].split("=")[0] in r.output, r.output
        assert secret not in r.output and "***" in r.output


def test_library_refuses_unknown_beam_options(tmp_path, gpt2_tokenizer_dir):
    cfg = ConvertConfig(inputs=(str(SAMPLE_ZH),), output=str(tmp_path / "o"), tokenizer=str(gpt2_tokenizer_dir))
    with pytest.raises(ConfigError, match=r"unknown option\(s\) --no_such_option=1: neither hbpe convert nor Beam"):
        run_convert(cfg, ["--direct_num_workers=1", "--no_such_option=1"], progress=False)
    assert not (tmp_path / "o").exists()
    check_pipeline_args(["--runner=DataflowRunner", "--project=p", "--region", "europe-west4", "--save_main_session"])
    opts = default_pipeline_options(["--runner=FlinkRunner", "--flink_master=host:8081"])
    assert opts.get_all_options()["flink_master"] == "host:8081"


def test_remote_style_runner_shows_its_job_and_writes_the_same_bytes(tmp_path, gpt2_tokenizer_dir):
    """PortableRunner with an embedded job service: a real job id, state and counters, polled as for Flink or Spark."""
    lines: list[str] = []
    outs = {}
    for name, runner, args in (
        ("portable", "PortableRunner", ["--job_endpoint=embed", "--environment_type=LOOPBACK"]),
        ("inprocess", "inprocess", []),
    ):
        cfg = ConvertConfig(
            inputs=(str(SAMPLE_ZH),), output=str(tmp_path / name), tokenizer=str(gpt2_tokenizer_dir), seq_len=128
        )
        run_convert(cfg, args, runner=runner, progress=False, on_message=lines.append)
        outs[name] = without_timing(dir_bytes(tmp_path / name))
    assert outs["portable"] == outs["inprocess"]
    assert lines[0] == "runner: PortableRunner (--runner)"
    assert lines[1].startswith("[beam] submitted to PortableRunner: job job-")
    assert lines[-2].startswith("[beam] DONE ") and ": units " in lines[-2]


def test_dataflow_job_link():
    pytest.importorskip("apache_beam.runners.dataflow.dataflow_runner")
    from apache_beam.runners.dataflow.dataflow_runner import DataflowPipelineResult

    from hbpe.pipeline.beam.monitor import job_link, progress_line

    opts = default_pipeline_options(
        ["--runner=DataflowRunner", "--project=my-proj", "--region=europe-west4", "--temp_location=gs://b/tmp"]
    )
    job = SimpleNamespace(id="2026-11-23_12_00_00-123", currentState=None)  # the Dataflow API's Job message
    assert job_link(DataflowPipelineResult(job, runner=None, options=opts), opts) == (
        "https://console.cloud.google.com/dataflow/jobs/europe-west4/2026-11-23_12_00_00-123?project=my-proj"
    )
    c = {"units_encoded": 3, "documents_read": 1234, "bytes": 56_700_000, "shards_written": 0}
    assert progress_line("RUNNING", c, 12, 42.4) == (
        "[beam] RUNNING 42s: units 3/12, 1,234 documents, 56.7 MB of text, shards 0"
    )


def test_progress_reads_documents_mb_rate_and_eta_from_staging(tmp_path, gpt2_tokenizer_dir):
    """Two units committed, a third in flight (its progress file): the line a log gets every 10 s."""
    from hbpe.pipeline.beam.progress_bar import ConvertProgress, unit_input_bytes
    from hbpe.pipeline.beam.units import encode_unit, unit_progress_path
    from hbpe.pipeline.corpus.documents import RecordPolicy
    from hbpe.pipeline.corpus.files import file_info, plan_units
    from hbpe.pipeline.tokenizer import artifact

    src = tmp_path / "a.jsonl.zst"
    shutil.copy(SAMPLE_EN, src)
    files = [file_info(str(src)), file_info(str(SAMPLE_ZH))]
    units = plan_units(files, split_bytes=1 << 20)
    staging = str(tmp_path / "staging")
    tok = artifact.load(str(gpt2_tokenizer_dir))
    sums = [encode_unit(tok, u, staging, RecordPolicy(), text_unit="file", batch_docs=8) for u in units]
    weights = unit_input_bytes(units, files)
    assert weights == [f.size for f in files]
    (tmp_path / "staging" / "units" / "unit-000001.json").unlink()  # unit 1 back in flight, half read
    path = unit_progress_path(staging, 1)
    (tmp_path / "staging" / "progress").mkdir(exist_ok=True)  # encode_unit removes its file, not the folder
    with open(path, "w") as f:
        json.dump({"documents": 7, "text_bytes": 1000, "input_bytes": weights[1] // 2}, f)
    out = io.StringIO()
    p = ConvertProgress(staging, weights, stream=out)
    s = p.snapshot()
    assert s["documents"] == sums[0].counts.documents_read + 7 and s["units"] == 1
    assert s["mb"] == pytest.approx((weights[0] + weights[1] // 2) / 1e6)
    line = p.line(s)
    total = sum(weights) / 1e6
    assert line.startswith(f"[convert]:  {100 * s['mb'] / total:.0f}% {s['mb']:.1f}/{total:.1f} MB [00:00<")
    assert f"MB/s, {s['documents']:,} docs, " in line and "MB text at" in line and "units 1/2, shards 0" in line
    p.start()
    p.stop({"counts": {"documents_read": 60, "bytes": 2_000_000}, "shards": ["a", "b"]})
    assert out.getvalue().splitlines()[-1].startswith(f"[convert]: 100% {total:.1f}/{total:.1f} MB")
    assert "60 docs, 2.0 MB text at" in out.getvalue() and "units 2/2, shards 2" in out.getvalue()
