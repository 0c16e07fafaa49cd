"""Faults of the third Dask audit: ``--dask-address`` at a server that accepts and never answers as a scheduler (an
HTTP server, a silent socket) hung ``learn`` forever in distributed's handshake, which ``Client(timeout=...)`` does
not bound; and merging a torch classifier with a NumPy one printed torch's warning about a read-only NumPy array."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from helpers import build_store

REPO = Path(__file__).resolve().parents[1]
#: The connect deadline the child process runs under (CONNECT_TIMEOUT, 20 s by default), and the slack on top of it for
#: the child's imports and the refusal on a shared machine: a hang is cut by the subprocess timeout well above both.
DEADLINE, SLACK, HANG = 2, 25, 120


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002  the request log would only clutter the test's output
        pass


@contextmanager
def _http_server() -> Iterator[int]:
    """What ``python -m http.server PORT --bind 127.0.0.1`` runs, in a thread here: its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _silent_socket() -> Iterator[int]:
    """A socket that accepts every connection and never writes to it (nor closes it): its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    held: list[socket.socket] = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        for conn in held:
            conn.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("dask3") / "blobs.zarr")


@pytest.mark.parametrize("listener", [_http_server, _silent_socket], ids=["http-server", "silent-socket"])
def test_a_server_that_never_answers_as_a_scheduler_is_refused_within_the_deadline(store, tmp_path, listener):
    """Before: the child waited forever in the handshake (killed here after HANG s). Now: the one-line refusal
    after the deadline, exit 1, no --out, and the process ends (no thread or socket left holding it)."""
    pytest.importorskip("distributed")
    out = tmp_path / "run"
    code = (f"import foal_pipe.cluster as c; c.CONNECT_TIMEOUT = {DEADLINE}; "
            "from foal_pipe.cli import main; main()")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    with listener() as port:
        address = f"tcp://127.0.0.1:{port}"
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", code, "learn", "--features", str(store), "--out", str(out), "--tasks", "4",
                               "--projection-dim", "32", "--scheduler", "dask", "--dask-address", address],
                              capture_output=True, text=True, timeout=HANG, env=env)
        took = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert lines == [f"Error: cannot connect to the Dask scheduler at '{address}' (TimeoutError); start one with `dask "
                     "scheduler` and pass its tcp://host:port, or use --dask-address local"], proc.stderr
    assert DEADLINE <= took < DEADLINE + SLACK
    assert not out.exists()


def test_a_refused_connect_leaves_no_client_thread_or_socket(monkeypatch):
    """In process: the refusal comes at the deadline, and the client that failed to start is closed at once (its
    loop thread stopped, its socket closed: the silent server reads end-of-file), not left as the default client."""
    distributed = pytest.importorskip("distributed")
    from distributed.client import _get_global_client

    from foal_pipe import cluster
    from foal_pipe.errors import FoalPipeError

    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT", DEADLINE, raising=False)
    before = set(threading.enumerate())
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(DEADLINE + SLACK)
    outcome: list[object] = []

    def connect():
        try:
            with cluster.dask_client(f"tcp://127.0.0.1:{server.getsockname()[1]}"):
                outcome.append("connected")
        except FoalPipeError as exc:
            outcome.append(exc)

    start = time.monotonic()
    thread = threading.Thread(target=connect, daemon=True)  # the old code never returns: a daemon the test can leave
    thread.start()
    try:
        conn = server.accept()[0]
        thread.join(DEADLINE + SLACK)
        took = time.monotonic() - start
        assert not thread.is_alive(), "the connect never returned"
        assert DEADLINE <= took < DEADLINE + SLACK
        assert len(outcome) == 1 and isinstance(outcome[0], FoalPipeError)
        assert str(outcome[0]).startswith("cannot connect to the Dask scheduler at ")
        conn.settimeout(DEADLINE)
        while conn.recv(65536):  # the handshake the client sent, then end-of-file once it closed its socket
            pass
        conn.close()
    finally:
        server.close()
    time.sleep(0.5)
    assert _get_global_client() is None
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()], distributed.__version__


def test_merging_a_torch_classifier_with_a_numpy_one_warns_nothing_and_is_exact():
    """Before: torch's UserWarning "The given NumPy array is not writable" (the NumPy classifier's statistics_ are
    read-only views, which torch would have shared); the views stay read-only, the merge equals one fit."""
    torch = pytest.importorskip("torch")
    from foal_pipe.model.classifier import AnalyticClassifier

    rng = np.random.default_rng(0)
    H, y = rng.standard_normal((300, 20)), rng.integers(0, 4, 300)
    a = AnalyticClassifier(backend="torch").fit(H[:150], y[:150])
    b = AnalyticClassifier(backend="numpy").fit(H[150:], y[150:])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        merged = a.merge(b)
        a_stats, b_stats = a.statistics_, b.statistics_
        a_stats += b_stats
    single = AnalyticClassifier(backend="torch").fit(H, y)
    assert isinstance(merged.statistics_.G, torch.Tensor)  # this classifier's backend, the other's sums joined to it
    np.testing.assert_allclose(merged.coef_, single.coef_, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a_stats.G.cpu().numpy(), single.statistics_.G.cpu().numpy(), rtol=0, atol=1e-12)
    assert not b.statistics_.G.flags.writeable and not b.statistics_.Q.flags.writeable
    np.testing.assert_array_equal(merged.predict(H), single.predict(H))
