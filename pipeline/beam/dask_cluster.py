"""`--runner DaskRunner`: the in-process runner's steps as tasks on a Dask cluster.

The units are encoded and the shards written by the same functions as in process
(inprocess.py), each one a Dask task, so the output is byte-identical; the launcher plans
the shards and commits the output between them, as it does in process. The cluster is the
scheduler at `--dask-address` (infra/README.md, infra/dask.sh), or a LocalCluster of one worker
process per core (`--workers`) on 127.0.0.1, started for the run and closed after it.

Why not Beam's own DaskRunner (`--runner apache_beam.runners.dask.dask_runner.DaskRunner`,
Beam 2.71, which still runs): it puts up to 128 elements in one Dask partition, so the
units of a job are encoded one after another in one task; its Reshuffle is a no-op, so
nothing spreads them; it computes every side input again inside a worker, so each unit
was encoded three times (measured on 5 units); and it reports no metrics and never closes
its client. Tasks of a worker that dies are run again by Dask on another (its
`allowed-failures`, 3 by default): every file a task writes is written to a temporary
name and renamed, so a task run twice writes the same bytes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from concurrent.futures import Executor

from hbpe.schemas.errors import ConfigError

DASK = "DaskRunner"
CONNECT_TIMEOUT_S = 30
_LOGGERS = ("distributed", "tornado")  # distributed logs its scheduler's and nannies' life at INFO/WARNING


@contextlib.contextmanager
def dask_executor(address: str | None, workers: int, say) -> Iterator[Executor]:
    """A concurrent.futures Executor whose tasks run on the Dask cluster; `say` gets one line naming it.

    Closed in order on the way out (the client, then a LocalCluster it started), with distributed's
    loggers silenced: a closing cluster otherwise prints CommClosedError tracebacks and
    "Nanny: Restarting worker" for workers that are merely being stopped.
    """
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ConfigError("--runner DaskRunner needs dask.distributed: pip install 'hbpe[dask]'") from None
    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    cluster = client = None
    try:
        if address:
            try:
                client = Client(address, timeout=CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError, ValueError) as e:
                raise ConfigError(
                    f"cannot reach the Dask scheduler at --dask-address {address} ({e}); start one "
                    "(`dask scheduler`, infra/dask/README.md) or drop --dask-address for a local cluster"
                ) from None
            n = len(client.scheduler_info().get("workers", {}))
            say(f"dask: scheduler {address}, {n} worker(s) now (more may join)")
        else:
            cluster = LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address=None, silence_logs=logging.ERROR,
            )  # fmt: skip
            client = Client(cluster)
            say(f"dask: LocalCluster of {workers} worker process(es) on 127.0.0.1 (--dask-address for a cluster)")
        yield client.get_executor(pure=False)
    finally:
        for name in _LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        for closing in (client, cluster):
            if closing is not None:
                with contextlib.suppress(Exception):  # already gone (a worker or the scheduler died): nothing to do
                    closing.close()
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
