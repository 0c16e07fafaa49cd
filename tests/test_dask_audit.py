"""Faults the Dask audit of 2026-11-29 found: a head's read waited forever once every worker of an external cluster
was killed, and an address where something other than a Dask scheduler listens ended in a traceback."""

from __future__ import annotations

import socket
import threading

import pytest

from foal_pipe import cluster
from foal_pipe.errors import FoalPipeError


class _Pending:
    """A future whose task never runs (its workers are gone)."""

    def result(self, timeout=None):
        raise TimeoutError


class _Client:
    def __init__(self, workers):
        self.workers = workers

    def scheduler_info(self):
        return {"workers": self.workers}


def test_a_result_waits_while_workers_remain_and_is_refused_once_none_are_left(monkeypatch):
    monkeypatch.setattr(cluster, "WORKER_TIMEOUT", 0.05)
    with pytest.raises(FoalPipeError, match=r"^the Dask cluster has had no worker for 0.05 s during the run"):
        cluster.cluster_result(_Client({}), _Pending(), poll=0.01)

    class Later(_Pending):
        calls = 0

        def result(self, timeout=None):
            Later.calls += 1
            if Later.calls < 20:  # longer than WORKER_TIMEOUT, with a worker all along
                raise TimeoutError
            return "rows"

    assert cluster.cluster_result(_Client({"tcp://w": {}}), Later(), poll=0.01) == "rows"


def test_an_address_that_is_no_dask_scheduler_is_one_line():
    pytest.importorskip("distributed")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    port = server.getsockname()[1]

    def answer():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        with pytest.raises(FoalPipeError, match=r"cannot connect to the Dask scheduler at 'tcp://127.0.0.1:\d+'"), \
                cluster.dask_client(f"tcp://127.0.0.1:{port}"):
            pass
    finally:
        server.close()
