"""Run one `foal-pipe` CLI subprocess and measure it, the one helper every benchmark script uses.

Peak RSS and CPU time come from ``os.wait4``: the child's own resource usage, not ``RUSAGE_CHILDREN``'s
running maximum over every child so far. stderr goes to a temporary file (a pipe left unread could fill
and stall a long run) and is shown only on failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple


class CliRun(NamedTuple):
    seconds: float  # wall time, start-up included
    cpu_seconds: float  # user + system time of the child: less sensitive than wall time to other jobs' load
    peak_rss_mib: float  # the child's peak resident set size


def run_cli(args: list[str], env: dict[str, str] | None = None) -> CliRun:
    """Run ``foal-pipe ARGS`` (the venv's entry point beside this interpreter); exit with its stderr if it fails."""
    exe = str(Path(sys.executable).with_name("foal-pipe"))
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen([exe, *args], stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"foal-pipe {' '.join(args)} failed ({proc.returncode}): {err.read().decode()}")
    return CliRun(seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


def blas_env(threads: int) -> dict[str, str]:
    """This environment with every BLAS/OpenMP thread count set to ``threads``, for the children."""
    return {**os.environ, **{k: str(threads) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}}
