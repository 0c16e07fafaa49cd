"""Run one `foal-pipe` CLI subprocess and measure it, the one helper every benchmark script uses.

Peak RSS and CPU time come from ``os.wait4``: the child's own resource usage, not ``RUSAGE_CHILDREN``'s
running maximum over every child so far. stderr goes to a temporary file (a pipe left unread could fill
and stall a long run) and is shown only on failure.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from argparse import ArgumentParser
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple


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


def round_robin(commands: Mapping[str, Sequence[str]], common: Sequence[str], tmp: Path,
                repeats: int) -> dict[str, list[tuple[float, dict]]]:
    """Each command ``repeats`` times, interleaved (so load from other processes hits every command alike), with
    ``common`` appended and ``--out tmp/out{i}``: ``{name: [(wall seconds, its timings.json), ...]}``. The
    outputs of the last round stay in ``tmp/out{i}``."""
    runs: dict[str, list[tuple[float, dict]]] = {name: [] for name in commands}
    for _ in range(repeats):
        for i, (name, cmd) in enumerate(commands.items()):
            out = tmp / f"out{i}"
            seconds = run_cli([*cmd, *common, "--out", str(out)]).seconds
            runs[name].append((seconds, json.loads((out / "timings.json").read_text())))
            print(f"{name:<50} {seconds:7.2f} s", flush=True)
    return runs


def medians(runs: Mapping[str, list[tuple[float, dict]]], base: str) -> dict[str, dict[str, Any]]:
    """Each command's median wall time, every run's, the ratio to ``base``'s median and the median run's steps."""
    reference = statistics.median(s for s, _ in runs[base])
    summary = {}
    for name, rs in runs.items():
        times = [s for s, _ in rs]
        median = statistics.median(times)
        summary[name] = {"median_s": median, "all_s": times, "ratio_to_learn": median / reference,
                         "timings_of_median_run": sorted(rs, key=lambda r: r[0])[len(rs) // 2][1]}
    return summary


def add_trees_option(parser: ArgumentParser) -> None:
    """``--trees``: the source trees to compare, each put first on the children's ``PYTHONPATH``."""
    parser.add_argument("--trees", default=str(Path(__file__).resolve().parents[1]),
                        help="comma-separated source trees (PYTHONPATH) to compare, e.g. a checkout of the baseline")


def tree_rounds(trees: Sequence[str], repeats: int) -> Iterator[tuple[str, bool]]:
    """``(tree, timed)``: one round that warms the file cache (not timed), then ``repeats`` rounds, the trees
    interleaved in each (load from other processes hits them alike)."""
    for repeat in range(repeats + 1):
        for tree in trees:
            yield tree, repeat > 0


def header(**extra: Any) -> dict[str, Any]:
    """The start of a results dict: the machine, the date and the opening load average, then ``extra``."""
    return {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": os.getloadavg()[0], **extra}


def save(results: dict[str, Any], path: Path | None) -> None:
    """Write ``results`` to ``path`` (if given) as JSON, creating its folder."""
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n")


def finish(results: dict[str, Any], path: Path | None) -> None:
    """Record the closing load average, print the results and :func:`save` them."""
    results["load_end"] = os.getloadavg()[0]
    print(json.dumps(results, indent=2))
    save(results, path)
