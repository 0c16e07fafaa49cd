"""Part ``cold`` of the GPU check (benchmarks/gpu_check.py): where a command's first call and start-up go.

Issue 33 measured a first ``learn`` on CuPy at 4.2x its warm call (CuPy compiling kernels) and an ``extract`` of
2,000 images at 16.5 s of which cProfile saw 5 s. This part answers, in one device call, what neither profile
said:

- ``floors``: seconds of bare processes: ``python -c pass``, importing the CLI, CuPy's first allocation (its
  import and the device's context), torch's import and ``torch.cuda.init()``;
- ``cupy``: ``learn`` then ``sweep`` with an empty CuPy kernel cache (``CUPY_CACHE_DIR`` a new folder), then
  ``learn`` again (warm), under compile settings (:data:`COLD_ENV`): foal-pipe's, CuPy's defaults (CUB
  reductions, no precompiled headers), ``CUPY_ACCELERATORS=`` (no CUB) alone, ``CUPY_NVRTC_USE_PCH=1`` alone;
  each run's wall and in-process seconds, the kernels compiled (files in the cache) and their names, and which
  of foal-pipe's lines waited on the compiler (a sampler of every thread's stack every 20 ms);
- ``torch``: one warm ``learn --backend torch`` under the same sampler;
- ``extract``: the 2,000-image ``extract`` of part ``cifar`` under the sampler, with the DataLoader's workers
  and with ``--workers 0``: the main thread's timeline (what it waits on, second by second), the time from the
  command's return to the process's end (joining threads, ``atexit``, tearing CUDA down), and the wall.

Every command runs as a subprocess through ``TRACE``, a wrapper around the CLI's ``main`` that samples stacks and
writes a JSON beside the run; the wrapper adds no work on the command's path but the sampler's thread (20 ms).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_scale import failure

TRACE = r'''
import atexit, json, os, sys, threading, time
T0 = time.time()
OUT = os.environ["FOAL_COLD_TRACE"]
PERIOD = 0.02
main_id = threading.get_ident()
samples = []
marks = {"wrapper_start": T0}

def label(frame):
    ours = other = None
    compiling = importing = False
    while frame is not None:
        name = frame.f_code.co_filename
        if ours is None and "/foal_pipe/" in name:
            ours = f"{name.split('/foal_pipe/')[-1]}:{frame.f_lineno}({frame.f_code.co_name})"
        if other is None:
            other = f"{name.rsplit('/', 2)[-2:]!s}:{frame.f_code.co_name}"
        if "cupy/cuda/compiler" in name or "cupy/_core/_cub" in name:
            compiling = True
        if frame.f_code.co_name == "_find_and_load":
            importing = True
        frame = frame.f_back
    return ours, other, compiling, importing

def sample():
    me = threading.get_ident()
    names = {}
    while True:
        time.sleep(PERIOD)
        t = time.time() - T0
        for thread in threading.enumerate():
            names[thread.ident] = thread.name
        for tid, frame in sys._current_frames().items():
            if tid != me:
                samples.append((round(t, 3), "main" if tid == main_id else names.get(tid, str(tid)), *label(frame)))

def finish():
    marks["atexit"] = time.time()
    with open(OUT, "w") as f:
        json.dump({"marks": marks, "period": PERIOD, "samples": samples}, f)

atexit.register(finish)
threading.Thread(target=sample, daemon=True, name="cold-sampler").start()
sys.argv = ["foal-pipe", *sys.argv[1:]]
from foal_pipe.cli import main
marks["cli_imported"] = time.time()
try:
    main()
finally:
    marks["main_returned"] = time.time()
'''

COMPILE = r'''
import sys, time
from concurrent.futures import ThreadPoolExecutor
import cupy
x = cupy.arange(1024, dtype=cupy.float64)
kernels = [cupy.ElementwiseKernel("float64 x", "float64 y", f"y = x * {i}.5 + sin(x) / (1.0 + {i})", f"k{i}")
           for i in range(int(sys.argv[2]))]
start = time.perf_counter()
if sys.argv[1] == "serial":
    [k(x) for k in kernels]
else:
    with ThreadPoolExecutor(int(sys.argv[1])) as pool:
        list(pool.map(lambda k: k(x), kernels))
cupy.cuda.Device().synchronize()
print(time.perf_counter() - start)
'''
"""Compiles ``argv[2]`` distinct element-wise kernels serially or on ``argv[1]`` threads: whether CuPy's
compiler lets threads overlap (a cold cache)."""

COLD_ENV: dict[str, dict[str, str]] = {
    "foal-pipe": {},
    "cupy-defaults": {"CUPY_ACCELERATORS": "cub", "CUPY_NVRTC_USE_PCH": "0"},
    "no-cub": {"CUPY_ACCELERATORS": "", "CUPY_NVRTC_USE_PCH": "0"},
    "pch": {"CUPY_ACCELERATORS": "cub", "CUPY_NVRTC_USE_PCH": "1"},
}
"""CuPy's compile settings compared on an empty kernel cache: ``foal-pipe`` sets none (the command starts CuPy
with :data:`foal_pipe.cupyenv.CUPY_COMPILE_DEFAULTS`, no CUB reductions and NVRTC's precompiled headers);
the others set both variables. ``FOAL_COLD_VARIANTS`` (comma-separated names) runs a subset, as
``FOAL_COLD_EXTRACTS`` (``workers``, ``no workers``) does for the extracts."""


def traced(args: list[str], work: Path, name: str, env: dict[str, str], timeout: int) -> dict[str, Any]:
    """One command through :data:`TRACE`: wall seconds, its marks and a summary of the sampled stacks."""
    wrapper = work / "cold_trace.py"
    wrapper.write_text(TRACE)
    trace = work / f"{name}.trace.json"
    trace.unlink(missing_ok=True)
    start_epoch, start = time.time(), time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(wrapper), *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **env, "FOAL_COLD_TRACE": str(trace)})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    end_epoch, wall = time.time(), time.perf_counter() - start
    run: dict[str, Any] = {"wall_s": round(wall, 3)}
    if proc.returncode != 0:
        run["error"] = failure(proc)
    if trace.exists():
        run.update(summarise(json.loads(trace.read_text()), start_epoch, end_epoch))
    return run


def summarise(trace: dict[str, Any], start_epoch: float, end_epoch: float) -> dict[str, Any]:
    """Seconds from the process's start to each mark and after the last; the main thread's time by foal-pipe line
    (top 15), spent compiling by line, importing; a one-second timeline of the main thread."""
    marks = trace["marks"]
    t0 = marks["wrapper_start"]
    out: dict[str, Any] = {"to_wrapper_s": round(t0 - start_epoch, 3)}
    for key in ("cli_imported", "main_returned", "atexit"):
        if key in marks:
            out[f"to_{key}_s"] = round(marks[key] - start_epoch, 3)
    if "atexit" in marks:
        out["after_atexit_s"] = round(end_epoch - marks["atexit"], 3)
    period = trace["period"]
    by_line: dict[str, float] = {}
    compiling: dict[str, float] = {}
    threads: dict[str, float] = {}
    timeline: dict[int, dict[str, float]] = {}
    imports = 0.0
    for t, thread, ours, other, is_compiling, is_importing in trace["samples"]:
        threads[thread] = threads.get(thread, 0.0) + period
        if thread != "main":
            continue
        where = ours or other
        by_line[where] = by_line.get(where, 0.0) + period
        if is_compiling:
            compiling[where] = compiling.get(where, 0.0) + period
        if is_importing:
            imports += period
        second = timeline.setdefault(int(t), {})
        what = "compile" if is_compiling else "import" if is_importing else where
        second[what] = second.get(what, 0.0) + period

    def top(d: dict[str, float], n: int) -> dict[str, float]:
        return {k: round(v, 2) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:n]}

    out.update(main_by_line=top(by_line, 15), compiling_s=round(sum(compiling.values()), 2),
               compiling_by_line=top(compiling, 12), importing_s=round(imports, 2), thread_seconds=top(threads, 12),
               main_timeline={s: top(v, 2) for s, v in sorted(timeline.items())})
    return out


def _kernels(cache: Path) -> dict[str, Any]:
    """The kernels in a CuPy cache folder: how many files, and the kernel names of the saved sources."""
    files = [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
    names: list[str] = []
    for p in files:
        if p.suffix == ".cu":
            text = p.read_text(errors="replace")
            names += [line.split("(")[0].split()[-1] for line in text.splitlines() if "__global__" in line and "(" in line]
    return {"files": len([p for p in files if p.suffix != ".cu"]), "cub": sum("cub" in n.lower() for n in names),
            "names": sorted(set(names))[:80]}


def part_cold(store: Path, few_extract: list[str] | None, work: Path, out: dict[str, Any], backend_ok: Callable[[str], bool],
              dim: int, timeout: int) -> None:
    """Fill ``out`` with the floors, CuPy's compile settings, torch's warm learn and the extract timeline."""
    floors = {"python -c pass": "pass", "import foal_pipe.cli": "import foal_pipe.cli",
              "import numpy, zarr": "import numpy, zarr"}
    if backend_ok("cupy"):
        floors["cupy first allocation"] = "import cupy; cupy.zeros(1); cupy.cuda.Device().synchronize()"
        floors["cupy import"] = "import cupy"
    if backend_ok("torch"):
        floors["import torch"] = "import torch"
        floors["torch.cuda.init()"] = "import torch; torch.cuda.init(); torch.zeros(1, device='cuda')"
    out["floors_s"] = {}
    for name, code in floors.items():
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
        out["floors_s"][name] = round(time.perf_counter() - start, 3)
    common = ["--features", str(store), "--tasks", "10", "--projection-dim", str(dim), "--seed", "0"]
    out["cupy"] = {}
    if backend_ok("cupy"):
        import cupy

        out["cupy_version"] = cupy.__version__
        try:
            from cupy._core import _accelerator

            out["cupy_accelerators"] = {"reduction": [str(a) for a in _accelerator.get_reduction_accelerators()],
                                        "routine": [str(a) for a in _accelerator.get_routine_accelerators()]}
        except Exception as exc:
            out["cupy_accelerators"] = repr(exc)
        out["compile_16_kernels_s"] = {}
        for how in ("serial", "8"):
            proc = subprocess.run([sys.executable, "-c", COMPILE, how, "16"], capture_output=True, text=True,
                                  timeout=120, env={**os.environ, "CUPY_CACHE_DIR": str(work / f"compile-{how}")})
            out["compile_16_kernels_s"][how] = (float(proc.stdout.strip()) if proc.returncode == 0
                                                else proc.stderr.strip().splitlines()[-1:])
        chosen = os.environ.get("FOAL_COLD_VARIANTS", ",".join(COLD_ENV)).split(",")
        for variant, env in ((v, COLD_ENV[v]) for v in chosen):
            cache = work / f"cupy-cache-{variant}"
            env = {**env, "CUPY_CACHE_DIR": str(cache), "CUPY_CACHE_SAVE_CUDA_SOURCE": "1"}
            runs = out["cupy"][variant] = {}
            for step, cmd in (("learn first", "learn"), ("sweep first", "sweep"), ("learn warm", "learn")):
                target = work / f"cold-{variant}-{step.replace(' ', '-')}"
                run = traced([cmd, *common, "--backend", "cupy", "--out", str(target)], work, f"{variant}-{step}",
                             env, timeout)
                timings = target / "timings.json"
                if timings.exists():
                    run["timings"] = json.loads(timings.read_text())
                if step != "learn warm":
                    run["kernels"] = _kernels(cache)
                runs[step] = run
    if backend_ok("torch"):
        traced(["learn", *common, "--backend", "torch", "--out", str(work / "cold-torch-first")], work, "torch-first",
               {}, timeout)
        target = work / "cold-torch-warm"
        run = traced(["learn", *common, "--backend", "torch", "--out", str(target)], work, "torch-warm", {}, timeout)
        if (target / "timings.json").exists():
            run["timings"] = json.loads((target / "timings.json").read_text())
        out["torch_warm"] = run
    if few_extract is not None:
        out["extract"] = {}
        kinds = {"workers": [], "no workers": ["--workers", "0"]}
        for name in os.environ.get("FOAL_COLD_EXTRACTS", ",".join(kinds)).split(","):
            extra = kinds[name]
            args = list(few_extract)
            args[args.index("--out") + 1] = str(work / f"cold-extract-{name.replace(' ', '-')}.zarr")
            out["extract"][name] = traced([*args, *extra], work, f"extract-{name}", {}, timeout)
