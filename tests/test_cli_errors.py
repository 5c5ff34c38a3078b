"""Every `hbpe` command, handed garbage, ends in one clear line and exit code 2, never a traceback.

One table: a case names a command line (placeholders like {missing} are files made below)
and the exit code it must end with. Click's own parse errors print `Error: ...` (also exit 2),
our commands print `error: ...`; `shards verify` reports a damaged directory with `FAIL`
lines and exit 1. A failure here means a user mistake reaches a traceback or the catch-all
(`error: internal error: ...`, exit 1) instead of a message that names the fix.
"""

from __future__ import annotations

import random
import shutil

import pytest
from click.testing import CliRunner

from hbpe.cli import main
from tests.conftest import IN_MEMORY_BEAM, SAMPLE_EN, copy_run

BEAM = " ".join(IN_MEMORY_BEAM)


@pytest.fixture(scope="module")
def ws(tmp_path_factory, gpt2_tokenizer_dir, sample_shards, tiny_run):
    """Paths the cases refer to: good artifacts, and garbage of every kind."""
    root = tmp_path_factory.mktemp("garbage")
    noise = random.Random(0).randbytes
    train_dir, _ = sample_shards
    run = copy_run(tiny_run, root / "run")

    (root / "empty").mkdir()
    (root / "file.txt").write_text("just some text\n")
    (root / "bad.yaml").write_text("data: [unclosed\n")
    (root / "list.yaml").write_text("- 1\n- 2\n")
    (root / "latin1.txt").write_bytes("café, naïve\n".encode("latin-1"))
    (root / "bad-patches.json").write_text('{"patches": [["x"]]}')
    (root / "neg-patches.json").write_text('{"patches": [[-1, 256]]}')
    (root / "bad-tokens.json").write_text('{"tokens": [99999999]}')
    (root / "noise.bin").write_bytes(noise(4096))
    from hbpe.pipeline.tokenizer.first_stage_train import count_pretokens, train_ranks, write_encoding

    ranks = train_ranks(count_pretokens(["the cat sat on the mat, the end"] * 3, "cl100k_base"), 260, min_count=1)
    inhouse = write_encoding(ranks, root / "inhouse.tiktoken", pattern="cl100k_base")  # a good rank file
    badside = write_encoding(ranks, root / "badside.tiktoken", pattern="cl100k_base")
    badside.with_suffix(".json").write_text("{not json")  # ... whose sidecar is broken
    randtok = root / "randtok"  # a tokenizer directory whose files are random bytes
    randtok.mkdir()
    (randtok / "tokenizer.json").write_bytes(noise(2048))
    (randtok / "first_stage.tiktoken").write_bytes(noise(2048))
    randckpt = root / "randckpt"  # a real run folder whose checkpoint is random bytes
    randckpt.mkdir()
    shutil.copy(run / "hbpe_run.json", randckpt / "hbpe_run.json")
    shutil.copytree(run / "tokenizer", randckpt / "tokenizer")
    (randckpt / "latest-rank0.pt").write_bytes(noise(8192))
    randshards = root / "randshards"  # a shard directory whose files are random bytes
    shutil.copytree(train_dir, randshards)
    for f in randshards.rglob("*"):
        if f.is_file():
            f.write_bytes(noise(512))
    cut = root / "cutshards"  # a real shard directory with one shard truncated
    shutil.copytree(train_dir, cut)
    shard = next(p for p in sorted(cut.iterdir()) if p.name.startswith("shard."))
    shard.write_bytes(shard.read_bytes()[:100])
    return {
        "tmp": str(root),
        "nothing": "",
        "inhouse": str(inhouse),
        "badside": str(badside),
        "missing": str(root / "nope"),
        "empty": str(root / "empty"),
        "file": str(root / "file.txt"),
        "bad_yaml": str(root / "bad.yaml"),
        "list_yaml": str(root / "list.yaml"),
        "latin1": str(root / "latin1.txt"),
        "bad_patches": str(root / "bad-patches.json"),
        "neg_patches": str(root / "neg-patches.json"),
        "bad_tokens": str(root / "bad-tokens.json"),
        "noise": str(root / "noise.bin"),
        "randtok": str(randtok),
        "randckpt": str(randckpt),
        "randshards": str(randshards),
        "cutshards": str(cut),
        "tok": str(gpt2_tokenizer_dir),
        "shards": str(train_dir),
        "run": str(run),
        "sample": str(SAMPLE_EN),
    }


