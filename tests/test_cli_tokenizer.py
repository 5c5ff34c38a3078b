import json

from click.testing import CliRunner

from hbpe.cli import main
from tests.conftest import SAMPLE_EN


def run(*args, input=None):
    r = CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)
    return r


def test_train_info_encode_decode(tmp_path):
    out = tmp_path / "tok"
    r = run("tokenizer", "train", "--encoding", "gpt2", "--max-patch-size", 10, "--out", out)
    assert r.exit_code == 0, r.output
    assert "211 merges, V'=470" in r.output
    r = run("tokenizer", "info", "--tokenizer", out, "--json", "--plot", tmp_path / "h.png")
    info = json.loads(r.output)
    assert info["vocab_size"] == 470 and info["max_patch_size"] == 10
    assert sum(info["histogram_before"]) == sum(info["histogram_after"]) == 50256
    assert (tmp_path / "h.png").stat().st_size > 1000
    text = "Fellow-Citizens 你好 🎉\n"
    enc = run("tokenizer", "encode", "--tokenizer", out, input=text.encode())
    obj = json.loads(enc.output)
    assert len(obj["tokens"]) == len(obj["patches"])
    assert all(p[-1] == 256 or p[-1] >= 259 for p in obj["patches"])
    dec = run("tokenizer", "decode", "--tokenizer", out, input=enc.output)
    assert dec.output == text


def test_errors_are_one_line(tmp_path):
    r = CliRunner().invoke(main, ["tokenizer", "info", "--tokenizer", str(tmp_path)])
    assert r.exit_code == 2
    assert "error:" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["tokenizer", "train", "--encoding", "nope", "-S", "8", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "unknown encoding 'nope'" in r.output


def test_stats_and_bench(gpt2_tokenizer_dir):
    r = run("tokenizer", "stats", "--tokenizer", gpt2_tokenizer_dir, "--input", SAMPLE_EN, "--json")
    st = json.loads(r.output)
    assert st["documents"] == 24 and st["rejected"] == 0
    assert 4.0 < st["bytes_per_token"] < 5.5
    assert 1.0 < st["fertility"] < 1.6
    assert 2.0 < st["symbols_per_patch"] < st["bytes_per_token"] + 1
    args = ("--tokenizer", gpt2_tokenizer_dir, "--input", SAMPLE_EN, "--repeat", 1, "--load-repeat", 2, "--json")
    b = json.loads(run("bench", "tokenizer", *args).output)
    assert b["merges"] == 211 and b["mb_per_s"]["hbpe_encode"] > 0 and b["ratio_batch"] > 0
    load = b["load"]  # timed side by side: from the artifact's own tables, and parsed + built
    assert load["tables"] == "the artifact's" and [len(load["runs"][k]) for k in load["seconds"]] == [2, 2]


def test_flops_with_data_runs_outside_the_repo_root(sample_shards, tmp_path, monkeypatch):
    """`--data` replaces the config's data paths: tiny.yaml's relative runs/demo/... need not exist here."""
    monkeypatch.chdir(tmp_path)
    train_dir, _ = sample_shards
    r = run("flops", "tiny", "--data", train_dir, "--samples", 4, "--bytes", 1024, "--json")
    assert r.exit_code == 0, r.output
    rows = {row["io"]: row for row in json.loads(r.output)}
    assert rows.keys() >= {"bpe", "bytes"} and rows["bytes"]["bytes_per_patch"] == 1.0
    r = run("flops", "tiny", "--data", tmp_path / "missing", "--samples", 4)
    assert r.exit_code == 2 and f"data.train path {tmp_path / 'missing'} does not exist" in r.output
