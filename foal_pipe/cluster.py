"""The Dask client both distributed stages use (``--scheduler dask``; ``pip install 'foal-pipe[dist]'``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING

from foal_pipe.errors import FoalPipeError, param

if TYPE_CHECKING:
    from distributed import Client

#: Seconds to wait for a remote cluster to have at least one worker.
WORKER_TIMEOUT = 60


def require_distributed() -> ModuleType:
    """The ``distributed`` package, or a one-line error naming the extra to install."""
    try:
        import dask.array  # noqa: F401
        import distributed
    except ImportError:
        raise FoalPipeError(
            f"{param('scheduler', 'dask')} needs dask.distributed, which is not installed; "
            f"install it with `pip install 'foal-pipe[dist]'` or use {param('scheduler', 'local')}"
        ) from None
    return distributed


@contextmanager
def dask_client(address: str | None = "local", workers: int = 2) -> Iterator[Client]:
    """A connected client: ``local`` starts a LocalCluster of ``workers`` processes (closed on exit),
    anything else is a scheduler address such as ``tcp://host:8786`` (left running on exit)."""
    distributed = require_distributed()
    if address in (None, "", "local"):
        if workers < 1:
            raise FoalPipeError(f"{param('workers')} must be at least 1, got {workers}")
        cluster = distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        )
        client = distributed.Client(cluster)
    else:
        cluster = None
        try:
            client = distributed.Client(address, timeout="20s")
        except (OSError, TimeoutError, ValueError) as exc:
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
        client.close()
        if cluster is not None:
            cluster.close()


def n_workers(client: Client) -> int:
    return max(1, len(client.scheduler_info().get("workers", {})))
