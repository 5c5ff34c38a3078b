import dataclasses
import json

import click
import pytest
from click.testing import CliRunner

from hbpe.cli import main
from hbpe.schemas.errors import ConfigError
from tests.helpers import cli_fails


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
        main, ["tokenizer", "train-bpe", "--input", str(SAMPLE_ZH), "--vocab-size", "600", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert "trained a 600-token first stage" in r.output and (tmp_path / "zh.json").exists()
    r = CliRunner().invoke(
        main, ["tokenizer", "train", "--encoding", str(out), "-S", "6", "--out", str(tmp_path / "tok")]
    )
    assert r.exit_code == 0 and "V'=" in r.output


# --------------------------------------------------------------------------- one clear line for user mistakes


@pytest.mark.parametrize(
    "override,message",
    [
        ("optim.lr=abc", "optim.lr: got 'abc' (a string), expected a finite number; e.g. optim.lr=0.001"),
        ("global_batch_size=abc", "global_batch_size: got 'abc' (a string), expected an integer"),
        ("global_batch_size=1.5", "global_batch_size: got 1.5 (a number), expected an integer"),
        ("seed=true", "seed: got True (a boolean), expected an integer; e.g. seed=17"),
        ("max_duration=banana", "max_duration: got 'banana' (a string), expected a Composer time string"),
        ("eval_interval=10", "eval_interval: got 10 (an integer), expected a Composer time string"),
        ("save_interval=1.5ep", "save_interval=1.5ep: ep counts whole units"),
        ("optim.warmup=fast", "optim.warmup: got 'fast' (a string), expected a Composer time string"),
        ("precision=fp64", "precision: got 'fp64', expected one of auto, fp32, amp_fp16, amp_bf16"),
        ("device=tpu", "device: got 'tpu', expected one of auto, cpu, gpu, mps"),
        ("model.latent_layer=3", "unknown config keys ['model.latent_layer'] (did you mean model.latent_layers?)"),
        ("data.shards=x", "unknown config keys ['data.shards']; known in data: "),
        ("optim.beta1=0.9", "unknown config keys ['optim.beta1'] (did you mean optim.betas?); known in optim: "),
        ("data=3", "data: got 3 (an integer), expected a section with keys train, eval"),
        ("optim.betas=[0.9]", "optim.betas: got [0.9] (a list of 1), expected a list of 2 numbers"),
        ("optim.lr=.inf", "optim.lr: got inf (a number), expected a finite number"),
        ("nonsense_key=1", "unknown config keys ['nonsense_key']"),
    ],
)
def test_train_config_mistakes_are_one_line(override, message):
    r = CliRunner().invoke(main, ["train", "tiny", "data.train=somewhere", override])
    cli_fails(r, 2, message)


def test_train_tiny_outside_the_repo_names_the_missing_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["train", "tiny"])
    cli_fails(
        r,
        2,
        f"data.train path runs/demo/shards-train does not exist (relative to the current directory {tmp_path}); "
        "set data.train=DIR to a shard directory from `hbpe convert`",
    )
    r = CliRunner().invoke(main, ["bench", "train", "tiny", "--batches", "2"])
    cli_fails(r, 2, "data.train path runs/demo/shards-train does not exist")


@pytest.fixture(scope="module")
def trained_run(tiny_run):
    """The shared tiny run: 20 batches, enough to emit multi-byte patches, not enough to end documents."""
    return tiny_run


PROMPT = "Fellow-Citizens of the Senate"


def test_generate_never_exceeds_max_bytes(trained_run):
    from hbpe.training.checkpoint.load import load_model
    from hbpe.training.inference.generate import generate

    model, tok, _ = load_model(str(trained_run))
    bounded = 0
    for max_bytes in (1, 2, 3, 5, 8, 13, 40):
        for temperature, seed in ((0.0, 0), (0.8, 1), (0.8, 2)):
            g = generate(model, tok, PROMPT, max_bytes=max_bytes, temperature=temperature, seed=seed)
            new_text = g.text[len(PROMPT) :]
            assert g.text.startswith(PROMPT) and g.stopped in ("max_bytes", "eod"), g
            assert g.new_bytes <= max_bytes and len(new_text) <= max_bytes, (max_bytes, g)
            if g.stopped == "max_bytes":  # cut at a UTF-8 character, so at most 3 bytes short
                assert g.new_bytes >= max_bytes - 3, (max_bytes, g)
                bounded += 1
    assert bounded >= 15  # the limit, not the end of a document, stopped most runs


