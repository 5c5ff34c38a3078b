"""The CLI is thin: commands are module attributes, the work is in the library, and the library never imports the CLI."""

from __future__ import annotations

import ast
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from hbpe.cli import (
    bench,
    common,
    config,
    convert,
    demo,
    evaluate,
    experiment,
    export,
    generate,
    main,
    plot,
    shards,
    tokenizer,
    train,
)
from hbpe.schemas.errors import HbpeError
from tests.conftest import IN_MEMORY_BEAM, REPO, SAMPLE_EN

# command path -> (module, attribute): every command is importable and testable without the group
COMMANDS = {
    ("demo",): (demo, "demo"),
    ("tokenizer",): (tokenizer, "tokenizer"),
    ("tokenizer", "train"): (tokenizer, "tokenizer_train"),
    ("tokenizer", "train-bpe"): (tokenizer, "tokenizer_train_bpe"),
    ("tokenizer", "tables"): (tokenizer, "tokenizer_tables"),
    ("tokenizer", "info"): (tokenizer, "tokenizer_info"),
    ("tokenizer", "encode"): (tokenizer, "tokenizer_encode"),
    ("tokenizer", "decode"): (tokenizer, "tokenizer_decode"),
    ("tokenizer", "stats"): (tokenizer, "tokenizer_stats"),
    ("convert",): (convert, "convert"),
    ("shards",): (shards, "shards"),
    ("shards", "inspect"): (shards, "shards_inspect"),
    ("shards", "verify"): (shards, "shards_verify"),
    ("shards", "export-text"): (shards, "shards_export"),
    ("shards", "stats"): (shards, "shards_stats"),
    ("train",): (train, "train_cmd"),
    ("eval",): (evaluate, "eval_cmd"),
    ("generate",): (generate, "generate_cmd"),
    ("bench",): (bench, "bench"),
    ("bench", "tokenizer"): (bench, "bench_tokenizer_cmd"),
    ("bench", "sweep"): (bench, "bench_sweep_cmd"),
    ("bench", "convert"): (bench, "bench_convert"),
    ("bench", "train"): (bench, "bench_train_cmd"),
    ("bench", "step"): (bench, "bench_step_cmd"),
    ("bench", "generate"): (bench, "bench_generate_cmd"),
    ("bench", "first-stage"): (bench, "bench_first_stage_cmd"),
    ("bench", "loader"): (bench, "bench_loader_cmd"),
    ("flops",): (experiment, "flops_cmd"),
    ("experiment",): (experiment, "experiment_cmd"),
    ("eval-tasks",): (evaluate, "eval_tasks_cmd"),
    ("export",): (export, "export_cmd"),
    ("checkpoint",): (export, "checkpoint_group"),
    ("checkpoint", "consolidate"): (export, "checkpoint_consolidate_cmd"),
    ("plot",): (plot, "plot_cmd"),
    ("config",): (config, "config_group"),
    ("config", "show"): (config, "config_show_cmd"),
}


def _registered(group, prefix=()):
    for name, cmd in group.commands.items():
        yield (*prefix, name), cmd
        if hasattr(cmd, "commands"):
            yield from _registered(cmd, (*prefix, name))


def test_commands_are_module_attributes():
    registered = dict(_registered(main))
    assert registered.keys() == COMMANDS.keys()
    for path, (module, attr) in COMMANDS.items():
        assert getattr(module, attr) is registered[path], path


def test_a_module_level_command_runs_without_the_group(gpt2_tokenizer_dir):
    r = CliRunner().invoke(tokenizer.tokenizer_encode, ["--tokenizer", str(gpt2_tokenizer_dir)], input=b"hi")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["tokens"] == [5303]


# --------------------------------------------------------------------------- layering

LIBRARY = ("schemas", "pipeline", "training")  # installed as hbpe.schemas, hbpe.pipeline, hbpe.training


