"""The process at one of its limits is named as such, wherever it strikes (follows test_audit_limits_s23).

Too many open files or a thread that cannot start, met while a chunk is decoded (``info --verify``, a ``learn`` read),
is not a damaged chunk; a write of standard output past the file-size limit names standard output; an ``atexit``
handler's error after a one-line failure adds nothing; a lock file whose holder record cannot be written is removed
when this call made it, and kept when it did not; a write that fails on the open-file limit does not say "free some
space".
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cluster_store
from test_audit_limits_s23 import ENTRY, LEARN, assert_one_line_failure, foal

from foal_pipe.errors import FoalPipeError
from foal_pipe.io import atomic_dir, atomic_path
from foal_pipe.store import lock as lockmod

#: Each chunk file read from the store's Nth file read on (metadata counted too, from 1) raises RAISE (an expression).
FAIL_FROM_READ = """
import errno, os
import foal_pipe.store.chunks as _chunks
_real, _reads = _chunks.StrictLocalStore._read, [0]
def _read(self, key, prototype, byte_range):
    _reads[0] += 1
    if _reads[0] >= {n} and "/c/" in key:
        raise {raise_}
    return _real(self, key, prototype, byte_range)
_chunks.StrictLocalStore._read = _read
"""
EMFILE = 'OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(self.root / key))'
NO_THREAD = 'RuntimeError("can\'t start new thread")'


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return cluster_store(tmp_path_factory.mktemp("limits") / "s.zarr", n_classes=6, dim=16, n_test=120, chunk_rows=32,
                         seed=0, n_train=600)


@pytest.mark.parametrize("n", [1, 6])
def test_too_many_open_files_while_verifying_is_not_a_damaged_chunk(store, tmp_path, n):
    """Before: `info --verify` listed every chunk read after the limit as "damaged (OSError: [Errno 24] Too many open
    files ...)" and told to re-extract the store."""
    proc, left = foal(["info", store, "--verify"], tmp_path, prelude=FAIL_FROM_READ.format(n=n, raise_=EMFILE))
    line = assert_one_line_failure(proc, "damaged", "re-extract", "free some space")
    assert "Too many open files (EMFILE)" in line and "ulimit -n" in line, line
    assert left == []


def test_a_thread_that_cannot_start_mid_read_is_not_a_damaged_chunk(store, tmp_path):
    """Before: "chunk at rows ... is damaged (RuntimeError: can't start new thread); re-extract it"."""
    proc, left = foal([*LEARN, "--features", store, "--out", tmp_path / "run"], tmp_path,
                      prelude=FAIL_FROM_READ.format(n=8, raise_=NO_THREAD))
    line = assert_one_line_failure(proc, "damaged", "re-extract")
    assert "a thread could not start" in line, line
    assert not (tmp_path / "run").exists() and left == []


def test_standard_output_past_the_file_size_limit_is_named(store, tmp_path):
    """Before: "Error: File too large (EFBIG); check the path, ..." -- no path: the output was standard output."""
    run = tmp_path / "run"
    assert foal([*LEARN, "--features", store, "--out", run], tmp_path)[0].returncode == 0

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))

    with open(tmp_path / "rows.csv", "w") as out:
        proc = subprocess.run([sys.executable, "-c", ENTRY.format(prelude=""), "predict", "--model",
                               str(run / "model.safetensors"), "--features", str(store)], cwd=tmp_path, stdout=out,
                              stderr=subprocess.PIPE, text=True, preexec_fn=limit, timeout=300,
                              env=dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="400"))
    line = assert_one_line_failure(proc)
    assert line.startswith("Error: standard output: File too large (EFBIG);") and "ulimit -f" in line, line


ATEXIT_FAILS = "import atexit\natexit.register(lambda: 1 / 0)"


def test_an_atexit_error_after_a_failed_command_adds_nothing(store, tmp_path):
    """Before: the one line, then "Exception ignored in atexit callback" and a traceback. After a command that
    succeeded the error is still shown: nothing else said why the process went wrong."""
    proc, _ = foal(["info", tmp_path / "missing.zarr"], tmp_path, prelude=ATEXIT_FAILS)
    assert "does not exist" in assert_one_line_failure(proc)
    proc, _ = foal(["info", store], tmp_path, prelude=ATEXIT_FAILS)
    assert proc.returncode == 0 and "ZeroDivisionError" in proc.stderr, proc.stderr


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _no_holder_record(monkeypatch) -> None:
    def pwrite(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))

    monkeypatch.setattr(lockmod.os, "pwrite", pwrite)


def test_a_lock_whose_record_cannot_be_written_is_removed_and_closed(tmp_path, monkeypatch):
    _no_holder_record(monkeypatch)
    before = _open_descriptors()
    said = r"cannot write the lock file .*s\.zarr\.lock: File too large \(EFBIG\); .*ulimit -f"
    refused = pytest.raises(FoalPipeError, match=said)
    with refused, lockmod.exclusive_lock(tmp_path / "s.zarr"):
        pytest.fail("the body ran without a lock")
    assert os.listdir(tmp_path) == [] and _open_descriptors() == before


def test_a_lock_file_this_call_did_not_create_is_kept(tmp_path, monkeypatch):
    """A lock file left by a dead holder (its flock released, its record kept) is not this call's to remove."""
    lock = tmp_path / "s.zarr.lock"
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "since": "2020-01-01T00:00:00+00:00"}))
    _no_holder_record(monkeypatch)
    with pytest.raises(FoalPipeError, match="cannot write the lock file"), lockmod.exclusive_lock(tmp_path / "s.zarr"):
        pytest.fail("the body ran without a lock")
    assert os.listdir(tmp_path) == ["s.zarr.lock"]


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_write_at_the_open_file_limit_does_not_ask_for_space(tmp_path, kind):
    """Before: "cannot write OUT: Too many open files (EMFILE); free some space or choose another ..."."""
    target = tmp_path / "out"
    writer = atomic_path(target) if kind == "file" else atomic_dir(target)
    with pytest.raises(FoalPipeError) as info, writer:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
    message = str(info.value)
    assert message.startswith(f"cannot write {target}: Too many open files (EMFILE); "), message
    assert "ulimit -n" in message and "free some space" not in message, message
    assert ("previous outputs are unchanged" in message) == (kind == "directory"), message
    assert os.listdir(tmp_path) == []