def test_generate_stops_when_the_latent_context_is_full(trained_run):
    from hbpe.training.checkpoint.load import load_model
    from hbpe.training.inference.generate import generate

    model, tok, _ = load_model(str(trained_run))
    model.cfg = dataclasses.replace(model.cfg, max_patches=24)  # a short context, so the test runs in a second
    prompt_patches = len(tok.encode(PROMPT))
    g = generate(model, tok, PROMPT, max_bytes=10**12, temperature=0.0)
    assert g.stopped == "context" and g.patches == 24 - 1 - prompt_patches + 1, g
    with pytest.raises(ConfigError, match=r"the prompt is \d+ patches and the model's latent context holds 24"):
        generate(model, tok, PROMPT * 10, max_bytes=10)


def test_generate_arguments_are_checked(trained_run):
    from hbpe.training.inference.generate import check_generate_args, cut_utf8

    with pytest.raises(ConfigError, match=r"the prompt is not valid UTF-8 \(byte 0xff at character 3\)"):
        check_generate_args("abc\udcff", max_bytes=10, temperature=0.0)
    for t in (float("inf"), float("nan"), -1.0):
        with pytest.raises(ConfigError, match=r"temperature=.*: must be a finite number >= 0 \(0 = greedy\)"):
            check_generate_args("abc", max_bytes=10, temperature=t)
    with pytest.raises(ConfigError, match=r"max_bytes=0: must be an integer >= 1"):
        check_generate_args("abc", max_bytes=0, temperature=0.0)
    assert cut_utf8("café".encode(), 4) == b"caf" and cut_utf8("café".encode(), 5) == "café".encode()
    assert cut_utf8("😀".encode(), 3) == b"" and cut_utf8(b"\x80\x80\x80\x80\x80", 4) == b"\x80" * 4

    folder = str(trained_run)
    r = CliRunner().invoke(main, ["generate", "--checkpoint", folder, "--prompt", "Fellow \udcff"])
    cli_fails(r, 2, "error: the prompt is not valid UTF-8 (byte 0xff at character 7); pass UTF-8 text")
    for t in ("inf", "nan"):
        r = CliRunner().invoke(main, ["generate", "--checkpoint", folder, "--prompt", "Fellow", "--temperature", t])
        cli_fails(
            r, 2, f"error: temperature={float(t)}: must be a finite number >= 0 (0 = greedy); e.g. --temperature 0.8"
        )
    r = CliRunner().invoke(main, ["generate", "--checkpoint", folder, "--prompt", "Fellow", "--max-bytes", "7"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("Fellow") and len(r.stdout.removesuffix("\n").encode()) - len(b"Fellow") <= 7
    assert "stopped: max_bytes" in r.stderr


@pytest.fixture
def failing_command():
    """A command that fails the way a bug or Ctrl-C would, registered on the real `hbpe` group."""

    @main.command("fail-for-test")
    @click.option("--kind", type=click.Choice(["bug", "interrupt"]))
    def fail(kind: str) -> None:
        if kind == "interrupt":
            raise KeyboardInterrupt
        {}["missing-key"]  # a real bug: KeyError

    yield
    main.commands.pop("fail-for-test")


def test_unexpected_errors_end_in_one_line(failing_command, monkeypatch):
    monkeypatch.delenv("HBPE_DEBUG", raising=False)
    r = CliRunner().invoke(main, ["fail-for-test", "--kind", "bug"])
    cli_fails(
        r,
        1,
        "error: internal error: KeyError: 'missing-key' (rerun with HBPE_DEBUG=1 for the traceback; please report it)",
    )
    r = CliRunner().invoke(main, ["fail-for-test", "--kind", "bug"], env={"HBPE_DEBUG": "1"})
    assert r.exit_code == 1 and "Traceback (most recent call last)" in r.output and '{}["missing-key"]' in r.output
    assert r.output.strip().splitlines()[-1].startswith("error: internal error: KeyError: 'missing-key'")
    r = CliRunner().invoke(main, ["fail-for-test", "--kind", "interrupt"])
    cli_fails(r, 130, "error: interrupted")