# (id, command line, exit code). Split on spaces after the placeholders are filled.
CASES = [
    # tokenizer train
    ("tok-train-unknown-encoding", "tokenizer train --encoding no_such_encoding -S 10 --out {tmp}/o1", 2),
    ("tok-train-missing-rank-file", "tokenizer train --encoding {missing}.tiktoken -S 10 --out {tmp}/o2", 2),
    ("tok-train-text-as-rank-file", "tokenizer train --encoding {file} -S 10 --out {tmp}/o3", 2),
    ("tok-train-noise-as-rank-file", "tokenizer train --encoding {noise} -S 10 --out {tmp}/o4", 2),
    ("tok-train-dir-as-rank-file", "tokenizer train --encoding {empty} -S 10 --out {tmp}/o5", 2),
    ("tok-train-S-not-int", "tokenizer train --encoding gpt2 -S abc --out {tmp}/o6", 2),
    ("tok-train-S-too-small", "tokenizer train --encoding gpt2 -S 1 --out {tmp}/o7", 2),
    ("tok-train-out-is-file", "tokenizer train --encoding gpt2 -S 10 --out {file}", 2),
    ("tok-train-bad-pattern", "tokenizer train --encoding {inhouse} --pattern ( -S 6 --out {tmp}/o8", 2),
    ("tok-train-bad-sidecar", "tokenizer train --encoding {badside} -S 6 --out {tmp}/o9", 2),
    ("tok-train-empty-encoding", "tokenizer train --encoding {nothing} -S 10 --out {tmp}/o10", 2),
    # tokenizer train-bpe
    ("bpe-missing-corpus", "tokenizer train-bpe --input {missing} --vocab-size 300 --out {tmp}/b1.tiktoken", 2),
    ("bpe-dir-corpus", "tokenizer train-bpe --input {empty} --vocab-size 300 --out {tmp}/b2.tiktoken", 2),
    ("bpe-vocab-too-small", "tokenizer train-bpe --input {sample} --vocab-size 100 --out {tmp}/b3.tiktoken", 2),
    ("bpe-out-under-a-file", "tokenizer train-bpe --input {file} --vocab-size 300 --out {file}/x.tiktoken", 2),
    ("bpe-bad-pattern", "tokenizer train-bpe --input {file} --vocab-size 300 --pattern ( --out {tmp}/b4.tiktoken", 2),
    # tokenizer info
    ("info-missing", "tokenizer info --tokenizer {missing}", 2),
    ("info-file", "tokenizer info --tokenizer {file}", 2),
    ("info-empty-dir", "tokenizer info --tokenizer {empty}", 2),
    ("info-random-tokenizer", "tokenizer info --tokenizer {randtok}", 2),
    ("info-plot-is-dir", "tokenizer info --tokenizer {tok} --plot {empty}", 2),
    ("info-empty-tokenizer", "tokenizer info --tokenizer {nothing}", 2),
    # tokenizer encode / decode
    ("encode-non-utf8", "tokenizer encode --tokenizer {tok} --input {latin1}", 2),
    ("encode-missing-tokenizer", "tokenizer encode --tokenizer {missing} --input {file}", 2),
    ("encode-empty-tokenizer", "tokenizer encode --tokenizer {nothing} --input {file}", 2),
    ("encode-random-tokenizer", "tokenizer encode --tokenizer {randtok} --input {file}", 2),
    ("encode-missing-input", "tokenizer encode --tokenizer {tok} --input {missing}", 2),
    ("encode-dir-input", "tokenizer encode --tokenizer {tok} --input {empty}", 2),
    ("decode-not-json", "tokenizer decode --tokenizer {tok} --input {file}", 2),
    ("decode-non-utf8", "tokenizer decode --tokenizer {tok} --input {latin1}", 2),
    ("decode-patches-not-ids", "tokenizer decode --tokenizer {tok} --input {bad_patches}", 2),
    ("decode-negative-symbol", "tokenizer decode --tokenizer {tok} --input {neg_patches}", 2),
    ("decode-token-out-of-range", "tokenizer decode --tokenizer {tok} --input {bad_tokens}", 2),
    # tokenizer stats
    ("stats-missing-corpus", "tokenizer stats --tokenizer {tok} --input {missing}", 2),
    ("stats-dir-corpus", "tokenizer stats --tokenizer {tok} --input {empty}", 2),
    ("stats-missing-jsonl", "tokenizer stats --tokenizer {tok} --input {missing}.jsonl", 2),
    ("stats-random-tokenizer", "tokenizer stats --tokenizer {randtok} --input {sample}", 2),
    # convert
    ("convert-missing-tokenizer", "convert --tokenizer {missing} --input {sample} --out {tmp}/c1 " + BEAM, 2),
    ("convert-random-tokenizer", "convert --tokenizer {randtok} --input {sample} --out {tmp}/c2 " + BEAM, 2),
    ("convert-file-as-tokenizer", "convert --tokenizer {file} --input {sample} --out {tmp}/c3 " + BEAM, 2),
    ("convert-missing-input", "convert --tokenizer {tok} --input {missing} --out {tmp}/c4 " + BEAM, 2),
    ("convert-empty-dir-input", "convert --tokenizer {tok} --input {empty} --out {tmp}/c5 " + BEAM, 2),
    ("convert-empty-input", "convert --tokenizer {tok} --input {nothing} --out {tmp}/c8 " + BEAM, 2),
    ("convert-output-is-file", "convert --tokenizer {tok} --input {sample} --out {file} " + BEAM, 2),
    ("convert-seq-len-not-int", "convert --tokenizer {tok} --input {sample} --out {tmp}/c6 --seq-len abc", 2),
    (
        "convert-bad-beam-option",
        "convert --tokenizer {tok} --input {sample} --out {tmp}/c7 --runner=NoSuchRunner",
        2,
    ),
    # shards
    ("inspect-missing", "shards inspect --data {missing}", 2),
    ("inspect-empty-dir", "shards inspect --data {empty}", 2),
    ("inspect-file", "shards inspect --data {file}", 2),
    ("inspect-random", "shards inspect --data {randshards}", 2),
    ("verify-empty-dir", "shards verify --data {empty}", 2),
    ("verify-random", "shards verify --data {randshards}", 2),  # unreadable manifest: nothing to verify against
    ("verify-truncated-shard", "shards verify --data {cutshards}", 1),
    ("export-empty-dir", "shards export-text --data {empty} --out {tmp}/x.jsonl", 2),
    ("export-output-is-dir", "shards export-text --data {shards} --out {empty}", 2),
    ("export-truncated-shard", "shards export-text --data {cutshards} --out {tmp}/y.jsonl", 2),
    ("stats-shards-empty-dir", "shards stats --data {empty}", 2),
    ("stats-shards-random", "shards stats --data {randshards}", 2),
    ("verify-missing", "shards verify --data {missing}", 2),
    ("export-missing", "shards export-text --data {missing} --out {tmp}/z.jsonl", 2),
    ("stats-shards-missing", "shards stats --data {missing}", 2),
    ("export-old-output-name", "shards export-text --data {shards} --output {tmp}/z.jsonl", 2),
    ("inspect-old-positional", "shards inspect {shards}", 2),
    # train
    ("train-invalid-yaml", "train {bad_yaml}", 2),
    ("train-yaml-list", "train {list_yaml}", 2),
    ("train-missing-config", "train {missing}.yaml", 2),
    ("train-empty-config", "train {nothing}", 2),
    ("train-empty-value", "train tiny data.train={shards} max_duration={nothing}", 2),
    ("train-noise-config", "train {noise}", 2),
    ("train-data-is-file", "train tiny data.train={file} data.eval=null", 2),
    ("train-data-missing", "train tiny data.train={missing} data.eval=null", 2),
    ("train-data-empty-dir", "train tiny data.train={empty} data.eval=null save_folder={tmp}/t1", 2),
    ("train-data-random", "train tiny data.train={randshards} data.eval=null save_folder={tmp}/t2", 2),
    ("train-tokenizer-random", "train tiny data.train={shards} data.eval=null data.tokenizer={randtok}", 2),
    ("train-lr-not-number", "train tiny data.train={shards} optim.lr=abc", 2),
    ("train-not-key-value", "train tiny data.train={shards} optim", 2),
    ("train-nproc-zero", "train tiny --nproc 0", 2),
    (
        "train-load-path-random",
        "train tiny data.train={shards} data.eval=null load_path={noise} save_folder={tmp}/t3",
        2,
    ),
    # eval
    ("eval-missing-checkpoint", "eval --checkpoint {missing} --data {shards}", 2),
    ("eval-random-checkpoint", "eval --checkpoint {randckpt} --data {shards}", 2),
    ("eval-file-checkpoint", "eval --checkpoint {file} --data {shards}", 2),
    ("eval-empty-dir-checkpoint", "eval --checkpoint {empty} --data {shards}", 2),
    ("eval-missing-data", "eval --checkpoint {run} --data {missing}", 2),
    ("eval-empty-data", "eval --checkpoint {run} --data {nothing}", 2),
    ("eval-file-data", "eval --checkpoint {run} --data {file}", 2),
    ("eval-empty-dir-data", "eval --checkpoint {run} --data {empty}", 2),
    ("eval-random-data", "eval --checkpoint {run} --data {randshards}", 2),
    ("eval-batch-size-zero", "eval --checkpoint {run} --data {shards} --batch-size 0", 2),
    # generate
    ("generate-missing-checkpoint", "generate --checkpoint {missing} --prompt Fellow", 2),
    ("generate-random-checkpoint", "generate --checkpoint {randckpt} --prompt Fellow", 2),
    ("generate-file-checkpoint", "generate --checkpoint {file} --prompt Fellow", 2),
    ("generate-empty-checkpoint", "generate --checkpoint {nothing} --prompt Fellow", 2),
    ("generate-non-utf8-prompt", "generate --checkpoint {run} --prompt Fellow\udcff", 2),
    ("generate-temperature-inf", "generate --checkpoint {run} --prompt Fellow --temperature inf", 2),
    ("generate-temperature-nan", "generate --checkpoint {run} --prompt Fellow --temperature nan", 2),
    ("generate-max-bytes-not-int", "generate --checkpoint {run} --prompt Fellow --max-bytes lots", 2),
    ("generate-max-bytes-zero", "generate --checkpoint {run} --prompt Fellow --max-bytes 0", 2),
    # bench
    ("bench-tokenizer-missing-corpus", "bench tokenizer --tokenizer {tok} --input {missing}", 2),
    ("bench-tokenizer-random-tokenizer", "bench tokenizer --tokenizer {randtok} --input {sample}", 2),
    ("bench-sweep-sizes-not-ints", "bench sweep --sizes a,b --input {sample}", 2),
    ("bench-sweep-S-too-small", "bench sweep --sizes 1 --input {sample}", 2),
    ("bench-sweep-missing-input", "bench sweep --sizes 8 --input {missing}.jsonl", 2),
    ("bench-sweep-unknown-encoding", "bench sweep --encodings no_such_encoding --sizes 8 --input {sample}", 2),
    ("bench-convert-missing-tokenizer", "bench convert --tokenizer {missing} --input {sample} " + BEAM, 2),
    ("bench-convert-missing-corpus", "bench convert --tokenizer {tok} --input {missing} " + BEAM, 2),
    ("bench-train-invalid-yaml", "bench train {bad_yaml}", 2),
    ("bench-train-data-is-file", "bench train tiny data.train={file} data.eval=null", 2),
    ("bench-generate-random-checkpoint", "bench generate --checkpoint {randckpt}", 2),
    ("bench-generate-missing-checkpoint", "bench generate --checkpoint {missing}", 2),
    # demo
    ("demo-out-is-file", "demo --out {file}", 2),
    # global options
    ("verbose-and-quiet", "-v -q shards stats --data {shards}", 2),
]


@pytest.mark.parametrize("line,code", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_garbage_arguments_end_in_one_clear_line(ws, line, code, monkeypatch):
    monkeypatch.delenv("HBPE_DEBUG", raising=False)
    args = [a.format(**ws) for a in line.split(" ")]
    r = CliRunner().invoke(main, args)
    assert isinstance(r.exception, SystemExit), f"{type(r.exception).__name__}: {r.exception}\n{r.output}"
    assert "Traceback" not in r.output, r.output
    assert r.exit_code == code, r.output
    lines = r.output.splitlines()
    if code == 1:  # `shards verify` lists every problem
        assert any(ln.startswith("FAIL ") for ln in lines), r.output
    else:
        errors = [ln for ln in lines if ln.startswith(("error: ", "Error: "))]
        assert len(errors) == 1 and "internal error" not in errors[0], r.output
