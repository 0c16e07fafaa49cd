"""The Dask client both distributed stages use (``--scheduler dask``; ``pip install -e '.[dist]'`` in the clone)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import ModuleType
from typing import TYPE_CHECKING, Any

from foal_pipe.errors import FoalPipeError, clipped, param

if TYPE_CHECKING:
    from distributed import Client

#: Seconds to reach a remote scheduler, handshake included, before "cannot connect to the Dask scheduler".
CONNECT_TIMEOUT: float = 20
#: Seconds to wait for a remote cluster to have at least one worker.
WORKER_TIMEOUT = 60
#: The level of distributed's loggers while foal-pipe holds a client: its task failures and lost workers are
#: reported as one ``Error:`` line by foal-pipe, so the cluster's own tracebacks would only repeat them on stderr.
QUIET = logging.CRITICAL


def require_distributed() -> ModuleType:
    """The ``distributed`` package, or a one-line error naming the extra to install."""
    try:
        import dask.array  # noqa: F401
        import distributed
    except ImportError:
        raise FoalPipeError(
            f"{param('scheduler', 'dask')} needs dask.distributed, which is not installed; "
            f"install it in the foal-pipe clone with `pip install -e '.[dist]'` or use {param('scheduler', 'local')}"
        ) from None
    return distributed


def cluster_errors() -> tuple[type[BaseException], ...]:
    """The exceptions by which distributed reports a cluster lost under a run (workers or scheduler killed, the
    connection closed), as opposed to a task's own error."""
    import asyncio
    import concurrent.futures

    from distributed.client import ClosedClientError
    from distributed.comm.core import CommClosedError
    from distributed.scheduler import KilledWorker

    return (concurrent.futures.CancelledError, asyncio.CancelledError, KilledWorker, CommClosedError, ClosedClientError)


def lost_or_unreachable() -> tuple[type[BaseException], ...]:
    """:func:`cluster_errors` and the I/O errors of a connection to a cluster that is gone (closing a client, the
    first message to its workers)."""
    return (*cluster_errors(), OSError, TimeoutError)


def cluster_failure(exc: BaseException) -> FoalPipeError:
    """The one-line error for a cluster lost under a run (one of :func:`cluster_errors`)."""
    return FoalPipeError(f"the Dask cluster failed during the run ({type(exc).__name__}); previous outputs are "
                         "unchanged: check the workers and re-run")


class NoWorkers(FoalPipeError):
    """The cluster has had no worker for :data:`WORKER_TIMEOUT` s: said here, not by a task."""


class WorkerWatch:
    """Since when a cluster has had no worker, as seen by every thread that waits on it: one clock, so a run stops
    :data:`WORKER_TIMEOUT` s after its last worker left, not that long after the last of its queued reads began."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._alone_since: float | None = None
        self._lock = threading.Lock()

    def check(self) -> None:
        """Refuse the run once the cluster has had no worker for :data:`WORKER_TIMEOUT` s."""
        with self._lock:
            if self.client.scheduler_info().get("workers"):
                self._alone_since = None
            elif self._alone_since is None:
                self._alone_since = time.monotonic()
            elif time.monotonic() - self._alone_since > WORKER_TIMEOUT:
                raise NoWorkers(f"the Dask cluster has had no worker for {WORKER_TIMEOUT} s during the run; previous "
                                "outputs are unchanged: check the workers and re-run")


def cluster_result(client: Any, future: Any, poll: float = 2.0, watch: WorkerWatch | None = None) -> Any:
    """``future.result()``, refused once the cluster has had no worker for :data:`WORKER_TIMEOUT` s (``watch``: the
    clock shared by the run's threads, else one of its own): a task left without workers (all killed under the run)
    waits for new ones and never fails by itself."""
    watch = watch or WorkerWatch(client)
    while True:
        try:
            return future.result(timeout=poll)
        except TimeoutError:
            watch.check()


def check_workers(workers: object) -> int:
    """``--workers`` for a LocalCluster: an integer of at least 1 (not a boolean), else a one-line error."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise FoalPipeError(f"{param('workers')} must be at least 1, got {workers!r}; pass e.g. {param('workers', 2)}")
    return workers


def is_local(address: str | None) -> bool:
    """Whether ``address`` asks for a LocalCluster that foal-pipe starts (``local``, or none)."""
    return address in (None, "", "local")


@contextmanager
def quiet_logs() -> Iterator[None]:
    """distributed's loggers in this process at :data:`QUIET` for the duration (restored after)."""
    names = ["distributed", *(n for n in list(logging.Logger.manager.loggerDict) if n.startswith("distributed."))]
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(QUIET)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def connect(address: str) -> Client:
    """A client of the scheduler at ``address``, connected within :data:`CONNECT_TIMEOUT` s overall, else an error.

    ``Client(timeout=...)`` bounds the TCP connect alone: the handshake after it waits forever on a server that
    accepts and never answers as a scheduler (an HTTP server, a silent socket). ``callback_timeout`` bounds the
    whole start on the client's own event loop, which cancels the handshake there; a client that failed to start
    is closed at once (its socket and loop thread), not left to the interpreter's exit."""
    from distributed import Client

    class Bounded(Client):
        def start(self, **kwargs: Any) -> None:
            try:
                super().start(callback_timeout=CONNECT_TIMEOUT, **kwargs)
            except BaseException:
                with suppress(Exception):  # the start's error is the one to report
                    self.close(timeout=CONNECT_TIMEOUT)
                raise

    return Bounded(address, timeout=CONNECT_TIMEOUT)


def _local_client(distributed: ModuleType, workers: int) -> tuple[Client, Any]:
    """A client of a new LocalCluster of ``workers`` processes, else a one-line error: a worker that dies as the
    cluster starts (killed, out of memory) makes distributed raise ("Nanny failed to start.") with chained
    tracebacks; whatever was started is closed."""
    cluster = None
    try:
        cluster = distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=QUIET,
        )
        return distributed.Client(cluster), cluster
    except Exception as exc:  # noqa: BLE001  any failure to start is reported the same way
        if cluster is not None:
            with suppress(Exception):  # the start's error is the one to report
                cluster.close()
        reason = clipped(next(iter(str(exc).splitlines()), ""))
        raise FoalPipeError(
            f"cannot start a local Dask cluster of {workers} worker process(es) ({type(exc).__name__}: {reason}); "
            f"check that the workers are not killed (memory, process limits) and re-run, or use "
            f"{param('scheduler', 'local')}"
        ) from None


