"""`--runner dask`: the in-process runner's steps as tasks on a Dask cluster.

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

`--dask-address` is probed before anything is written (check_scheduler): a closed port, a
program that is not a Dask scheduler (an HTTP server, garbage bytes) or a worker's address is
one ConfigError within HBPE_DASK_TIMEOUT seconds (30 by default) and a few more, where
distributed's Client hung or ran out of memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from hbpe.schemas.errors import ConfigError

TIMEOUT_ENV = "HBPE_DASK_TIMEOUT"
CONNECT_TIMEOUT_S = 30.0  # to reach --dask-address's scheduler, unless HBPE_DASK_TIMEOUT says otherwise
HANDSHAKE_GRACE_S = 5.0  # and then to hear its handshake (a scheduler answers in milliseconds)
_LOGGERS = ("distributed", "tornado")  # distributed logs its scheduler's and nannies' life at INFO/WARNING


@contextlib.contextmanager
def dask_executor(address: str | None, workers: int, say, *, timeout_s: float | None = None) -> Iterator[Executor]:
    """A concurrent.futures Executor whose tasks run on the Dask cluster; `say` gets one line naming it.

    Closed in order on the way out (the client, then a LocalCluster it started), with distributed's
    loggers silenced: a closing cluster otherwise prints CommClosedError tracebacks and
    "Nanny: Restarting worker" for workers that are merely being stopped.
    """
    _require_distributed()
    from distributed import Client, LocalCluster

    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    for name in _LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    cluster = client = None
    timeout_s = connect_timeout() if timeout_s is None else timeout_s
    try:
        if address:
            check_scheduler(address, timeout_s)
            try:
                client = Client(address, timeout=timeout_s)
            except (OSError, TimeoutError, ValueError) as e:
                raise _unreachable(address, str(e)) from None
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


def _require_distributed() -> None:
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise ConfigError("--runner dask needs dask.distributed: pip install 'hbpe[dask]'") from None


def connect_timeout() -> float:
    """Seconds to reach --dask-address's scheduler: $HBPE_DASK_TIMEOUT, else 30."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return CONNECT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r}: must be a number of seconds > 0; e.g. {TIMEOUT_ENV}=30")
    return value


def check_scheduler(address: str, timeout_s: float | None = None) -> None:
    """Refuse `address` unless a Dask scheduler answers there within `timeout_s` (connect_timeout()) and a few
    seconds more, with one ConfigError.

    distributed's Client waits for the peer's handshake with no timeout: pointed at another program that
    accepts the connection and says nothing (an HTTP server waiting for a request), it hung for good, and
    one that answers garbage made it read a frame length from it ("MemoryError: Unable to allocate 3.07
    EiB"). The probe runs distributed's own handshake and an `identity` call under a deadline, on a loop of
    its own in a thread (a caller may already run one: a notebook).
    """
    _require_distributed()
    _check_address(address)
    timeout_s = connect_timeout() if timeout_s is None else timeout_s
    # past the connect timeout (distributed retries a refused connection until then, and raises OSError),
    # so that running out of time means a peer that accepted the connection and said nothing
    deadline = timeout_s + min(HANDSHAKE_GRACE_S, timeout_s)
    with ThreadPoolExecutor(1, thread_name_prefix="hbpe-dask-probe") as pool:
        try:
            identity = pool.submit(asyncio.run, _identity(address, timeout_s, deadline)).result()
        except TimeoutError:
            why = f"it accepted the connection but gave no Dask handshake within {deadline:g} s"
            raise _not_dask(address, why) from None
        except OSError as e:  # nothing listens (distributed retries until timeout_s), or the peer hung up
            raise _unreachable(address, str(e)) from None
        except Exception:  # noqa: BLE001 - whatever decoding the peer's bytes raised (MemoryError, msgpack's)
            raise _not_dask(address, "it answered in bytes that are not Dask's protocol") from None
    kind = identity.get("type") if isinstance(identity, dict) else None
    if kind != "Scheduler":
        what = f"a Dask {kind}" if isinstance(kind, str) else "a Dask server of unknown type"
        raise _not_dask(address, f"it speaks Dask's protocol but is {what:.60}, not the scheduler")


def _check_address(address: str) -> None:
    """Refuse an address distributed cannot parse (else its ValueError would read as the peer's garbage)."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    try:
        scheme, where = parse_address(address)
        get_backend(scheme)
        if scheme in ("tcp", "tls", "ws", "wss"):
            parse_host_port(where)
    except ValueError as e:
        raise ConfigError(
            f"--dask-address {address!r} is not an address of a Dask scheduler ({e}); pass the one `dask scheduler` "
            "prints, e.g. tcp://HOST:8786"
        ) from None


async def _identity(address: str, timeout_s: float, deadline_s: float) -> Any:
    """The `identity` of the Dask server at `address` (its "type": Scheduler, Worker, Nanny), within `deadline_s`."""
    from distributed.comm import connect
    from distributed.security import Security

    async def ask() -> Any:
        comm = await connect(address, timeout=timeout_s, **Security().get_connection_args("client"))
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    return await asyncio.wait_for(ask(), deadline_s)


def _unreachable(address: str, why: str) -> ConfigError:
    return ConfigError(
        f"cannot reach the Dask scheduler at --dask-address {address} ({why}); start one "
        "(`dask scheduler`, infra/README.md) or drop --dask-address for a local cluster"
    )


def _not_dask(address: str, why: str) -> ConfigError:
    return ConfigError(
        f"--dask-address {address} is not a Dask scheduler: {why}; pass the address `dask scheduler` prints "
        "(tcp://HOST:8786 by default) or drop --dask-address for a local cluster"
    )