def cli_imports(source: str) -> list[str]:
    """What `source` imports of the CLI: click, hbpe.cli*, hbpe.demo, or anything of the `hbpe` root but `__version__`."""
    bad = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name != "hbpe"]  # `import hbpe`: see its uses below
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "hbpe":
                names = [f"hbpe.{a.name}" for a in node.names if a.name != "__version__"]
            else:
                names = [node.module]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "hbpe":
            names = [] if node.attr == "__version__" else [f"hbpe.{node.attr}"]
        else:
            continue
        bad += [n for n in names if n == "click" or n.startswith(("click.", "hbpe.cli", "hbpe.demo"))]
    return bad


def test_the_layering_check_finds_cli_imports():
    assert cli_imports("import click\nfrom hbpe.cli.common import emit\nfrom hbpe import cli, __version__\n") == [
        "click",
        "hbpe.cli.common",
        "hbpe.cli",
    ]
    assert cli_imports("import hbpe\ndef f():\n    from click import echo\n    hbpe.cli.main()\n") == [
        "click",
        "hbpe.cli",
    ]
    assert cli_imports("import hbpe\nfrom hbpe.schemas.errors import HbpeError\nv = hbpe.__version__\n") == []


def test_the_library_never_imports_the_cli():
    files = [p for top in LIBRARY for p in sorted((REPO / top).rglob("*.py"))]
    assert len(files) > 30  # the walk found the library
    offenders = {str(p.relative_to(REPO)): bad for p in files if (bad := cli_imports(p.read_text()))}
    assert offenders == {}


def test_the_demo_reports_without_click():
    assert cli_imports((REPO / "hbpe" / "demo.py").read_text()) == []


def test_one_json_emitter():
    """Only hbpe/cli/common.py writes `--json` output; the command modules call its `emit`."""
    files = [p for p in sorted((REPO / "hbpe" / "cli").glob("*.py")) if p.name != "common.py"]
    assert len(files) >= 12  # the glob found the command modules
    for path in [*files, REPO / "hbpe" / "demo.py"]:
        tree = ast.parse(path.read_text())
        dumps = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "dumps"]
        assert not dumps, f"{path.relative_to(REPO)} line {dumps[0].lineno}: json.dumps outside hbpe.cli.common.emit"


def _front_door_files() -> list[Path]:
    hbpe_dir = REPO / "hbpe"
    return [
        *sorted((hbpe_dir / "cli").glob("*.py")),
        hbpe_dir / "demo.py",
        *sorted((hbpe_dir / "experiments").glob("*.py")),
    ]


def test_the_cli_the_demo_and_the_experiments_convert_and_train_through_hbpe_api():
    """One front door: none of them builds a ConvertConfig or calls run_convert / train_model itself (hbpe.api does)."""
    files = _front_door_files()
    assert len(files) > 20  # the globs found the modules
    for path in files:
        tree = ast.parse(path.read_text())
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not used & {"ConvertConfig", "run_convert", "train_model"}, path.relative_to(REPO)


def test_no_module_imports_a_private_name_of_another():
    """What the command modules share is public in hbpe/cli/common.py (Command, Group, emit, the options)."""
    for path in _front_door_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hbpe"):
                private = [a.name for a in node.names if a.name.startswith("_") and a.name != "__version__"]
                assert not private, f"{path.relative_to(REPO)}:{node.lineno} imports {private} from {node.module}"


# --------------------------------------------------------------------------- python -m hbpe.cli


