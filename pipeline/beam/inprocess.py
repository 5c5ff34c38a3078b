"""The in-process runner: the conversion's steps without Beam, for jobs where Beam's fixed cost dominates.

The same functions as the Beam steps, in the same order, so the output is byte-identical:

    summaries = encode_unit(u) for each pending unit           # units.py, what EncodeUnits runs
    plan      = plan_shards(summaries)                          # shards.py, what PlanShards runs
    entries   = write_shard(t) for each shard task              # shards.py, what WriteMdsShards runs
    manifest  = finalize_output(entries, summaries, plan)       # finalize.py, what FinalizeOutput runs

Work goes to a pool of worker processes, forked from the launcher once at the start (they
inherit the loaded tokenizer: no second load, no Beam import, ~10 ms to start); a single
unit or shard runs in the launcher itself. Units are encoded on tiktoken threads, about two
per core in all (tiktoken releases the GIL: 2 threads encode 1.95x as fast as one here), so
a unit left alone at the end still uses every core. Shards go to the processes too, one each (the
`zstd` module already compresses on a thread per core; its output does not depend on how many).

Given an `executor` (a Dask cluster's, dask_cluster.py), every unit and shard is a task on it
instead, one tiktoken thread each (a Dask worker is a process per core); a worker loads the
tokenizer from staging once, at its first task of the run.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from hbpe.pipeline.beam import fs
from hbpe.pipeline.beam.finalize import FinalizeContext, finalize_output
from hbpe.pipeline.beam.shard_tasks import ShardTask, plan_shards, write_shard
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
        summaries = dict(done)
        threads = 1 if executor else _threads_per_unit(workers, len(pending))
        args = (staging, policy, cfg.text_unit, cfg.encode_batch_docs, threads)
        encode_on = pool if len(pending) > 1 or executor else None  # one unit: here, on tiktoken threads
        for s in _map(encode_on, _encode, [(u, keys.get(u.index, ""), *args) for u in pending]):
            summaries[s.index] = s
        units = [summaries[i] for i in sorted(summaries)]
        S = tok.max_patch_size
        plan = plan_shards(units, seq_len=cfg.seq_len, samples_per_shard=cfg.samples_per_shard(S), tail=cfg.tail)
        write_on = pool if len(plan.tasks) > 1 or executor else None
        write = [(t, staging, cfg.seq_len, cfg.store_patches) for t in plan.tasks]
        entries = list(_map(write_on, _write, write))
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


def _map(pool: Executor | None, fn: Callable, tasks: list[tuple]) -> Any:
    """fn(*task) for every task, in this process or on the pool, yielding results as they finish."""
    if pool is None:
        for t in tasks:
            yield fn(*t)
        return
    futures = [pool.submit(fn, *t) for t in tasks]
    for f in as_completed(futures):
        yield f.result()


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
