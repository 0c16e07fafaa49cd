"""Part ``scale`` of the GPU check (benchmarks/gpu_check.py), and the plan: what each part of a device call runs
and how long it is expected to take, so a session knows before it spends device time that the call fits.

``scale`` is issue 33's probe: a 300,000 x 768 float16 store (1,000 classes, 30,000 test rows), D = 2000, 10
tasks, and four commands, ``learn``, ``sweep`` (defaults), ``learn --gamma auto`` and ``learn --head slda``, each a
subprocess as a user types it, on NumPy, CuPy and torch. A GPU backend runs each command twice, ``first`` (a bare
machine: CuPy compiles its kernels into an empty ``CUPY_CACHE_DIR`` of the command's own, as gpu_cold.py's runs do,
so no command reuses kernels another compiled; torch initialises CUDA) and ``warm`` (that kernel cache filled, files
in the page cache); NumPy compiles nothing, so it runs once (after the store was just written: its pages are
warm). Each run records its wall seconds (start-up included) and the in-process seconds by step (timings.json),
with A_avg (learn) or the chosen gamma (sweep) against NumPy's. The commands run command by command, the GPU
backends first, ``sweep`` last (it did not finish in 100 s at this scale on CuPy when issue 33 was filed): each
has its own time limit (:data:`LIMITS`), and what the part's deadline cuts off is recorded as ``not run``.
``FOAL_SCALE_RUNS`` (comma-separated keys such as ``learn/cupy first``) runs those alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLI = "from foal_pipe.cli import main; main()"
DEVICE_CALL_S = 600
"""One call of the device tool runs at most this long (the session's 15 minutes include the machine's start)."""
SETUP_S = 45
"""Installing the wheels and foal-pipe on a bare device image, and the check's own imports."""
SPARE_S = 60
"""What a device call keeps to spare when every part runs to its deadline."""
CIFAR_EXPECTED_S = 65
"""Part ``cifar``: issue 33's 37.6 s for its three commands, 17 s for the profiled 2,000-image extract, and
writing its 60,000 images and checkpoint."""
COLD_EXPECTED_S = 145
"""Part ``cold`` (benchmarks/gpu_cold.py) with every compile setting and both extracts: 142 s on an H200."""
COMMANDS: dict[str, tuple[str, list[str]]] = {
    "learn": ("learn", []),
    "auto": ("learn", ["--gamma", "auto"]),
    "slda": ("learn", ["--head", "slda"]),
    "sweep": ("sweep", []),
}
"""The four commands of ``scale`` by short name: the subcommand and its options beyond the common ones."""
LIMITS = {"learn": 45, "auto": 45, "slda": 30, "sweep": 45}
"""Seconds each command may run before it is stopped and recorded as timed out (sweep's goal is 3x learn)."""
PASSES: dict[str, tuple[str, ...]] = {
    "learn": ("cupy first", "cupy warm", "torch first", "torch warm", "numpy"),
    "auto": ("cupy first", "cupy warm", "torch warm", "numpy"),
    "slda": ("cupy first", "cupy warm", "torch warm", "numpy"),
    "sweep": ("cupy first", "cupy warm", "torch warm", "numpy"),
}
"""The runs of each command, in order: the GPU backends first, so a cut-off leaves out NumPy's host runs. torch
compiles nothing, so its first call (CUDA initialisation, imports: the same for every command) is measured once,
on ``learn``; CuPy's first call is measured for each command, as each compiles kernels of its own."""
EXPECTED_S = {
    "learn": {"cupy first": 21, "cupy warm": 5, "torch first": 11, "torch warm": 11, "numpy": 22},
    "auto": {"cupy first": 15, "cupy warm": 10, "torch warm": 15, "numpy": 30},
    "slda": {"cupy first": 8, "cupy warm": 5, "torch warm": 8, "numpy": 9},
    "sweep": {"cupy first": 45, "cupy warm": 30, "torch warm": 40, "numpy": 45},
}
"""Expected seconds of each run as a command on a lent H200 (16 cores): issue 33's measurements at HEAD 7ced068
where it has them (learn; slda; sweep on CuPy first, which did not finish in 100 s, is its time limit), guesses
bounded by :data:`LIMITS` where it has none (auto, and sweep on the others)."""


@dataclass(frozen=True)
class ScaleSizes:
    """The store and the learner's size for ``scale``."""

    train: int
    test: int
    classes: int
    dim: int
    projection_dim: int
    tasks: int
    dtype: str
    seconds: int  # the part's deadline
    store_s: int  # expected seconds to write the store


SCALE_FULL = ScaleSizes(train=300_000, test=30_000, classes=1_000, dim=768, projection_dim=2000, tasks=10,
                        dtype="float16", seconds=370, store_s=25)
SCALE_DRY = ScaleSizes(train=3_000, test=600, classes=20, dim=768, projection_dim=64, tasks=10, dtype="float16",
                       seconds=240, store_s=2)


def command(name: str, store: Path, out: Path, backend: str, sz: ScaleSizes) -> list[str]:
    """The ``foal-pipe`` arguments of command ``name`` on ``backend`` (a head works on the store's features: no
    projection)."""
    sub, extra = COMMANDS[name]
    projection = [] if "--head" in extra else ["--projection-dim", str(sz.projection_dim)]
    return [sub, "--features", str(store), "--out", str(out), "--tasks", str(sz.tasks), *projection, "--seed", "0",
            "--backend", backend, *extra]