def test_python_m_runs_the_cli():
    r = subprocess.run([sys.executable, "-m", "hbpe.cli", "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("hbpe, version "), r.stdout
    r = subprocess.run([sys.executable, "-m", "hbpe.cli", "tokenizer", "info"], capture_output=True, text=True)
    assert r.returncode == 2 and "Usage: hbpe tokenizer info" in r.stderr, r.stderr


# --------------------------------------------------------------------------- the library does the work


def test_encode_and_stats_print_what_the_library_returns(gpt2_tokenizer_dir):
    from hbpe.pipeline.tokenizer import artifact, json_io
    from hbpe.pipeline.tokenizer.stats import file_stats

    tok = artifact.load(gpt2_tokenizer_dir)
    text = "Fellow-Citizens 你好 🎉\n"
    r = CliRunner().invoke(main, ["tokenizer", "encode", "--tokenizer", str(gpt2_tokenizer_dir)], input=text.encode())
    obj = json_io.encode_to_dict(tok, text)
    assert r.output == json_io.dumps_encoded(obj) + "\n"
    assert obj["tokens"][:3] == [37, 5037, 12]  # "F", "ellow", "-": gpt2's ids, as tiktoken encodes them
    assert json_io.decode_from_dict(tok, obj) == text
    assert json_io.decode_from_dict(tok, {"tokens": obj["tokens"]}) == text

    args = ["tokenizer", "stats", "--tokenizer", str(gpt2_tokenizer_dir), "--input", str(SAMPLE_EN), "--json"]
    r = CliRunner().invoke(main, args)
    assert json.loads(r.output) == json.loads(json.dumps(file_stats(tok, [str(SAMPLE_EN)]).to_dict()))


def test_file_stats_counts_the_rejects(gpt2_tokenizer, tmp_path):
    from hbpe.pipeline.tokenizer.stats import file_stats

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "one two"}\n{"body": "no text field"}\n{"text": "three"}\n')
    st = file_stats(gpt2_tokenizer, [str(corpus)])
    assert (st.documents, st.rejected, st.bytes, st.words) == (2, 1, 12, 3)
    assert sum(st.reject_reasons.values()) == 1


@pytest.mark.parametrize(
    "data,message",
    [
        (b"\xff", r"input is not UTF-8 \(byte 0\); pass the output of `hbpe tokenizer encode`"),
        (b"{", r"input is not JSON \(.*\); pass the output of `hbpe tokenizer encode`"),
        (b"[1, 2]", r'input JSON needs a "patches" or "tokens" list'),
        (b'{"text": "hi"}', r'input JSON needs a "patches" or "tokens" list'),
    ],
)
def test_parse_encoded_rejects_what_encode_never_writes(data, message):
    from hbpe.pipeline.tokenizer.json_io import parse_encoded

    with pytest.raises(HbpeError, match=message):
        parse_encoded(data)


def test_decode_from_dict_checks_ids(gpt2_tokenizer):
    from hbpe.pipeline.tokenizer.json_io import decode_from_dict, text_from_bytes

    with pytest.raises(HbpeError, match=r'"patches" holds -1, not a symbol id of this tokenizer \(0\.\.469\)'):
        decode_from_dict(gpt2_tokenizer, {"patches": [[-1, 256]]})
    with pytest.raises(HbpeError, match=r'"patches" must be a list of lists of symbol ids'):
        decode_from_dict(gpt2_tokenizer, {"patches": [1, 2]})
    with pytest.raises(HbpeError, match=r'"tokens" holds True, not a first-stage token id of this tokenizer'):
        decode_from_dict(gpt2_tokenizer, {"tokens": [True]})
    with pytest.raises(HbpeError, match=r"input is not valid UTF-8 \(byte 3\); convert it to UTF-8 first"):
        text_from_bytes("café".encode("latin-1"))


def test_render_summary_flags_unbalanced_accounting():
    from hbpe.schemas.manifest import Counts

    def manifest(counts: Counts) -> dict:
        stats = {"bytes_per_patch": 4.0, "symbols_per_patch": 3.0, "fertility": 1.25}
        return {"counts": counts.__dict__, "statistics": stats, "seq_len": 8, "max_patch_size": 10, "mode": "full",
                "shards": ["shard.00000.mds"], "timing": {"wall_time_s": 1.0}}  # fmt: skip

    ok = convert.render_summary(manifest(Counts(documents_read=3, documents_written=2, documents_rejected=1)))
    assert ok.splitlines()[-1] == "accounting               read = written + rejected: OK"
    bad = convert.render_summary(manifest(Counts(documents_read=3, documents_written=1, documents_rejected=1)))
    assert bad.splitlines()[-1] == "accounting               read = written + rejected: MISMATCH"


def test_launcher_command():
    from hbpe.training.train.launch_command import launcher_command

    assert launcher_command("tiny", ("a=1", "b=x"), nproc=4) == [
        sys.executable, "-m", "composer.cli.launcher", "-n", "4",
        "-m", "hbpe.training.train.launch", "tiny", "a=1", "b=x",
    ]  # fmt: skip
    assert launcher_command("c.yaml", [], nproc=2, master_port=29511)[3:7] == ["-n", "2", "--master_port", "29511"]


def test_quiet_beam(monkeypatch):
    from hbpe.pipeline.beam.quiet import quiet_beam

    log = logging.getLogger("apache_beam")
    monkeypatch.setattr(log, "level", logging.NOTSET)
    monkeypatch.setenv("PYTHONWARNINGS", "default::DeprecationWarning")
    quiet_beam()
    quiet_beam()  # idempotent: the filter goes in once
    assert log.level == logging.ERROR
    warnings = __import__("os").environ["PYTHONWARNINGS"].split(",")
    assert warnings[0] == "default::DeprecationWarning" and len(warnings) == 3
    assert warnings[1] == "ignore::FutureWarning:google.api_core._python_package_support"


# --------------------------------------------------------------------------- hbpe demo


@pytest.mark.parametrize("eval_batches", [0, -1, True])
def test_run_demo_refuses_an_eval_batches_that_is_not_a_count_before_it_starts(tmp_path, eval_batches):
    from hbpe.demo import run_demo

    with pytest.raises(HbpeError, match=rf"^eval_batches={eval_batches!r}: must be >= 1"):
        run_demo(tmp_path / "demo", eval_batches=eval_batches)
    assert not (tmp_path / "demo").exists()


def test_run_demo_reports_steps_and_returns_the_summary(tmp_path):
    """The demo's library part, narrowed (2 batches, 2 held-out batches, in-memory Beam): 7 step lines through the
    callback, a dict back."""
    from hbpe.demo import render_summary, run_demo

    lines: list[str] = []
    result = run_demo(
        tmp_path / "demo",
        train_batches=2,
        eval_batches=2,
        seq_len=64,
        pipeline_args=IN_MEMORY_BEAM,
        on_step=lines.append,
    )
    assert [line[:5] for line in lines] == ["[1/6]", "[2/6]", "[3/6]", "[3/6]", "[4/6]", "[4/6]", "[5/6]", "[6/6]"]
    assert "round trip exact" in lines[1] and "verify OK" in lines[2] and "verify OK" in lines[3]
    assert result["train"]["batches"] == 2 and result["eval"]["bpb"] > 0
    assert result["eval"]["bpb"] == pytest.approx(result["train"]["eval"]["BitsPerByte"], rel=1e-5)  # the same 2
    assert Path(result["train_folder"]) == tmp_path / "demo" / "train"
    summary = render_summary(result).splitlines()
    assert summary[:3] == ["", "summary", f"  held-out BPB        {result['eval']['bpb']:.3f}"]
    assert summary[-1] == (
        f"  artifacts           {tmp_path / 'demo' / 'tokenizer'}, {tmp_path / 'demo' / 'shards-train'}, "
        f"{tmp_path / 'demo' / 'shards-eval'}, {tmp_path / 'demo' / 'train'}"
    )


# --------------------------------------------------------------------------- one interface across commands

# every command that reports something takes --json; encode writes JSON always and decode writes the text itself
REPORTING = {
    ("demo",), ("tokenizer", "train"), ("tokenizer", "train-bpe"), ("tokenizer", "info"), ("tokenizer", "stats"),
    ("tokenizer", "tables"),
    ("convert",), ("shards", "inspect"), ("shards", "verify"), ("shards", "export-text"), ("shards", "stats"),
    ("train",), ("eval",), ("generate",), ("export",), ("checkpoint", "consolidate"), ("eval-tasks",), ("flops",),
    ("plot",), ("config", "show"),
    ("experiment",), ("bench", "tokenizer"), ("bench", "sweep"), ("bench", "first-stage"), ("bench", "convert"),
    ("bench", "train"), ("bench", "step"), ("bench", "generate"), ("bench", "loader"),
}  # fmt: skip
NOT_REPORTING = {("tokenizer", "encode"), ("tokenizer", "decode")}
# the one name of each concept; the old names are gone (click's "Did you mean" is the migration message)
RETIRED = {"--output", "--corpus", "--config", "--train-corpus", "--eval-corpus"}
PATH_OPTIONS = {"--tokenizer", "--data", "--checkpoint", "--input", "--out", "--train-input", "--eval-input"}
ARGUMENTS = {"config", "overrides", "preset"}  # the only positionals: CONFIG [OVERRIDES], PRESET [OVERRIDES]


def _everything():
    """(path, command) of the top-level group, every group and every command."""
    return [((), main), *_registered(main)]


def _leaves():
    return [(path, cmd) for path, cmd in _registered(main) if not hasattr(cmd, "commands")]


def _options(cmd):
    return [p for p in cmd.params if isinstance(p, click.Option) and p.name != "help"]


def test_the_reporting_list_covers_every_command():
    assert {path for path, _ in _leaves()} == REPORTING | NOT_REPORTING
    # every command logs its parameters with -v and names a renamed option's new name
    assert [path for path, cmd in _leaves() if not isinstance(cmd, common.Command)] == []


@pytest.mark.parametrize("path", sorted(REPORTING | NOT_REPORTING), ids=" ".join)
def test_json_on_every_reporting_command(path):
    cmd = dict(_leaves())[path]
    has_json = any("--json" in p.opts for p in _options(cmd))
    assert has_json == (path in REPORTING), path


def test_every_option_has_help_and_shows_its_default():
    assert main.context_settings["show_default"] is True  # inherited by every command's context
    for path, cmd in _everything():
        ctx = click.Context(cmd, info_name=" ".join(("hbpe", *path)), show_default=True)
        for p in _options(cmd):
            assert p.help, f"hbpe {' '.join(path)} {p.opts[0]} has no help"
            if not (p.required or p.is_flag):
                _, text = p.get_help_record(ctx)
                assert "default:" in text, f"hbpe {' '.join(path)} {p.opts[0]} shows no default: {text!r}"


def test_one_name_per_concept():
    for path, cmd in _everything():
        for p in cmd.params:
            where = f"hbpe {' '.join(path)} {p.opts[0]}"
            assert not RETIRED & set(p.opts), where
            if isinstance(p, click.Argument):
                assert p.name in ARGUMENTS, f"{where}: a path is an option (--tokenizer, --data, ...), not positional"
            elif PATH_OPTIONS & set(p.opts) and path not in NOT_REPORTING:  # encode/decode: --input is a file or stdin
                # a gs:// or s3:// URI must reach the library; click.Path would check it as a local path
                assert isinstance(p.type, click.types.StringParamType), f"{where}: {p.type!r} is not a plain string"


def _examples(text: str) -> list[str]:
    """The `hbpe ...` command lines of a help text's Example block (each part of a pipe that runs hbpe)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("hbpe ") or line.startswith("echo "):
            out += [part.split(" > ")[0] for part in line.split(" | ") if part.startswith("hbpe ")]
    return out


@pytest.mark.parametrize("path", sorted(path for path, _ in _everything()), ids=lambda p: " ".join(p) or "hbpe")
def test_every_help_has_an_example_that_parses(path):
    """The example's options exist, take the values given, and nothing required is missing."""
    import shlex

    r = CliRunner().invoke(main, [*path, "--help"])
    assert r.exit_code == 0, r.output
    assert "Example" in r.output, r.output
    examples = _examples(r.output)
    assert examples, r.output
    for line in examples:
        args = shlex.split(line)[1:]
        args = [a for a in args if a not in ("-q", "-v", "--quiet", "--verbose")]
        cmd, name = main, "hbpe"
        while hasattr(cmd, "commands") and args:
            name, cmd, args = args[0], cmd.commands[args[0]], args[1:]
        cmd.make_context(name, args)  # raises click's usage error on a wrong example


def test_global_verbose_and_quiet():
    opts = {o for p in main.params for o in p.opts}
    assert {"--verbose", "-v", "--quiet", "-q"} <= opts
    r = CliRunner().invoke(main, ["-v", "-q", "tokenizer", "info", "--tokenizer", "x"])
    assert r.exit_code == 2 and "--verbose and --quiet exclude each other" in r.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["shards", "export-text", "--data", "d", "--output", "x"], "No such option '--output'. Did you mean '--out'?"),
        (
            ["tokenizer", "stats", "--tokenizer", "t", "--corpus", "c"],
            "No such option '--corpus'. Did you mean '--input'?",
        ),
        (["experiment", "table1-mini", "--train-corpus", "c"], "Did you mean '--train-input'?"),
        (["bench", "train", "--config", "tiny"], "No such option '--config': CONFIG is the first argument"),
    ],
)
def test_a_retired_option_names_its_new_name(args, message):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and message in r.output, r.output


