import json

from click.testing import CliRunner

from hbpe.cli import main
from tests.conftest import SAMPLE_ZH

IN_MEMORY = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def test_convert_and_shard_commands(tmp_path, gpt2_tokenizer_dir):
    out = tmp_path / "shards"
    args = [
        "convert",
        "--tokenizer",
        str(gpt2_tokenizer_dir),
        "--input",
        str(SAMPLE_ZH),
        "--out",
        str(out),
        "--seq-len",
        "256",
        "--tail",
        "pad",
        *IN_MEMORY,
    ]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "read = written + rejected: OK" in r.output and "documents read" in r.output
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "pass --overwrite" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["shards", "verify", "--data", str(out)])
    assert r.exit_code == 0 and r.output.startswith("OK")
    r = CliRunner().invoke(main, ["shards", "inspect", "--data", str(out), "--json"])
    info = json.loads(r.output)
    assert info["columns"] == {"num_bytes": "int64", "tokens": "ndarray:int32:256"}  # lean: patches derived
    assert info["samples_preview"][0]["text"]
    r = CliRunner().invoke(main, ["shards", "stats", "--data", str(out), "--json"])
    assert json.loads(r.output)["counts"]["documents_written"] == 40
    r = CliRunner().invoke(main, ["shards", "export-text", "--data", str(out), "--out", str(tmp_path / "x.jsonl")])
    assert r.exit_code == 0 and "wrote 40 documents" in r.output
    (out / "COMPLETED").unlink()
    r = CliRunner().invoke(main, ["shards", "verify", "--data", str(out)])
    assert r.exit_code == 2 and "no COMPLETED marker" in r.output
