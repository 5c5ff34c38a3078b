"""The `hbpe` command line: thin commands that parse, call one function of hbpe/api.py (or the library function
it wraps), print.

One module per command group (tokenizer.py, convert.py, shards.py, train.py, evaluate.py, generate.py,
export.py, plot.py, experiment.py, bench.py, demo.py); common.py holds what they share: the group class that turns
failures into one `error:` line, `emit` (the one output path), the options several commands take and the
global --verbose/--quiet state. This module is the `hbpe` group itself and attaches every command to it.

Heavy libraries (torch, composer, beam) are imported inside the commands that
need them, so `hbpe tokenizer ...` starts fast.
"""

from __future__ import annotations

import click

import hbpe
from hbpe.cli import (
    bench,
    config,
    convert,
    demo,
    evaluate,
    experiment,
    export,
    generate,
    plot,
    shards,
    tokenizer,
    train,
)
from hbpe.cli.common import CONTEXT_SETTINGS, Group, set_verbosity


@click.group(cls=Group, context_settings=CONTEXT_SETTINGS)
@click.version_option(hbpe.__version__, prog_name="hbpe")
@click.option("--verbose", "-v", is_flag=True, help="Log hbpe's INFO and DEBUG lines on stderr.")
@click.option("--quiet", "-q", is_flag=True, help="Only warnings and errors (libraries: errors): no progress lines.")
@click.pass_context
def main(ctx: click.Context, verbose: bool, quiet: bool) -> None:
    """hbpe: hierarchical BPE tokenizers, MDS shards, and hierarchical patch LMs.

    Names are the same across commands: --tokenizer DIR, --input FILE (read), --out PATH
    (written), --data SHARDS, --checkpoint PATH, a positional CONFIG [key=value ...], and --json
    on every command that reports. Paths may be gs:// or s3:// URIs where the data can live there.

    \b
    Example:
      hbpe demo --out runs/demo
      hbpe -q convert --tokenizer runs/demo/tokenizer --input data/sample/en-sotu-sample.jsonl.zst --out /tmp/shards-q
    """
    from hbpe.pipeline.beam.quiet import quiet_beam

    set_verbosity(ctx, verbose=verbose, quiet=quiet)
    quiet_beam()


for _command in (
    demo.demo,
    tokenizer.tokenizer,
    convert.convert,
    shards.shards,
    train.train_cmd,
    evaluate.eval_cmd,
    evaluate.eval_tasks_cmd,
    generate.generate_cmd,
    export.export_cmd,
    export.checkpoint_group,
    plot.plot_cmd,
    config.config_group,
    experiment.flops_cmd,
    experiment.experiment_cmd,
    bench.bench,
):
    main.add_command(_command)