@pytest.fixture
def hbpe_logging_restored():
    """-v attaches a handler to the `hbpe` logger for the rest of the process: take it off after the test."""
    yield
    root = logging.getLogger("hbpe")
    root.removeHandler(common._HANDLER)
    root.setLevel(logging.NOTSET)


def test_quiet_hides_progress_and_verbose_shows_debug(tmp_path, gpt2_tokenizer_dir, hbpe_logging_restored):
    """A real in-process conversion of a tiny corpus, plain, with -q and with -v."""
    corpus = tmp_path / "tiny.jsonl"
    corpus.write_text('{"text": "Fellow-Citizens of the Senate"}\n{"text": "and of the House"}\n')
    args = ["convert", "--tokenizer", str(gpt2_tokenizer_dir), "--input", str(corpus), "--seq-len", "8"]
    args += ["--runner", "inprocess", "--workers", "1"]

    plain = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a")])
    assert plain.exit_code == 0, plain.output
    assert "[convert]: 100%" in plain.stderr and "runner: inprocess" in plain.stderr  # the bar's last line (no tty)
    assert "DEBUG" not in plain.stderr

    quiet = CliRunner().invoke(main, ["-q", *args, "--out", str(tmp_path / "b")])
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == ""  # no bar, no progress lines
    assert "read = written + rejected: OK" in quiet.stdout  # the result is still printed

    verbose = CliRunner().invoke(main, ["--verbose", *args, "--out", str(tmp_path / "c")])
    assert verbose.exit_code == 0, verbose.output
    assert re.search(r"^DEBUG hbpe\.cli: \S+ convert tokenizer_dir=", verbose.stderr, re.M), verbose.stderr
    assert verbose.stderr.count("runner: inprocess") == 1  # the library's INFO line, not also its echo
    assert "INFO hbpe.convert: runner: inprocess" in verbose.stderr


def test_new_json_reports(tmp_path, sample_shards):
    r = CliRunner().invoke(main, ["tokenizer", "train", "--encoding", "gpt2", "-S", "10", "--out", str(tmp_path / "t")])
    human = r.output
    r = CliRunner().invoke(
        main,
        ["tokenizer", "train", "--encoding", "gpt2", "-S", "10", "--out", str(tmp_path / "t"), "--overwrite", "--json"],
    )
    t = json.loads(r.output)
    assert (t["merges"], t["vocab_size"], t["out"]) == (211, 470, str(tmp_path / "t"))
    assert human.startswith("trained gpt2 S=10 mode=full: 211 merges, V'=470 in ")

    train_dir, _ = sample_shards
    r = CliRunner().invoke(main, ["shards", "verify", "--data", str(train_dir), "--json"])
    assert r.exit_code == 0 and json.loads(r.output) == {"data": str(train_dir), "ok": True, "problems": []}
    out = tmp_path / "docs.jsonl"
    r = CliRunner().invoke(main, ["shards", "export-text", "--data", str(train_dir), "--out", str(out), "--json"])
    e = json.loads(r.output)
    assert e["out"] == str(out) and e["documents"] == len(out.read_text().splitlines()) > 0
