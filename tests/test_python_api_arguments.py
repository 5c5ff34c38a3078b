"""Wrong arguments to the Python API (hbpe/api.py) are the ConfigErrors its other arguments get (issue 28), each
naming the argument, the value's type and an example; every check runs before a model, a corpus or a config file is
read, so the paths need not exist."""

from __future__ import annotations

import pytest

import hbpe
from hbpe.schemas.errors import ConfigError

CK, DATA = "/no/such/run", "/no/such/shards"
BAD_ARGUMENTS = {
    "generate-none": (
        lambda: hbpe.generate(CK, None),
        r"^prompts=None \(NoneType\): pass a str or a list of str, e.g. hbpe\.generate\(checkpoint, 'The State",
    ),
    "generate-int": (lambda: hbpe.generate(CK, 123), r"^prompts=123 \(int\): pass a str or a list of str"),
    "generate-bytes": (
        lambda: hbpe.generate(CK, b"hello"),
        r"^prompts=b'hello' \(bytes\): .*\(decode bytes first: prompts\.decode\('utf-8'\)\)",
    ),
    "generate-list-with-bytes": (
        lambda: hbpe.generate(CK, ["ok", b"hello"]),
        r"^prompt b'hello' \(bytes\) is not a str; pass text, e\.g\. 'The State of the Union'",
    ),
    "generate-stop-str": (
        lambda: hbpe.generate(CK, "ok", stop="\n\n"),
        r"^stop='\\n\\n' \(str\): pass a list of strings \(a str is not split into them\), e\.g\. stop=\['\\n\\n'\]",
    ),
    "generate-unknown-keyword": (
        lambda: hbpe.generate(CK, "ok", temprature=0.8),
        r"^hbpe\.generate: got an unexpected keyword argument 'temprature'; it takes checkpoint, prompts, max_bytes, "
        r"temperature, .*\(see help\(hbpe\.generate\)\)",
    ),
    "evaluate-batch-size-0": (
        lambda: hbpe.evaluate(CK, DATA, batch_size=0),
        r"^batch_size=0 \(int\): must be an integer >= 1; e\.g\. batch_size=8",
    ),
    "evaluate-batch-size-str": (
        lambda: hbpe.evaluate(CK, DATA, batch_size="8"),
        r"^batch_size='8' \(str\): must be an integer >= 1",
    ),
    "evaluate-max-batches-0": (
        lambda: hbpe.evaluate(CK, DATA, max_batches=0),
        r"^max_batches=0 \(int\): must be an integer >= 1, or None for every batch; e\.g\. max_batches=10",
    ),
    "evaluate-empty-checkpoint": (
        lambda: hbpe.evaluate("", DATA),
        r"^checkpoint='' is empty: pass a path \(a str or pathlib\.Path\), e\.g\. checkpoint='runs/demo/train'",
    ),
    "evaluate-unknown-keyword": (
        lambda: hbpe.evaluate(CK, DATA, max_batch=3),
        r"^hbpe\.evaluate: got an unexpected keyword argument 'max_batch'; it takes checkpoint, data, batch_size, "
        r"max_batches, device",
    ),
    "convert-seq-len-str": (
        lambda: hbpe.convert("x.jsonl", "out", tokenizer="tok", seq_len="16"),
        r"^seq_len='16' \(str\): must be an integer >= 2; e\.g\. seq_len=1024",
    ),
    "convert-beam-args-str": (
        lambda: hbpe.convert("x.jsonl", "out", tokenizer="tok", beam_args="--runner=DirectRunner"),
        r"^beam_args='--runner=DirectRunner' \(str\): pass a list of strings \(a str is not split into them\), e\.g\. "
        r"beam_args=\['--runner=DirectRunner'\]",
    ),
    "convert-empty-out": (
        lambda: hbpe.convert("x.jsonl", "", tokenizer="tok"),
        r"^out='' is empty: pass a path \(a str or pathlib\.Path\), e\.g\. out='shards'",
    ),
    "convert-none-out": (lambda: hbpe.convert("x.jsonl", None, tokenizer="tok"), r"^out=None \(NoneType\): pass a"),
    "convert-unknown-option": (
        lambda: hbpe.convert("x.jsonl", "out", tokenizer="tok", seqlen=16),
        r"^hbpe\.convert: unknown option 'seqlen'; its options are excludes, text_field, .*e\.g\. tail='pad'",
    ),
    "convert-missing-tokenizer": (
        lambda: hbpe.convert("x.jsonl", "out"),
        r"^hbpe\.convert: missing a required argument: 'tokenizer'; it takes inputs, out, tokenizer, seq_len",
    ),
    "train-config-str-override": (
        lambda: hbpe.train_config("tiny", "max_duration=5ba"),
        r"^overrides='max_duration=5ba' \(str\): pass a list of strings .*, e\.g\. \['max_duration=5ba'\] or a "
        r"mapping \{'max_duration': '5ba'\}",
    ),
    "train-config-unknown-keyword": (
        lambda: hbpe.train_config("tiny", overide=["seed=3"]),
        r"^hbpe\.train_config: got an unexpected keyword argument 'overide'; it takes config, overrides",
    ),
    "score-tasks-str": (
        lambda: hbpe.score_tasks(CK, "hellaswag"),
        r"^tasks='hellaswag' \(str\): pass a list of strings .*, e\.g\. tasks=\['hellaswag', 'piqa'\]",
    ),
    "load-model-none": (lambda: hbpe.load_model(None), r"^checkpoint=None \(NoneType\): pass a path"),
    # issue 35: a raw pathlib TypeError (load_tokenizer), a TypeError from api.py (inputs=None), an AttributeError
    # from options.py (runner=None)
    "load-tokenizer-none": (
        lambda: hbpe.load_tokenizer(None),
        r"^path=None \(NoneType\): pass a path \(a str or pathlib\.Path\), e\.g\. path='runs/demo/tokenizer'$",
    ),
    "load-tokenizer-bytes": (lambda: hbpe.load_tokenizer(b"tok"), r"^path=b'tok' \(bytes\): pass a path"),
    "load-tokenizer-int": (lambda: hbpe.load_tokenizer(5), r"^path=5 \(int\): pass a path"),
    "save-tokenizer-none": (
        lambda: hbpe.save_tokenizer(None, "tok"),
        r"^tok=None \(NoneType\): pass a tokenizer, e\.g\. hbpe\.save_tokenizer\(hbpe\.train_tokenizer\('gpt2'\)",
    ),
    "convert-none-inputs": (
        lambda: hbpe.convert(None, "out", tokenizer="tok"),
        r"^inputs=None \(NoneType\): pass a path or a list of paths \(str or pathlib\.Path\), e\.g\. "
        r"inputs='corpus\.jsonl\.zst'$",
    ),
    "convert-int-among-inputs": (
        lambda: hbpe.convert(["x.jsonl", 5], "out", tokenizer="tok"),
        r"^inputs\[1\]=5 \(int\): pass a path",
    ),
    "convert-empty-inputs": (lambda: hbpe.convert([], "out", tokenizer="tok"), r"^inputs=\[\] is empty: pass at least"),
    "convert-none-runner": (
        lambda: hbpe.convert("x.jsonl", "out", tokenizer="tok", runner=None),
        r"^runner=None \(NoneType\): pass a non-empty str, e\.g\. runner='inprocess' \(or 'auto', 'dask'",
    ),
    "convert-int-dask-address": (
        lambda: hbpe.convert("x.jsonl", "out", tokenizer="tok", runner="dask", dask_address=8786),
        r"^dask_address=8786 \(int\): pass a non-empty str, e\.g\. dask_address='tcp://HOST:8786'",
    ),
    "convert-huge-seq-len": (
        lambda: hbpe.convert("x.jsonl", "out", tokenizer="tok", seq_len=2**70),
        r"^seq_len must be <= 1048576, got 1180591620717411303424: a sample is one latent context",
    ),
}


@pytest.mark.parametrize("call,message", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_wrong_arguments_are_config_errors_naming_the_argument(call, message):
    """Before: TypeError / AttributeError from inside (None, 123, b"hello" as prompts; an unknown keyword), a ValueError
    of the data loader (batch_size=0), "bits per byte is undefined" (max_batches=0), a str split into characters
    ("override 'm' is not key=value", beam options "- - r u n ..."), or "" taken for the current directory."""
    with pytest.raises(ConfigError, match=message):
        call()
