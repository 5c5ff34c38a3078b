"""The in-process runner: the conversion's steps without Beam, for jobs where Beam's fixed cost dominates.

The same functions as the Beam steps, in the same order, so the output is byte-identical:

    summaries = encode_unit(u) for each pending unit           # units.py, what EncodeUnits runs
    plan      = plan_shards(summaries)                          # shard_tasks.py, what PlanShards runs
    entries   = write_shard(t) for each shard task              # shard_tasks.py, what WriteMdsShards runs
    manifest  = finalize_output(entries, summaries, plan)       # finalize.py, what FinalizeOutput runs

without Beam's barrier between the first two: a full shard is written as soon as the units up to
its end (in unit order) are encoded (`ReadyShards`, the same task plan_shards gives it), while
later units still encode, so its compression overlaps their encoding; plan_shards, once every
unit is in, leaves only the last shard (and checks that it cut the others the same way).

Work goes to a pool of worker processes, forked from the launcher once at the start (they
inherit the loaded tokenizer: no second load, no Beam import, ~10 ms to start); a single
unit runs in the launcher itself. Units are encoded on tiktoken threads, about two
per core in all (tiktoken releases the GIL: 2 threads encode 1.95x as fast as one here), so
a unit left alone at the end still uses every core. Shards go to the processes too, one each (the
`zstd` module already compresses on a thread per core; its output does not depend on how many), ahead of
the units still waiting: at most one task per process is in flight, and a ready shard takes the next free one.

Given an `executor` (a Dask cluster's, dask_cluster.py), every unit and shard is a task on it
instead, one tiktoken thread each (a Dask worker is a process per core); a worker loads the
tokenizer from staging once, at its first task of the run.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from hbpe.pipeline.beam import fs
from hbpe.pipeline.beam.finalize import FinalizeContext, finalize_output
from hbpe.pipeline.beam.shard_tasks import ReadyShards, ShardPlan, ShardTask, plan_shards, write_shard
from hbpe.pipeline.beam.units import UnitSummary, encode_unit
from hbpe.pipeline.corpus.documents import RecordPolicy
from hbpe.pipeline.corpus.files import WorkUnit
from hbpe.pipeline.parent_watch import exit_with_parent
from hbpe.pipeline.tokenizer.hierarchical import HierarchicalTokenizer
from hbpe.schemas.convert_config import ConvertConfig
from hbpe.schemas.errors import HbpeError

_TOK: HierarchicalTokenizer | None = None  # the tokenizer of a pool worker: inherited (fork) or loaded (spawn)
_TOK_STAGING: str | None = None  # the staging _TOK is this run's for (a Dask worker outlives a run)


def run_inprocess(
    tok: HierarchicalTokenizer,
    cfg: ConvertConfig,
    *,
    pending: Sequence[WorkUnit],
    done: dict[int, UnitSummary],
    keys: dict[int, str],
    staging: str,
    ctx: FinalizeContext,
    workers: int,
    on_running: Callable[[], None] = lambda: None,
    executor: Executor | None = None,
) -> dict[str, Any]:
    """Encode the pending units, plan and write the shards, commit; returns the manifest.

    `on_running` is called once the worker processes exist (the progress thread starts
    there: a fork while another thread runs could copy a held lock into a child).
    `executor`: run every unit and shard there (a Dask cluster's), not on a pool of this machine's.
    """
    global _TOK, _TOK_STAGING
    _TOK, _TOK_STAGING = tok, staging  # for the tasks run here, and inherited by forked workers
    policy = RecordPolicy(cfg.text_field, cfg.id_field, cfg.invalid_utf8, cfg.max_doc_bytes)
    # the pool is forked first, before this run starts threads (the progress bar's, tiktoken's): a fork copies
    # only the forking thread, and a lock another thread held at that moment would stay held in the child
    pool = executor or (_start_pool(staging, workers) if workers > 1 else None)
    on_running()
    try:
        threads = 1 if executor else _threads_per_unit(workers, len(pending))
        args = (staging, policy, cfg.text_unit, cfg.encode_batch_docs, threads)
        encode = [(u, keys.get(u.index, ""), *args) for u in pending]
        units, plan, entries = _encode_and_write(tok, cfg, encode, done, staging, pool, executor is not None, workers)
    except BaseException as e:
        if executor is not None:
            executor.shutdown(wait=False)  # cancels what has not run; the cluster's owner stops what runs
        elif pool is not None:
            _kill_pool(pool)
        if isinstance(e, BrokenProcessPool):
            raise HbpeError(
                f"a worker process of the in-process runner died ({e}); out of memory? try --workers 1"
            ) from e
        raise
    if pool is not None and executor is None:
        pool.shutdown(wait=True)
    return finalize_output(entries, ctx=ctx, units=units, plan=plan)


def _threads_per_unit(workers: int, units: int) -> int:
    """tiktoken threads per unit: about two per core in all, so that a unit left alone at the end still finds
    the cores the others no longer need (tiktoken releases the GIL), without hundreds of threads on a big machine.

    2 cores: 2 each; 16 cores and 100 units: 2 each; 16 cores and 4 units: 8 each; 1 unit: one per core.
    """
    in_flight = max(1, min(workers, units))
    return min(workers, max(1, -(-2 * workers // in_flight)))


def _encode_and_write(
    tok: HierarchicalTokenizer,
    cfg: ConvertConfig,
    encode: list[tuple],
    done: dict[int, UnitSummary],
    staging: str,
    pool: Executor | None,
    remote: bool,
    workers: int,
) -> tuple[list[UnitSummary], ShardPlan, list[tuple[int, dict[str, Any]]]]:
    """Encode the units (`encode`: _encode's arguments) and write every shard, each as soon as it is fixed.

    Returns every unit (`done` too), the plan and the shards' (index, MDS entry). A single unit runs
    here, on tiktoken threads; the shards go to the pool where there is one.
    """
    spp = cfg.samples_per_shard(tok.max_patch_size)
    order = sorted({*done, *(a[0].index for a in encode)})
    ready = ReadyShards(order, seq_len=cfg.seq_len, samples_per_shard=spp)
    tasks = _Tasks(pool, limit=sys.maxsize if remote else workers)  # Dask schedules a cluster's tasks itself
    early: list[ShardTask] = []
    summaries = dict(done)

    def write(shards: Sequence[ShardTask], *, first: bool = True) -> None:
        # on the pool even the last one alone: written here, it kept the pool's queue thread from the GIL, and the
        # shard queued just before it waited for it (traced: the last two shards one after the other, not together)
        tasks.add([(_write, (t, staging, cfg.seq_len, cfg.store_patches)) for t in shards], first=first)

    def record(s: UnitSummary) -> ShardPlan | None:
        """Record a unit, write what it fixes; after the last one, the plan, and its last shard written."""
        summaries[s.index] = s
        early.extend(shards := ready.add(s))
        write(shards)
        if len(summaries) < len(order):
            return None
        plan = plan_shards([summaries[i] for i in order], seq_len=cfg.seq_len, samples_per_shard=spp, tail=cfg.tail)
        if plan.tasks[: len(early)] != tuple(early):
            raise HbpeError("internal: the shards written while encoding differ from the plan; report this bug")
        rest = plan.tasks[len(early) :]
        write(rest, first=False)
        return plan

    plan = None
    for s in done.values():
        plan = record(s) or plan
    tasks.add([(_encode, a) for a in encode], here=len(encode) == 1 and not remote)  # one unit: here, all threads
    entries = []
    for fn, result in tasks.results():
        if fn is _write:
            entries.append(result)
        else:
            plan = record(result) or plan
    if plan is None:  # no unit at all
        plan = plan_shards([], seq_len=cfg.seq_len, samples_per_shard=spp, tail=cfg.tail)
    return [summaries[i] for i in order], plan, entries


class _Tasks:
    """Tasks on a pool, at most `limit` in flight, or here (no pool, or `here`), in queue order.

    The in-process runner's scheduler: a shard fixed while units wait is queued first, so it takes
    the next free process instead of waiting for every unit; `results` goes on with tasks added
    while it runs.
    """

    def __init__(self, pool: Executor | None, *, limit: int) -> None:
        self.pool, self.limit = pool, limit
        self.waiting: deque[tuple[Callable, tuple, bool]] = deque()
        self.running: dict[Future, Callable] = {}

    def add(self, tasks: list[tuple[Callable, tuple]], *, first: bool = False, here: bool = False) -> None:
        """Queue (fn, args) tasks in order, at the front with `first`; `here`: run them in this process."""
        items = [(fn, args, here or self.pool is None) for fn, args in tasks]
        if first:
            self.waiting.extendleft(reversed(items))
        else:
            self.waiting.extend(items)

    def results(self) -> Iterator[tuple[Callable, Any]]:
        """(fn, fn(*args)) for every task as it finishes, including tasks queued meanwhile."""
        while self.waiting or self.running:
            if self.waiting and (self.waiting[0][2] or len(self.running) < self.limit):
                fn, args, here = self.waiting.popleft()
                if here:
                    yield fn, fn(*args)
                else:
                    self.running[self.pool.submit(fn, *args)] = fn
                continue
            finished, _ = wait(self.running, return_when=FIRST_COMPLETED)
            for f in finished:
                yield self.running.pop(f), f.result()


def _encode(
    unit: WorkUnit, key: str, staging: str, policy: RecordPolicy, text_unit: str, batch_docs: int, threads: int
) -> UnitSummary:
    tok = _tokenizer(staging)
    return encode_unit(tok, unit, staging, policy, text_unit=text_unit, batch_docs=batch_docs, key=key, threads=threads)


def _write(task: ShardTask, staging: str, seq_len: int, store_patches: bool) -> tuple[int, dict[str, Any]]:
    return write_shard(_tokenizer(staging), staging, task, seq_len, store_patches=store_patches)


def _tokenizer(staging: str) -> HierarchicalTokenizer:
    """This run's tokenizer: the launcher's (here and in forked workers), else loaded from staging once (Dask)."""
    global _TOK, _TOK_STAGING
    if _TOK is None or staging != _TOK_STAGING:
        _TOK, _TOK_STAGING = fs.load_tokenizer(fs.join(staging, "tokenizer")), staging
    return _TOK


def _start_pool(staging: str, workers: int) -> ProcessPoolExecutor:
    fork = sys.platform == "linux"  # fork elsewhere is unsafe (macOS) or missing (Windows): spawn loads again
    ctx = multiprocessing.get_context("fork" if fork else "spawn")
    init = (staging, not fork, os.getpid())
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=init)
    # ProcessPoolExecutor forks all its workers at the first submit (3.11, fork context): do it now,
    # before the progress thread starts
    pool.submit(int).result()
    return pool


def _init_worker(staging: str, load: bool, launcher: int) -> None:
    """A worker ignores SIGINT (the launcher stops it), dies quietly on SIGTERM (the inherited handler would
    raise KeyboardInterrupt and print a traceback), and dies with its launcher (kill -9 included: blocked
    on the task pipe, whose write end every worker also holds, it would never see EOF)."""
    global _TOK
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    exit_with_parent(signal.SIGKILL, parent_pid=launcher)
    if _TOK is not None and getattr(_TOK, "_pool", None) is not None:
        _TOK._pool = None  # a thread pool made before the fork is a dead copy here (no thread is copied): a new one
    if load:
        _tokenizer(staging)


def _kill_pool(pool: ProcessPoolExecutor) -> None:
    """On an error or interrupt: kill the workers rather than wait for their tasks, so none writes after cleanup."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # no public way to stop them
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(timeout=5)
    pool.shutdown(wait=False, cancel_futures=True)
