"""Which runner converts, and Beam's pipeline options when it is a Beam runner.

`--runner` takes `auto` (the default), `inprocess`, `dask` (the in-process runner's
steps as tasks on a Dask cluster, dask_cluster.py: `--dask-address`, or a LocalCluster of
`--workers` processes) or a Beam runner name (DirectRunner,
DataflowRunner, FlinkRunner, SparkRunner, PortableRunner, PrismRunner, ...): one option
instead of an in-process switch beside Beam's own `--runner`, so no combination of the
two can contradict itself, and `--runner=DataflowRunner` means what it always meant.
hbpe's Dask engine was first named `--runner DaskRunner`, the name of Beam's own Dask runner:
that name still runs hbpe's engine, with one line saying to use `dask`.

`auto` runs a job in process when it is local (local inputs and output) and nothing asks
for Beam (no Beam option given); any other job goes to Beam's DirectRunner, as before
(object-store paths included: `--runner inprocess` reads and writes them too, untested).
Both write byte-identical output. Measured on 2 cores (`hbpe bench convert`, README), the
in-process runner is ahead of the DirectRunner at every size tried, 10.8 to 172 MB: it
does the same work without Beam's ~3-5 s of worker start-up and stage barriers and its
per-element overhead, so a size threshold would only hand big local jobs to the slower
runner. A job that outgrows one machine needs a cluster runner, which is asked for by
name (`--runner DataflowRunner ...`) and runs the Beam pipeline unchanged;
`--runner DirectRunner` runs that same pipeline locally.

Every argument the command line does not know itself must be a Beam option: an unknown
one (`--seq_len 64` for `--seq-len 64`) is an error naming the likely fix, never dropped.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hbpe.pipeline import storage
from hbpe.pipeline.corpus.files import COMPRESSED_TEXT_FACTOR, FileInfo
from hbpe.schemas.errors import ConfigError

INPROCESS = "inprocess"
DASK = "dask"  # hbpe's Dask engine; Beam's own is --runner apache_beam.runners.dask.dask_runner.DaskRunner
# earlier names of hbpe's own runners (as _runner_key spells them) -> the name to use now
DEPRECATED_NAMES = {"daskrunner": DASK}
_OWN_RUNNERS = {INPROCESS: INPROCESS, DASK: DASK, **DEPRECATED_NAMES}
AUTO = "auto"
DIRECT_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")  # Beam's local runners
# local worker processes per core at most: converting is CPU-bound, so past the cores more processes only add
# memory (a tokenizer each); the bound is generous so that a small container's tests and I/O waits still fit
WORKERS_PER_CORE = 4


def local_cores() -> int:
    """CPU cores this process may use (the affinity mask, not the machine's count, in a container)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def text_bytes_estimate(files: Iterable[FileInfo]) -> int:
    """About how much text the inputs hold (for the message): plain files by size, compressed ones by a typical ratio."""
    return sum(f.size * (COMPRESSED_TEXT_FACTOR if f.compression else 1) for f in files)


@dataclass(frozen=True)
class RunnerChoice:
    name: str  # INPROCESS or a Beam runner name
    why: str  # one line: what chose it
    beam_args: tuple[str, ...] = ()  # Beam pipeline options, --runner included (empty for INPROCESS)
    workers: int = 1  # in-process worker processes (for a Beam runner: DirectRunner's, when it sets them)
    dask_address: str | None = None  # DASK: the scheduler's, or None for a LocalCluster of `workers` processes
    deprecation: str | None = None  # one line to show when the runner was asked for by an earlier name

    @property
    def beam(self) -> bool:
        return self.name not in (INPROCESS, DASK)

    def describe(self) -> str:
        if self.name == DASK:
            return f"runner: {DASK} ({self.why}; the in-process runner's steps as Dask tasks)"
        if not self.beam:
            return f"runner: inprocess, {self.workers} worker process(es) ({self.why}; --runner DirectRunner uses Beam)"
        return f"runner: {self.name} ({self.why})"


def choose_runner(
    runner: str,
    pipeline_args: Sequence[str],
    *,
    output: str,
    files: Sequence[FileInfo],
    workers: int | None = None,
    dask_address: str | None = None,
) -> RunnerChoice:
    """The runner for this job, from `--runner` (or a `--runner=` among the Beam options) and where its data lives."""
    args, runner, own = check_runner_args(runner, pipeline_args, workers=workers, dask_address=dask_address)
    cores = workers or local_cores()
    if own:
        if args:
            raise ConfigError(
                f"Beam pipeline options ({' '.join(args)}) have no effect with --runner {own}: drop them, "
                "or choose a Beam runner (e.g. --runner DirectRunner)"
            )
        note = deprecated_runner(runner)
        return RunnerChoice(own, f"--runner {own}", workers=cores, dask_address=dask_address, deprecation=note)
    if runner != AUTO:
        return RunnerChoice(runner, "--runner", (f"--runner={runner}", *args), workers=cores)
    if args:
        return RunnerChoice("DirectRunner", "auto: Beam options given", ("--runner=DirectRunner", *args), cores)
    remote = [p for p in [output, *(f.path for f in files)] if storage.is_remote(p)]
    if remote:  # object stores stay on the path they were tested on (the in-process pool would fork a GCS client)
        return RunnerChoice("DirectRunner", f"auto: object-store path {remote[0]}", ("--runner=DirectRunner",), cores)
    size = text_bytes_estimate(files)
    return RunnerChoice(INPROCESS, f"auto: local job, about {size / 1e6:.1f} MB of text", workers=cores)


def check_runner_args(
    runner: str, pipeline_args: Sequence[str], *, workers: int | None = None, dask_address: str | None = None
) -> tuple[list[str], str, str | None]:
    """The checks of choose_runner that need no input read (so a conversion makes them first): (Beam options
    without their --runner, the runner named, hbpe's own runner it names or None)."""
    args, named = _pop_runner(list(pipeline_args))
    if named and runner not in (AUTO, named):
        raise ConfigError(f"two runners given: --runner {runner} and --runner={named}; give one")
    runner = named or runner
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    own = _OWN_RUNNERS.get(_runner_key(runner))
    if dask_address and own != DASK:
        raise ConfigError(f"--dask-address {dask_address} needs --runner {DASK}; add it, or drop --dask-address")
    if workers is not None:
        _check_workers(workers, cluster=_cluster(own or runner, dask_address))
    return args, runner, own


def _runner_key(runner: str) -> str:
    """How hbpe's own runner names are matched: any case, with or without - and _ ("Dask", "in-process")."""
    return runner.replace("-", "").replace("_", "").lower()


def deprecated_runner(runner: str) -> str | None:
    """The line to show for an earlier name of one of hbpe's runners (`DaskRunner`), else None."""
    new = DEPRECATED_NAMES.get(_runner_key(runner))
    if new is None:
        return None
    return f"--runner {runner} is deprecated (Beam has a runner of that name): use --runner {new}"


def _cluster(runner: str, dask_address: str | None) -> str | None:
    """What runs the workers, as a message names it, when `--workers` would start none on this machine; None
    for the in-process pool, Dask's LocalCluster and the DirectRunner's workers (`auto` picks one of these)."""
    if dask_address:
        return f"--dask-address {dask_address}"
    return None if runner in (INPROCESS, DASK, AUTO, *DIRECT_RUNNERS) else f"--runner {runner}"


def _check_workers(workers: int, *, cluster: str | None) -> None:
    """Refuse a `--workers` that asks this machine for more processes than it can hold (or means nothing).

    Before: `--workers 10000` hung starting a LocalCluster, and `--workers 1000000000` grew to 24 GB before
    the OOM killer took the caller with it. A remote cluster is not bounded by this machine's cores: its
    workers are started on its own machines (`dask worker --nworkers N`), so --workers there is refused as
    meaningless rather than silently ignored.
    """
    if cluster:
        raise ConfigError(
            f"--workers {workers} has no effect with {cluster}: that cluster's workers are its own (`dask worker "
            "--nworkers N` on each machine for Dask, the runner's own options for Beam); drop --workers"
        )
    cores = local_cores()
    if workers > WORKERS_PER_CORE * cores:
        raise ConfigError(
            f"--workers {workers}: at most {WORKERS_PER_CORE * cores} worker processes here ({WORKERS_PER_CORE} "
            f"per core, {cores} core(s)): each is a process with its own tokenizer, and more than the cores only "
            f"share them; pass --workers {cores} (the default), or a Dask cluster (--runner {DASK} --dask-address) "
            "for more"
        )


def _pop_runner(args: list[str]) -> tuple[list[str], str | None]:
    """Beam options without their --runner, and the runner it named (library callers pass it that way)."""
    out, named, i = [], None, 0
    while i < len(args):
        a = args[i]
        if a.startswith("--runner="):
            named = a.split("=", 1)[1]
        elif a == "--runner" and i + 1 < len(args):
            named = args[i + 1]
            i += 1
        else:
            out.append(a)
        i += 1
    return out, named


def check_pipeline_args(args: Sequence[str], *, hbpe_options: Iterable[str] = ()) -> None:
    """Refuse arguments neither hbpe nor Beam knows, naming the likely option; Beam would drop them silently."""
    if not args:
        return
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    if any(a.startswith("--dask_") for a in args):  # Beam's DaskRunner declares its options in its own module
        with contextlib.suppress(ImportError):
            import apache_beam.runners.dask.dask_runner  # noqa: F401

    # the parser Beam's get_all_options builds, so "known" means exactly what Beam will read
    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            _, unknown = parser.parse_known_args(list(args))
        except SystemExit:
            return  # a known option with a bad value: default_pipeline_options names it
    if not unknown:
        return
    beam_names = [s for a in parser._actions for s in a.option_strings]
    ours = list(hbpe_options)
    hints = []
    for u in (a for a in unknown if a.startswith("-")):
        flag = u.split("=", 1)[0]
        dashed = "--" + flag.lstrip("-").replace("_", "-")
        close = [dashed] if dashed in ours else difflib.get_close_matches(flag, ours + beam_names, n=1, cutoff=0.75)
        if close:
            hints.append(f"{close[0]} for {flag}")
    hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
    raise ConfigError(
        f"unknown option(s) {' '.join(redacted(unknown))}: neither hbpe convert nor Beam knows them{hint}; "
        "see `hbpe convert --help` for hbpe's options (Beam's: --runner, --direct_num_workers, --project, ...)"
    )


_SECRET_NAME = re.compile(r"key|secret|token|pas+w|pwd|cred|auth", re.IGNORECASE)  # typos included


def redacted(args: Sequence[str]) -> list[str]:
    """`args` as they may be shown: the value of an option whose name holds key/secret/token/password
    replaced by `***` (`--name=VALUE` and `--name VALUE` alike), so a typo never echoes a credential.

    >>> redacted(["--s3_secret_acces_key=abc", "--aws_session_token", "xyz", "--region", "eu"])
    ['--s3_secret_acces_key=***', '--aws_session_token', '***', '--region', 'eu']
    """
    out, hide_next = [], False
    for a in args:
        if a.startswith("-"):
            flag, eq, _ = a.partition("=")
            secret = bool(_SECRET_NAME.search(flag))
            out.append(f"{flag}=***" if secret and eq else a)
            hide_next = secret and not eq
        else:
            out.append("***" if hide_next else a)
            hide_next = False
    return out


def default_pipeline_options(pipeline_args: list[str], *, workers: int | None = None):
    """Beam options with hbpe's local defaults; a malformed or unknown option is a ConfigError, not argparse's exit."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

    check_pipeline_args(pipeline_args)
    joined = " ".join(pipeline_args)
    if "--default_sdk_harness_log_level" not in joined:
        pipeline_args = [*pipeline_args, "--default_sdk_harness_log_level=ERROR"]
    opts = PipelineOptions(pipeline_args)
    err = io.StringIO()
    try:
        # Beam parses its options lazily, at the first view_as, and argparse then exits the process:
        # parse them all now, before anything is written, and say which one is wrong
        with contextlib.redirect_stderr(err):
            opts.get_all_options()
    except SystemExit:
        why = next((ln for ln in reversed(err.getvalue().splitlines()) if "error:" in ln), err.getvalue().strip())
        raise ConfigError(
            f"bad Beam pipeline option: {why.split('error:', 1)[-1].strip()}; fix or drop it "
            "(Beam options follow hbpe's own, e.g. --direct_num_workers=2)"
        ) from None
    if not opts.view_as(StandardOptions).runner:
        opts.view_as(StandardOptions).runner = "DirectRunner"
    if opts.view_as(StandardOptions).runner in ("DirectRunner", "BundleBasedDirectRunner"):
        direct = opts.view_as(DirectOptions)
        if "--direct_num_workers" not in joined:
            direct.direct_num_workers = workers or os.cpu_count() or 1
        if "--direct_running_mode" not in joined:
            direct.direct_running_mode = "multi_processing"
    return opts
