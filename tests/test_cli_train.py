import json

from click.testing import CliRunner

from hbpe.cli import main


def test_train_eval_generate_commands(sample_shards, tmp_path):
    train_dir, eval_dir = sample_shards
    folder = tmp_path / "run"
    r = CliRunner().invoke(
        main,
        [
            "train",
            "tiny",
            f"data.train={train_dir}",
            f"data.eval={eval_dir}",
            f"save_folder={folder}",
            "max_duration=3ba",
            "eval_interval=3ba",
            "save_interval=3ba",
            "console=false",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    result = json.loads(r.output[r.output.index("{") :])
    assert result["batches"] == 3 and result["eval"]["BitsPerByte"] > 0
    r = CliRunner().invoke(
        main, ["eval", "--checkpoint", str(folder), "--data", str(eval_dir), "--max-batches", "2", "--json"]
    )
    assert r.exit_code == 0, r.output
    ev = json.loads(r.output[r.output.index("{") :])
    assert ev["bpb"] > 0 and 4.0 < ev["bytes_per_patch"] < 6.0
    r = CliRunner().invoke(main, ["generate", "--checkpoint", str(folder), "--prompt", "Fellow", "--max-bytes", "20"])
    assert r.exit_code == 0 and r.output.startswith("Fellow")
    r = CliRunner().invoke(main, ["train", "tiny", "nonsense_key=1"])
    assert r.exit_code == 2 and "unknown config keys ['nonsense_key']" in r.output
    r = CliRunner().invoke(main, ["eval", "--checkpoint", str(tmp_path / "nope.pt"), "--data", str(eval_dir)])
    assert r.exit_code == 2 and "does not exist" in r.output


def test_train_bpe_command(tmp_path):
    from tests.conftest import SAMPLE_ZH

    out = tmp_path / "zh.tiktoken"
    r = CliRunner().invoke(
        main, ["tokenizer", "train-bpe", "--corpus", str(SAMPLE_ZH), "--vocab-size", "600", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert "trained a 600-token first stage" in r.output and (tmp_path / "zh.json").exists()
    r = CliRunner().invoke(
        main, ["tokenizer", "train", "--encoding", str(out), "-S", "6", "--out", str(tmp_path / "tok")]
    )
    assert r.exit_code == 0 and "V'=" in r.output