def plan(scale: ScaleSizes, cifar_s: int, other_s: dict[str, int], parts: list[str]) -> dict[str, Any]:
    """What a call with ``parts`` runs, each part's expected seconds and deadline, and whether the call fits one
    device call (:data:`DEVICE_CALL_S`) with :data:`SPARE_S` to spare when every part takes its whole deadline."""
    expected = scale.store_s + sum(min(s, LIMITS[c]) for c, runs in EXPECTED_S.items() for s in runs.values())
    planned: dict[str, Any] = {}
    for part in parts:
        if part == "scale":
            planned[part] = {
                "store": f"{scale.train:,} x {scale.dim} {scale.dtype} (+{scale.test:,} test), {scale.classes:,} classes",
                "commands": {c: ["foal-pipe", *command(c, Path("STORE"), Path("OUT"), "BACKEND", scale)] for c in COMMANDS},
                "runs": {c: list(p) for c, p in PASSES.items()}, "limits_s": dict(LIMITS), "expected_s": expected,
                "deadline_s": scale.seconds}
        elif part == "cifar":
            planned[part] = {"commands": ["extract", "learn", "sweep", "extract (2,000 images, profiled)"],
                             "expected_s": CIFAR_EXPECTED_S, "deadline_s": cifar_s}
        elif part == "cold":
            planned[part] = {"expected_s": COLD_EXPECTED_S, "deadline_s": other_s[part]}
        else:
            planned[part] = {"deadline_s": other_s[part]}
    worst = sum(p["deadline_s"] for p in planned.values()) + SETUP_S
    return {"parts": planned, "setup_s": SETUP_S, "expected_s": SETUP_S + sum(p.get("expected_s", p["deadline_s"])
                                                                             for p in planned.values()),
            "worst_s": worst, "device_call_s": DEVICE_CALL_S, "fits": worst <= DEVICE_CALL_S - SPARE_S}


def failure(proc: subprocess.CompletedProcess[str]) -> str:
    """Why a command failed, in one line: the last line it printed (stderr first), or its exit status."""
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def _run(args: list[str], out: Path, limit: int, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One command (in ``env``, default this process's environment): wall and in-process seconds, the steps of
    timings.json, or why it stopped."""
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=limit, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {limit} s", "wall_s": time.perf_counter() - start}
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": failure(proc), "wall_s": wall}
    timings = json.loads((out / "timings.json").read_text())
    run: dict[str, Any] = {"wall_s": wall, "in_process_s": timings["total"], "timings": timings}
    if (out / "metrics.json").is_file():
        run["A_avg"] = json.loads((out / "metrics.json").read_text())["A_avg"]
    else:
        run["best_gamma"] = json.loads((out / "sweep.json").read_text())["best_gamma"]
    return run


def kernel_cache(work: Path, name: str, run_name: str) -> dict[str, str] | None:
    """The environment of a CuPy run: the command's own ``CUPY_CACHE_DIR``, emptied before its ``first`` run (which
    compiles every kernel it needs) and kept for its ``warm`` run; None (this environment) for other backends."""
    if not run_name.startswith("cupy"):
        return None
    cache = work / f"cupy-cache-{name}"
    if run_name.endswith("first"):
        shutil.rmtree(cache, ignore_errors=True)
    return {**os.environ, "CUPY_CACHE_DIR": str(cache)}


def part_scale(sz: ScaleSizes, work: Path, out: dict[str, Any], problem: Callable[[str], str | None]) -> None:
    """Issue 33's probe (see the module's docstring); ``problem(backend)`` says why a backend cannot run here."""
    from synthetic import make_store

    started = time.perf_counter()
    store = make_store(work / "scale.zarr", sz.train, sz.test, n_classes=sz.classes, dim=sz.dim, dtype=sz.dtype)
    out.update(store=f"{sz.train:,} x {sz.dim} {sz.dtype} (+{sz.test:,} test), {sz.classes:,} classes",
               projection_dim=sz.projection_dim, tasks=sz.tasks, store_s=time.perf_counter() - started, runs={})
    problems = {b: problem(b) for b in ("numpy", "cupy", "torch")}
    asked = os.environ.get("FOAL_SCALE_RUNS")
    for name in COMMANDS:
        for run_name in PASSES[name]:
            backend = run_name.split()[0]
            key = f"{name}/{run_name}"
            if asked and key not in asked.split(","):
                continue
            if problems[backend]:
                out["runs"][key] = {"skipped": problems[backend]}
                continue
            left = sz.seconds - (time.perf_counter() - started) - 5
            if left < 5:
                out["runs"][key] = {"skipped": f"not run: the part's {sz.seconds} s were spent"}
                continue
            target = work / f"scale-{name}-{run_name.replace(' ', '-')}"
            args = command(name, store, target, backend, sz)
            out["runs"][key] = _run(args, target, int(min(LIMITS[name], left)), kernel_cache(work, name, run_name))
    for key, run in out["runs"].items():
        name = key.split("/")[0]
        host, warm = out["runs"].get(f"{name}/numpy", {}), out["runs"].get(key.replace("first", "warm"), {})
        if "A_avg" in run and "A_avg" in host:
            run["A_avg_minus_numpy"] = run["A_avg"] - host["A_avg"]
        if "best_gamma" in run and "best_gamma" in host:
            run["best_gamma_equals_numpy"] = run["best_gamma"] == host["best_gamma"]
        if "wall_s" in run and "error" not in run and "wall_s" in host and "error" not in host:
            run["speedup_vs_numpy"] = host["wall_s"] / run["wall_s"]
        if key.endswith("first") and "in_process_s" in run and "in_process_s" in warm:
            run["first_vs_warm"] = run["wall_s"] / warm["wall_s"]