@contextmanager
def _environ_kept() -> Iterator[None]:
    """The process's environment as it was, on leaving: a LocalCluster's nannies write their workers' settings into it
    (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and ``OPENBLAS_NUM_THREADS`` of 1, ``PYTHONHASHSEED``, ...), which
    stayed for the rest of a notebook's or service's life: every subprocess it started after a Dask run ran its BLAS
    on one thread, with other last bits than the same command started before."""
    kept = dict(os.environ)
    try:
        yield
    finally:
        for name in [name for name in os.environ if name not in kept]:
            del os.environ[name]
        os.environ.update({name: value for name, value in kept.items() if os.environ.get(name) != value})


@contextmanager
def dask_client(address: str | None = "local", workers: int = 2) -> Iterator[Client]:
    """A connected client: ``local`` starts a LocalCluster of ``workers`` processes (closed on exit),
    anything else is a scheduler address such as ``tcp://host:8786`` (left running on exit). distributed's own
    logs are quiet meanwhile (:data:`QUIET`): foal-pipe reports failures itself, in one line."""
    distributed = require_distributed()
    if not is_local(address) and not isinstance(address, str):
        raise FoalPipeError(f"{param('dask_address')} must be 'local' or a scheduler address such as tcp://host:8786, "
                            f"got {address!r}")
    with quiet_logs(), _environ_kept():
        if is_local(address):
            client, cluster = _local_client(distributed, check_workers(workers))
        else:
            cluster = None
            try:
                client = connect(str(address))  # a str: checked above
            except Exception as exc:  # noqa: BLE001  also what a server that is no Dask scheduler answers with
                # (an HTTP server's reply read as a message length: a MemoryError of exbibytes; a silent one: a timeout)
                raise FoalPipeError(
                    f"cannot connect to the Dask scheduler at {address!r} ({type(exc).__name__}); start one with "
                    f"`dask scheduler` and pass its tcp://host:port, or use {param('dask_address', 'local')}"
                ) from None
            try:
                client.wait_for_workers(1, timeout=WORKER_TIMEOUT)
            except (TimeoutError, OSError):
                client.close()
                raise FoalPipeError(
                    f"the Dask scheduler at {address} has no workers after {WORKER_TIMEOUT} s; start some with "
                    f"`dask worker {address}`"
                ) from None
        try:
            yield client
        finally:
            try:
                client.close()
                if cluster is not None:
                    cluster.close()
            except lost_or_unreachable():  # a cluster already lost: nothing left to close
                pass


def n_workers(client: Client) -> int:
    return max(1, len(client.scheduler_info().get("workers", {})))
