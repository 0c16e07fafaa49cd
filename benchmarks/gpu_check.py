"""The GPU check: one script a session lent a device runs in one call (at most 8 minutes), writing one JSON.

Parts (each in its own try/except and time limit; the JSON is rewritten after each, so a failure or a kill
keeps what came before; a backend that is not there is recorded as ``{"skipped": reason}``):

(a) ``learner``: ``AnalyticClassifier(gamma=1, engine=E, backend=B)`` for B in numpy, cupy, torch (torch on
    CUDA when available) and E in gram, rls, fed the same random float64 batches: W against NumPy's and
    against the closed-form ridge solution (relative max error, exact means <= 1e-9), and the predictions.
(b) ``learn``: ``foal-pipe learn --backend B`` (subprocesses) on the 50,000 x 768 synthetic store
    (benchmarks/synthetic.py), D = 1000, 10 tasks, batch 10, on the GPU (cupy, torch) against NumPy on the
    host, for ``--engine gram`` and ``--engine rls`` (the paper's per-batch recursion): wall seconds, the
    in-process total (timings.json: no interpreter start-up), A_avg, and W against NumPy's; then each gram run
    again, warm (CuPy's compiled kernels cached), for the speed-ups against NumPy on the machine's cores (goal >= 8x).
(c) ``extract``: ViT-B/16 (``vit_base_patch16_224``, random weights saved as a safetensors checkpoint and
    passed as ``checkpoint``) at 224 px from random 32 px uint8 images in an HDF5 file (20,000 train, 2,000
    test) in bf16 at batch 256, through the Python API (``run_extract``): end-to-end images/s into a store
    with the resize on the device and in the workers, peak GPU memory (``torch.cuda.max_memory_allocated``),
    the model alone (the fused encoder's forward on device tensors, with and without the device resize from
    32 px), and the CUDA resize against PIL (grey levels). Targets: >= 5,000 images/s end to end on an H100,
    < 2 GB at batch 256.
(d) ``cifar``: a CIFAR-100-sized run end to end, as a user types it: 60,000 random 32 px images (50,000 train,
    10,000 test, 100 classes) through ``foal-pipe extract`` (ViT-B/16 at 224 px, bf16, batch 256), ``foal-pipe
    learn`` (D = 1000, 10 tasks, CuPy) and ``foal-pipe sweep`` (13 gammas, leave-one-out): seconds of each
    command, start-up included; goal <= 20 s in all (the paper reports 261 s on an RTX 4070 Ti).

(e) ``heads``: ``learn --head H`` for ncm, slda, fecam, balanced and dual on NumPy, CuPy and torch (20,000 x 512
    synthetic store, 50 classes, 5 tasks): the accuracy matrices against NumPy's (largest difference) and seconds.
(f) ``online``: ``learn --stream si-blurry --eval-every N`` (the anytime curve, A_auc) and ``learn --gamma auto``
    (the refined search) on each backend against NumPy.
(g) ``copies``: the read's host-to-device copy (``GroupedRows``, 50,000 x 768) staged through pinned buffers on a
    stream of its own against the synchronous copy (``FOAL_PIPE_SYNC_COPY=1``) and the host alone: median fill
    seconds, interleaved, and the device rows of both copies against the host's bit for bit.

(k) ``refusals``: what must be refused on every backend as on NumPy (an indefinite matrix's Cholesky factorisation,
    which CuPy reports only inside ``cupyx.errstate``; a rank-one Gram's tiny gamma, which the solve's refinement
    step refuses), in milliseconds: ``--parts refusals,scale,cifar`` is issue 33's device call.
(i) ``cold`` (not run by default: ``--parts cold`` is a device call of its own): where first calls and start-up
    go (benchmarks/gpu_cold.py): bare processes' floors, CuPy's kernel compilation under its compile settings,
    torch's warm learn, and the 2,000-image extract's timeline, each command under a stack sampler.
(h) ``scale`` (not run by default: ``--parts scale,cifar`` is one device call): issue 33's probe, a 300,000 x 768
    float16 store, 1,000 classes, D = 2000, 10 tasks: ``learn``, ``sweep``, ``learn --gamma auto`` and ``learn
    --head slda`` on NumPy, CuPy and torch, first call and warm, wall and in-process (benchmarks/gpu_scale.py).
(j) ``vit`` (not run by default: ``--parts vit``, 150 s): issue 33's extraction at the model's speed
    (benchmarks/gpu_vit.py): the fused ViT-B/16 encoder as extraction builds it (bf16, batch 256, inputs
    preprocessed on the device) eager, without SDPA, channels-last, in a CUDA graph and under ``torch.compile``
    (last, capped at 90 s), and eager from 32 px with the device resize: images/s, the speed against eager, the
    largest difference from eager's features and whether they are bit-identical, and the peak GPU memory.

The JSON's ``plan`` gives, at the device's sizes (also in a dry run), each part's expected seconds and deadline
and whether the call fits one device call with a minute to spare.

``--dry-run`` runs the same steps at toy sizes on the CPU (numpy and torch-on-CPU backends, cupy skipped
without a GPU; a 2-block 32-dim ViT at 64 px, a few hundred images, a 2,000-row store) in well under a
minute; tests/test_gpu_check.py runs it in CI.

On a lent device (see benchmarks/gpu_check.sh for the exact commands): here, ``bash benchmarks/gpu_check.sh
download`` puts the wheels the device image lacks into .whl/ (zarr and its dependencies, array-api-compat,
setuptools for the editable install); then one call of the device tool's ``run`` with ``carry: [".whl"]``,
``timeout_s: 540`` and the command ``FOAL_PIPE_COMMIT=<this HEAD> bash benchmarks/gpu_check.sh device``,
which installs them into /tmp/site, installs foal-pipe with ``pip install --no-deps -e .``, and runs
``python3 benchmarks/gpu_check.py --out $OUT``. The table is printed at the end; $OUT/gpu_check.json holds
everything.

Usage: python benchmarks/gpu_check.py --out DIR [--dry-run] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/synthetic.py, gpu_scale.py

import gpu_cold  # noqa: E402
import gpu_scale  # noqa: E402 (found through the path above)
import gpu_vit  # noqa: E402

EXACT = 1e-9
BACKENDS = ("numpy", "cupy", "torch")
ENGINES = ("gram", "rls")
#: Names the commit of the tree being checked (the device tool sends the working tree, but its git metadata
#: can be older): ``FOAL_PIPE_COMMIT=$(git rev-parse HEAD)`` written into the device command.
COMMIT_VARIABLE = "FOAL_PIPE_COMMIT"
TARGETS = {"end_to_end_images_per_s": ">= 5,000 on an H100", "peak_gpu_gib": "< 2 GB at batch 256"}
CLI = "from foal_pipe.cli import main; main()"
COLD_SECONDS = 330
#: Part ``refusals``' deadline: milliseconds of linear algebra, after each backend's start.
REFUSALS_SECONDS = 10
"""Part ``cold``'s deadline: 4 CuPy settings x (learn, sweep cold, learn warm), torch twice, 2 extracts."""


@dataclass(frozen=True)
class Sizes:
    """What each part runs on; :data:`FULL` on a lent GPU, :data:`DRY` on a CPU (``--dry-run``)."""

    a_rows: int
    a_dim: int
    a_classes: int
    a_batch: dict[str, int]
    b_rows: int
    b_test: int
    b_dim: int
    model: str
    model_kwargs: tuple[tuple[str, Any], ...]
    image_size: int
    c_train: int
    c_test: int
    c_batch: int
    chunk_rows: int
    workers: int | None
    repeats: int
    part_seconds: int
    d_train: int
    d_test: int
    cifar_seconds: int


FULL = Sizes(a_rows=20_000, a_dim=512, a_classes=50, a_batch={"gram": 1000, "rls": 100}, b_rows=50_000,
             b_test=10_000, b_dim=1000, model="vit_base_patch16_224", model_kwargs=(), image_size=224,
             c_train=20_000, c_test=2_000, c_batch=256, chunk_rows=1024, workers=None, repeats=10, part_seconds=150,
             d_train=50_000, d_test=10_000, cifar_seconds=110)
DRY = Sizes(a_rows=600, a_dim=48, a_classes=6, a_batch={"gram": 100, "rls": 25}, b_rows=2_000, b_test=500,
            b_dim=64, model="vit_tiny_patch16_224",
            model_kwargs=(("depth", 2), ("embed_dim", 32), ("img_size", 64), ("num_heads", 2), ("patch_size", 8)),
            image_size=64, c_train=192, c_test=64, c_batch=32, chunk_rows=64, workers=0, repeats=2, part_seconds=180,
            d_train=400, d_test=100, cifar_seconds=180)


# ---------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------
@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in this (main) thread after ``seconds``, so one stuck part cannot eat the lease."""
    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"part took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _sync() -> None:
    if _cuda():
        import torch

        torch.cuda.synchronize()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """Largest absolute difference relative to the largest entry of the reference ``b``."""
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(float(np.abs(b).max()), 1e-300))


def _frobenius_rel(a: np.ndarray, b: np.ndarray) -> float:
    """``|a - b|_F / |b|_F``: how :data:`~foal_pipe.core.linalg.DRIFTS` measures the weights' change (an entry may
    move more: 1.6e-4 where the whole moved 5e-5, the rank-one check on an AVX-512 CPU)."""
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(float(np.linalg.norm(b)), 1e-300))


def backend_problem(backend: str) -> str | None:
    """Why ``backend`` cannot run here (this foal-pipe does not know it, CuPy or a GPU missing), or ``None``."""
    from foal_pipe.core import backend as backends
    from foal_pipe.errors import FoalPipeError
    from foal_pipe.model.classifier import AnalyticClassifier

    known = getattr(backends, "BACKENDS", None)
    if known is not None and backend not in known:
        return f"backend {backend} not supported by this foal-pipe (its backends: {', '.join(known)})"
    try:
        AnalyticClassifier(gamma=1.0, backend=backend).partial_fit(np.eye(3), np.array([0, 1, 1]))
    except FoalPipeError as exc:
        return str(exc)
    return None


def _rate(fn: Callable[[], Any], n: int, repeats: int) -> float:
    """Images/s of ``fn`` (``n`` images a call): median of ``repeats`` timed calls after one warm-up."""
    fn()
    _sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - start)
    return n / statistics.median(times)


# ---------------------------------------------------------------------------------------------------------
# (a) the learner against NumPy and the closed form
# ---------------------------------------------------------------------------------------------------------
def part_learner(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    from foal_pipe.model.classifier import AnalyticClassifier

    rng = np.random.default_rng(0)
    X = rng.standard_normal((sz.a_rows, sz.a_dim))
    y = rng.integers(0, sz.a_classes, sz.a_rows)
    X_test = rng.standard_normal((2_000, sz.a_dim))
    Y = np.eye(sz.a_classes)[y]
    W_ridge = np.linalg.solve(X.T @ X + np.eye(sz.a_dim), X.T @ Y)  # gamma = 1
    out.update(rows=sz.a_rows, dim=sz.a_dim, classes=sz.a_classes, gamma=1.0, dtype="float64", batch=sz.a_batch,
               exact_below=EXACT, runs={})
    reference: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for backend in BACKENDS:
        problem = backend_problem(backend)
        for engine in ENGINES:
            key = f"{backend}/{engine}"
            if problem:
                out["runs"][key] = {"skipped": problem}
                continue
            try:
                start = time.perf_counter()
                clf = AnalyticClassifier(gamma=1.0, engine=engine, backend=backend, dtype="float64")
                step = sz.a_batch[engine]
                for lo in range(0, sz.a_rows, step):
                    clf.partial_fit(X[lo : lo + step], y[lo : lo + step])
                W, predicted = clf.weights_, clf.predict(X_test)
                run = {"seconds": time.perf_counter() - start, "W_vs_closed_form": _rel(W, W_ridge)}
                if backend == "numpy":
                    reference[engine] = (W, predicted)
                if engine in reference:
                    run["W_vs_numpy"] = _rel(W, reference[engine][0])
                    run["predictions_equal_numpy"] = float(np.mean(predicted == reference[engine][1]))
                run["exact"] = run["W_vs_closed_form"] <= EXACT and run.get("W_vs_numpy", 0.0) <= EXACT
                out["runs"][key] = run
            except Exception as exc:
                out["runs"][key] = {"error": _one_line(exc)}


def part_refusals(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    """What must be refused on every backend as on NumPy, checked on the device in milliseconds: an indefinite
    matrix's Cholesky factorisation (CuPy reports no failure outside ``cupyx.errstate``: ``linalg.cholesky_or_none``
    must give None and ``solve_spd`` refuse), and a rank-one Gram's tiny gamma, whose solve the refinement step of
    ``linalg.check_solved`` refuses (W was up to 8e-3 off)."""
    from foal_pipe.core.backend import default_device, get_namespace, to_numpy
    from foal_pipe.core.linalg import cholesky_or_none, solve_spd
    from foal_pipe.core.statistics import RidgeStatistics
    from foal_pipe.errors import FoalPipeError

    def outcome(call: Callable[[], Any], words: str, exact: np.ndarray | None = None) -> str | float:
        """``"refused"`` (the refusal with ``words``), the relative error against ``exact``, or what went wrong."""
        try:
            result = call()
        except FoalPipeError as exc:
            return "refused" if words in str(exc) else _one_line(exc)
        except Exception as exc:
            return _one_line(exc)
        return "accepted" if exact is None else _frobenius_rel(to_numpy(result), exact)

    indefinite = np.array([[1.0, 2.0], [2.0, 1.0]])
    D, a = 1000, 5000.0
    for backend in BACKENDS:
        problem = backend_problem(backend)
        if problem:
            out[backend] = {"skipped": problem}
            continue
        xp = get_namespace(backend)

        where = default_device(xp)
        statistics = RidgeStatistics(xp.asarray(np.full((D, D), a), device=where), xp.asarray(np.full((D, 2), a), device=where),
                                     np.arange(2), 400, None, symmetric=True)
        square, column = xp.asarray(indefinite, device=where), xp.asarray(np.ones((2, 1)), device=where)
        out[backend] = {  # refused, or within 1e-4 of the closed form 1 q^T / (a D + gamma), as DRIFTS measures
            "cholesky_or_none_gives_none": cholesky_or_none(xp, square) is None,
            "solve_spd": outcome(lambda A=square, b=column: solve_spd(A, b, "float64"), "not positive definite"),
            **{f"rank_one_gamma_{gamma:g}": outcome(lambda s=statistics, g=gamma: s.solve(g), "may move the weights",
                                                    np.full((D, 2), a / (a * D + gamma))) for gamma in (1e-6, 1e-5, 1.0)},
        }


# ---------------------------------------------------------------------------------------------------------
# (b) foal-pipe learn on the synthetic store
# ---------------------------------------------------------------------------------------------------------
def _learn(store: Path, out: Path, backend: str, engine: str, dim: int, timeout: int) -> dict[str, Any]:
    run = _learn_args(store, out, backend, ["--tasks", "10", "--batch-size", "10", "--projection-dim", str(dim),
                                            "--gamma", "1", "--engine", engine], timeout)
    if "error" in run:
        return run
    run.pop("_matrix")
    run["timings"] = json.loads((out / "timings.json").read_text())
    try:
        from safetensors.numpy import load_file

        run["_W"] = load_file(str(out / "model.safetensors"))["W"]
    except Exception as exc:
        run["W_unreadable"] = _one_line(exc)
    return run


def part_learn(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    from synthetic import make_store

    out.update(store=f"{sz.b_rows:,} x 768 float32 (+{sz.b_test:,} test), 100 classes", projection_dim=sz.b_dim,
               tasks=10, batch=10, runs={})
    store = make_store(work / "synthetic.zarr", sz.b_rows, sz.b_test)
    problems = {b: backend_problem(b) for b in BACKENDS}
    for engine in ENGINES:
        for backend in BACKENDS:
            key = f"{backend}/{engine}"
            if problems[backend]:
                out["runs"][key] = {"skipped": problems[backend]}
                continue
            try:
                out["runs"][key] = _learn(store, work / f"learn-{backend}-{engine}", backend, engine, sz.b_dim,
                                          sz.part_seconds)
            except Exception as exc:
                out["runs"][key] = {"error": _one_line(exc)}
    for backend in BACKENDS:  # again, warm: CuPy compiles its kernels on first use and caches them on disk
        key = f"{backend}/gram"
        if "wall_s" in out["runs"].get(key, {}):
            try:
                out["runs"][f"{key} (warm)"] = _learn(store, work / f"learn-{backend}-warm", backend, "gram", sz.b_dim,
                                                      sz.part_seconds)
            except Exception as exc:
                out["runs"][f"{key} (warm)"] = {"error": _one_line(exc)}
    host = out["runs"].get("numpy/gram (warm)") or out["runs"].get("numpy/gram", {})
    for run in out["runs"].values():
        if "A_avg" in run and "A_avg" in host:
            run["A_avg_minus_numpy"] = run["A_avg"] - host["A_avg"]
            run["speedup_vs_numpy_gram"] = host["wall_s"] / run["wall_s"]
            run["speedup_in_process"] = host["in_process_s"] / run["in_process_s"]
        if "_W" in run and "_W" in host:
            run["W_vs_numpy"] = _rel(run["_W"], host["_W"])
    for run in out["runs"].values():
        run.pop("_W", None)


def _learn_args(store: Path, out: Path, backend: str, extra: list[str], timeout: int) -> dict[str, Any]:
    """One ``foal-pipe learn`` subprocess: wall and in-process seconds, the accuracy matrix and what else
    metrics.json says (A_avg, A_last, A_auc and the anytime curve when there is one)."""
    cmd = [sys.executable, "-c", CLI, "learn", "--features", str(store), "--out", str(out), "--seed", "0",
           "--backend", backend, *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": gpu_scale.failure(proc), "wall_s": wall}
    metrics = json.loads((out / "metrics.json").read_text())
    run = {"wall_s": wall, "in_process_s": json.loads((out / "timings.json").read_text())["total"],
           "A_avg": metrics["A_avg"], "A_last": metrics["A_last"],
           "_matrix": _square(metrics["accuracy_matrix"])}
    if metrics.get("anytime"):
        run["A_auc"] = metrics.get("A_auc")
        run["_curve"] = np.array(metrics["anytime"]["accuracy"], dtype=float)
    return run


def _square(rows: list[list[float]]) -> np.ndarray:
    """metrics.json's accuracy matrix (row i: the tasks 1..i) as a square array, NaN above the diagonal."""
    out = np.full((len(rows), max(map(len, rows), default=0)), np.nan)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def _against_numpy(runs: dict[str, dict[str, Any]]) -> None:
    """Each device run's largest difference from the NumPy run of the same command (accuracy matrix, curve)."""
    for key, run in runs.items():
        host = runs.get(key.split("/")[0] + "/numpy", {})
        for field in ("_matrix", "_curve"):
            if field in run and field in host and run is not host:
                a, b = run[field], host[field]
                run[f"{field[1:]}_vs_numpy"] = float(np.nanmax(np.abs(a - b))) if a.shape == b.shape else "shape differs"
    for run in runs.values():
        run.pop("_matrix", None)
        run.pop("_curve", None)


def _each_backend(runs: dict[str, dict[str, Any]], name: str, learn: Callable[[str], dict],
                  backends: tuple[str, ...] = BACKENDS) -> None:
    for backend in backends:
        problem = backend_problem(backend)
        try:
            runs[f"{name}/{backend}"] = {"skipped": problem} if problem else learn(backend)
        except Exception as exc:
            runs[f"{name}/{backend}"] = {"error": _one_line(exc)}


def part_heads(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    """``learn --head H`` for every analytic head (issue 22) on NumPy, CuPy and torch: the accuracy matrices
    equal NumPy's (largest difference), with the seconds each took."""
    from synthetic import make_store

    store = make_store(work / "heads.zarr", sz.a_rows, sz.a_rows // 5, n_classes=sz.a_classes, dim=sz.a_dim)
    out.update(store=f"{sz.a_rows:,} x {sz.a_dim} float32, {sz.a_classes} classes, 5 tasks", runs={})
    for head in ("ncm", "slda", "fecam", "balanced", "dual"):
        extra = ["--tasks", "5", "--head", head] + (["--projection-dim", str(sz.b_dim // 2)]
                                                     if head in ("balanced", "dual") else [])
        _each_backend(out["runs"], head,
                      lambda b, head=head, extra=extra: _learn_args(store, work / f"head-{head}-{b}", b, extra,
                                                                    sz.part_seconds),
                      ("numpy",) if sz == DRY else BACKENDS)  # the dry run: each head's path, not torch's start-up
    _against_numpy(out["runs"])


def part_online(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    """Issue 25 and 23 on the device: a Si-Blurry stream with ``--eval-every`` (the anytime curve and A_auc),
    and ``--gamma auto`` (the refined search), each on NumPy, CuPy and torch against NumPy."""
    from synthetic import make_store

    store = make_store(work / "online.zarr", sz.a_rows, sz.a_rows // 5, n_classes=sz.a_classes, dim=sz.a_dim)
    out.update(store=f"{sz.a_rows:,} x {sz.a_dim} float32, {sz.a_classes} classes", runs={})
    commands = {
        "si-blurry --eval-every": ["--tasks", "5", "--stream", "si-blurry", "--eval-every", str(sz.a_rows // 20),
                                   "--projection-dim", str(sz.b_dim)],
        "gamma auto": ["--tasks", "5", "--gamma", "auto", "--projection-dim", str(sz.b_dim)],
    }
    for name, extra in commands.items():
        _each_backend(out["runs"], name,
                      lambda b, name=name, extra=extra: _learn_args(store, work / f"online-{name[:5]}-{b}", b, extra,
                                                                    sz.part_seconds))
    _against_numpy(out["runs"])


# ---------------------------------------------------------------------------------------------------------
# (g) the host-to-device copy of the read, staged against synchronous
# ---------------------------------------------------------------------------------------------------------
def _device_sync(backend: str) -> None:
    """Wait for all the work queued on the device (so a fill's time includes its last scatter)."""
    if backend == "cupy":
        import cupy

        cupy.cuda.Device().synchronize()
    elif _cuda():
        _sync()


@contextmanager
def _copy_mode(mode: str) -> Iterator[None]:
    """``sync``: the synchronous copy forced (its environment variable); ``staged`` and ``host``: as by default."""
    from foal_pipe.protocol.devicecopy import SYNC_VARIABLE

    before = os.environ.pop(SYNC_VARIABLE, None)
    if mode == "sync":
        os.environ[SYNC_VARIABLE] = "1"
    try:
        yield
    finally:
        os.environ.pop(SYNC_VARIABLE, None)
        if before is not None:
            os.environ[SYNC_VARIABLE] = before


@contextmanager
def _cpu_stands_in(xp: Any, dry: bool) -> Iterator[bool]:
    """Whether ``xp`` is copied to: a device namespace, or (dry run) torch on the CPU standing in for one."""
    import foal_pipe.protocol.rowcache as rowcache

    real = rowcache.on_device
    if dry and not real(xp):
        rowcache.on_device = lambda namespace: namespace is xp or real(namespace)
    try:
        yield rowcache.on_device(xp)
    finally:
        rowcache.on_device = real


def part_copies(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    """Issue 21's overlap on the device: ``GroupedRows`` reads the train split of the 50,000 x 768 store (10 tasks
    in a random class order) on the host alone (NumPy), and on each device backend with the staged copy (pinned
    buffers, a stream of its own) and the synchronous one (``FOAL_PIPE_SYNC_COPY=1``), interleaved, after one
    warm-up round: the median seconds of each fill (the device synchronized at its end), what the copy adds to
    the host's read, and the device rows of both copies against the host cache, bit for bit. The overlap works
    when ``staged`` is close to ``host`` and below ``sync``. The dry run stands torch on the CPU in for a device
    (both copies then run synchronously)."""
    from synthetic import make_store

    from foal_pipe.core.backend import get_namespace, to_numpy
    from foal_pipe.protocol.devicecopy import SYNC_VARIABLE
    from foal_pipe.protocol.rowcache import GroupedRows
    from foal_pipe.store import open_store

    store = make_store(work / "copies.zarr", sz.b_rows, sz.b_test)
    split = open_store(store).split("train")
    groups = (np.random.default_rng(0).permutation(100) % 10)[np.asarray(split.labels)]
    out.update(store=f"{sz.b_rows:,} x 768 float32, 10 tasks in a random class order", repeats=sz.repeats,
               forced_by=f"{SYNC_VARIABLE}=1", runs={})
    with GroupedRows(split, [None], groups, 10, 2**40) as host:
        expected = np.ascontiguousarray(host.block(None, 0, host.n_rows))

    def fill(xp: Any, backend: str) -> tuple[float, GroupedRows]:
        start = time.perf_counter()
        rows = GroupedRows(split, [None], groups, 10, 2**40, xp=xp)
        _device_sync(backend)
        return time.perf_counter() - start, rows

    for backend in ("cupy", "torch"):
        problem = backend_problem(backend)
        if problem:
            out["runs"][backend] = {"skipped": problem}
            continue
        try:
            xp = get_namespace(backend)
            with _cpu_stands_in(xp, sz == DRY) as copied:
                if not copied:
                    out["runs"][backend] = {"skipped": f"{backend} has no device here: nothing is copied"}
                    continue
                run: dict[str, Any] = {"copy_mode": {}, "rows_equal_host": {}}
                times: dict[str, list[float]] = {"host": [], "sync": [], "staged": []}
                for repeat in range(sz.repeats + 1):  # the first round warms up (CuPy compiles its scatter)
                    for mode in times:
                        with _copy_mode(mode):
                            seconds, rows = fill(None if mode == "host" else xp, backend)
                        with rows:
                            if repeat:
                                times[mode].append(seconds)
                            elif mode != "host":
                                run["copy_mode"][mode] = rows.copy_mode
                                device = np.ascontiguousarray(to_numpy(rows.block(None, 0, rows.n_rows, xp)))
                                run["rows_equal_host"][mode] = bool(device.dtype == expected.dtype and np.array_equal(
                                    device.view(np.uint8), expected.view(np.uint8)))
                median = {mode: statistics.median(t) for mode, t in times.items()}
                run.update(fill_s=median, copy_adds_s={m: median[m] - median["host"] for m in ("sync", "staged")},
                           staged_vs_sync=median["staged"] / median["sync"])
                out["runs"][backend] = run
        except Exception as exc:
            out["runs"][backend] = {"error": _one_line(exc)}


# ---------------------------------------------------------------------------------------------------------
# (c) ViT extraction into a store
# ---------------------------------------------------------------------------------------------------------
class _Timeline:
    """Progress sink of run_extract: when each batch finished."""

    def __init__(self) -> None:
        self.events: list[tuple[float, int]] = []

    def start(self, split: str, done: int, total: int) -> None:
        pass

    def advance(self, split: str, n: int) -> None:
        self.events.append((time.perf_counter(), n))

    def steady(self, skip: int) -> float | None:
        """Images/s after the first ``skip`` images (start-up, worker spawn, first batches)."""
        done, t0, rows = 0, None, 0
        for t, n in self.events:
            if t0 is not None:
                rows += n
            done += n
            if t0 is None and done >= skip:
                t0 = t
        return rows / (self.events[-1][0] - t0) if t0 is not None and rows else None


def _random_h5(path: Path, n_train: int, n_test: int, side: int = 32) -> Path:
    import h5py

    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.attrs["classes"] = [str(c) for c in range(100)]  # the names as labels alone give them; a small file may
        # miss some, which only a class list allows
        for split, n in (("train", n_train), ("test", n_test)):
            f[f"{split}/images"] = rng.integers(0, 256, (n, side, side, 3), dtype=np.uint8)
            f[f"{split}/labels"] = rng.integers(0, 100, n)
    return path


def _checkpoint(sz: Sizes, path: Path) -> Path:
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(sz.model, pretrained=False, **dict(sz.model_kwargs))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def _peak_reset() -> None:
    if _cuda():
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float | None:
    if not _cuda():
        return None
    import torch

    return torch.cuda.max_memory_allocated() / 2**30


def part_extract(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    """:func:`_extract_part` with TF32 matrix products on for its CUDA runs, restored after it: the parts that follow
    in this process (and an fp32 extraction's exactness) must not inherit it."""
    import torch

    before = torch.backends.cuda.matmul.allow_tf32
    try:
        if _cuda():
            torch.backends.cuda.matmul.allow_tf32 = True
        _extract_part(sz, work, out)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def _extract_part(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    import torch

    from foal_pipe.datasets import to_rgb_array
    from foal_pipe.encoders import EncoderConfig, build_encoder, resize_on_device
    from foal_pipe.extract import ExtractSpec, run_extract
    from foal_pipe.extract import run as run_module
    from foal_pipe.store import open_store

    device = "cuda" if _cuda() else "cpu"
    precision = "bf16" if device == "cuda" else "fp32"
    data = _random_h5(work / "random32.h5", sz.c_train, sz.c_test)
    checkpoint = _checkpoint(sz, work / "vit.safetensors")
    out.update(model=sz.model, model_kwargs=dict(sz.model_kwargs), weights="random (seed 0)",
               image_size=sz.image_size, from_px=32, images=sz.c_train + sz.c_test, batch=sz.c_batch, device=device,
               precision=precision, targets=TARGETS)

    enc = build_encoder(EncoderConfig(sz.model, checkpoint=str(checkpoint), model_kwargs=sz.model_kwargs))
    enc.load(device, precision)
    rng = np.random.default_rng(1)
    native = torch.from_numpy(rng.integers(0, 256, (sz.c_batch, 3, 32, 32), dtype=np.uint8)).to(device)
    full = torch.from_numpy(rng.integers(0, 256, (sz.c_batch, 3, sz.image_size, sz.image_size),
                                         dtype=np.uint8)).to(device)
    _peak_reset()
    with torch.inference_mode():  # the lambdas run here, before the `del` below (ruff's F821 sees the del)
        x = enc.preprocess(full)
        out["model_alone_images_per_s"] = _rate(lambda: enc.features(x), sz.c_batch, sz.repeats)  # noqa: F821
        out["model_with_device_resize_images_per_s"] = _rate(lambda: enc(native), sz.c_batch, sz.repeats)  # noqa: F821
        out["device_resize_alone_images_per_s"] = _rate(
            lambda: resize_on_device(native, sz.image_size, enc.interpolation), sz.c_batch, sz.repeats)  # noqa: F821
    out["model_peak_gpu_gib"] = _peak_gib()
    sample = native[:32].cpu().numpy()
    pil = np.stack([to_rgb_array(np.ascontiguousarray(im.transpose(1, 2, 0)), sz.image_size, enc.interpolation)
                    for im in sample])
    on_device = resize_on_device(native[:32], sz.image_size, enc.interpolation).cpu().numpy()
    out["device_resize_vs_pil_max_levels"] = float(np.abs(on_device - pil).max())
    del enc, x, native, full
    _peak_reset()

    def spec(where: str, h5: Path, name: str) -> ExtractSpec:
        return ExtractSpec(dataset="hdf5", data_dir=str(h5), model=sz.model, checkpoint=str(checkpoint),
                           model_kwargs=sz.model_kwargs, out=str(work / f"{name}.zarr"), chunk_rows=sz.chunk_rows,
                           batch_size=sz.c_batch, workers=sz.workers, device=device, precision=precision,
                           resize_on=where)

    # warm-up (first imports, file caches, CUDA kernels), not timed: two batches of each split
    run_extract(spec("workers", _random_h5(work / "warm.h5", 2 * sz.c_batch, 2 * sz.c_batch), "warm-up"))
    stores, default = {}, run_module.BATCHES_AHEAD
    for name, where, ahead in (("device", "device", default), ("workers", "workers", default),
                               ("device_one_batch_at_a_time", "device", 0)):
        _peak_reset()
        timeline = _Timeline()
        start = time.perf_counter()
        run_module.BATCHES_AHEAD = ahead  # 0: wait for each batch's features before queuing the next
        try:
            report = run_extract(spec(where, data, f"extract-{name}"), progress=timeline)
        finally:
            run_module.BATCHES_AHEAD = default
        wall = time.perf_counter() - start
        n = sz.c_train + sz.c_test
        out[f"end_to_end_resize_on_{name}"] = {
            "wall_s": wall, "images_per_s": n / wall, "images_per_s_steady": timeline.steady(2 * sz.chunk_rows),
            "peak_gpu_gib": _peak_gib(), "seconds_in_run_extract": report.seconds, "batches_ahead": ahead}
        stores[name] = open_store(report.path)
    a, b, c = (np.asarray(stores[w].train.features[:]) for w in ("device", "workers", "device_one_batch_at_a_time"))
    out["features_device_vs_workers_max_abs"] = float(np.abs(a - b).max())
    out["features_queued_ahead_equal_one_at_a_time"] = bool(np.array_equal(a, c))
    best = out["end_to_end_resize_on_device"]
    out["meets_targets"] = "not applicable: no GPU" if device != "cuda" else {
        "end_to_end_images_per_s": (best["images_per_s_steady"] or 0) >= 5000, "peak_gpu_gib": best["peak_gpu_gib"] < 2}


# ---------------------------------------------------------------------------------------------------------
# (d) a CIFAR-100-sized run end to end on the device
# ---------------------------------------------------------------------------------------------------------
def _cli(args: list[str], timeout: int) -> float:
    """Wall seconds of one ``foal-pipe`` command (a subprocess, start-up included); its last line if it fails."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(gpu_scale.failure(proc))
    return time.perf_counter() - start


def _extract_args(sz: Sizes, data: Path, checkpoint: Path, store: Path) -> list[str]:
    """``foal-pipe extract`` of the HDF5 images ``data`` with ViT-B/16 from ``checkpoint`` into ``store``, as
    parts ``cifar`` and ``cold`` run it (on CUDA when there is a GPU)."""
    model_kwargs = ",".join(f"{k}={v}" for k, v in sz.model_kwargs)
    return ["extract", "--dataset", "hdf5", "--data-dir", str(data), "--model", sz.model, "--checkpoint",
            str(checkpoint), *(["--model-kwargs", model_kwargs] if model_kwargs else []), "--image-size",
            str(sz.image_size), "--out", str(store), "--batch-size", str(sz.c_batch), "--device",
            "cuda" if _cuda() else "cpu", "--chunk-rows", str(sz.chunk_rows)]


def part_cifar(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    """60,000 images (50,000 + 10,000, 32 px, 100 classes) through ViT-B/16 extraction (bf16, batch 256, resize on
    the device), ``learn`` (D = 1000, 10 tasks) and a 13-gamma ``sweep`` with leave-one-out, each a command as a
    user runs it; goal <= 20 s in all (the paper: 261 s on an RTX 4070 Ti, extraction included)."""
    device = "cuda" if _cuda() else "cpu"
    backend = "cupy" if not backend_problem("cupy") else "numpy"
    data = _random_h5(work / "cifar-sized.h5", sz.d_train, sz.d_test)
    checkpoint = _checkpoint(sz, work / "vit-d.safetensors")
    store = work / "cifar-sized.zarr"
    out.update(images=sz.d_train + sz.d_test, model=sz.model, weights="random (seed 0)", device=device,
               backend=backend, goal_s=20, paper_s=261)
    steps = {
        "extract": _extract_args(sz, data, checkpoint, store),
        "learn": ["learn", "--features", str(store), "--out", str(work / "cifar-run"), "--tasks", "10",
                  "--projection-dim", str(sz.b_dim), "--backend", backend],
        "sweep": ["sweep", "--features", str(store), "--out", str(work / "cifar-sweep"), "--tasks", "10",
                  "--projection-dim", str(sz.b_dim), "--backend", backend],
    }
    out["seconds"] = {}
    for step, args in steps.items():
        out["seconds"][step] = _cli(args, sz.cifar_seconds)
    out["total_s"] = sum(out["seconds"].values())
    run = json.loads(store.with_name(store.name + ".log.json").read_text())["runs"][-1]
    out["extract_run"] = {k: run.get(k) for k in ("seconds", "device", "batch_size", "workers", "resize_on")}
    for step in ("learn", "sweep"):
        out[f"{step}_timings"] = json.loads((work / f"cifar-{'run' if step == 'learn' else 'sweep'}" /
                                             "timings.json").read_text())
    metrics = json.loads((work / "cifar-run" / "metrics.json").read_text())
    out["A_avg"], out["n_train_seen"] = metrics["A_avg"], metrics["n_train_seen"]
    out["meets_goal"] = "not applicable: no GPU" if device != "cuda" else out["total_s"] <= 20
    few = list(steps["extract"])  # the same command on 2,000 images: what it costs besides the images
    few[few.index("--data-dir") + 1] = str(_random_h5(work / "few.h5", 1_000, 1_000))
    few[few.index("--out") + 1] = str(work / "few.zarr")
    out["extract_2000_images"] = _profile_cli(few, work, sz.cifar_seconds)


def _profile_cli(args: list[str], work: Path, timeout: int, top: int = 25) -> dict[str, float]:
    """Where a command's time goes: wall seconds, then the cumulative seconds of its slowest calls (cProfile)."""
    script, profile = work / "cli_main.py", work / "cli.prof"
    script.write_text(CLI + "\n")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), str(script), *args], capture_output=True,
                   text=True, timeout=timeout, check=True)
    wall = time.perf_counter() - start
    import pstats

    stats = pstats.Stats(str(profile)).stats
    imports = max((v[3] for k, v in stats.items() if k[2] == "_find_and_load"), default=0.0)
    ours = sorted(((v[3], f"{Path(k[0]).parent.name}/{Path(k[0]).name}:{k[1]}({k[2]})") for k, v in stats.items()
                   if "/foal_pipe/" in k[0] and "/cli/" not in k[0]), reverse=True)
    return {"wall_s": round(wall, 3), "imports_s": round(imports, 3),
            **{name: round(seconds, 3) for seconds, name in ours[:top]}}


def part_startup(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    """What a command costs before it works: ``foal-pipe --help`` (median of 3) and the slowest imports of the CLI."""
    times = [_cli(["--help"], 60) for _ in range(3)]
    out["help_s"] = statistics.median(times)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import foal_pipe.cli; import foal_pipe.protocol.walk"],
                          capture_output=True, text=True, timeout=120)
    rows = [line.split("|") for line in proc.stderr.splitlines() if line.startswith("import time:") and "|" in line]
    cumulative = sorted(((int(r[1]), r[2].strip()) for r in rows if r[1].strip().isdigit()), reverse=True)
    out["slowest_imports_ms"] = {name: us / 1000 for us, name in cumulative[:12]}


def part_cold(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    """Where first calls and start-up go (benchmarks/gpu_cold.py): the 50,000-row store of part ``learn``, the
    2,000-image extract of part ``cifar``."""
    from synthetic import make_store

    store = make_store(work / "cold.zarr", sz.b_rows, sz.b_test)
    few = _extract_args(sz, _random_h5(work / "cold-few.h5", 1_000, 1_000),
                        _checkpoint(sz, work / "vit-cold.safetensors"), work / "cold-extract.zarr")
    gpu_cold.part_cold(store, few, work, out, lambda b: backend_problem(b) is None, sz.b_dim, sz.cifar_seconds)


def part_scale(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    """Issue 33's probe at 300,000 rows (benchmarks/gpu_scale.py)."""
    gpu_scale.part_scale(gpu_scale.SCALE_DRY if sz == DRY else gpu_scale.SCALE_FULL, work, out, backend_problem)


def part_vit(sz: Sizes, work: Path, out: dict[str, Any]) -> None:
    """Issue 33's extraction at the model's speed: SDPA, channels-last, CUDA graphs and ``torch.compile`` on the
    fused encoder, against eager and bit for bit (benchmarks/gpu_vit.py)."""
    ends_at = time.perf_counter() + part_deadline(sz, "vit")
    checkpoint = _checkpoint(sz, work / "vit-speed.safetensors")
    gpu_vit.part_vit(gpu_vit.VitSizes(model=sz.model, model_kwargs=sz.model_kwargs, checkpoint=checkpoint,
                                      batch=sz.c_batch, repeats=sz.repeats, ends_at=ends_at,
                                      compile=_cuda() and sz != DRY),
                     out, gpu_vit.Kit(rate=_rate, peak_reset=_peak_reset, peak_gib=_peak_gib, one_line=_one_line))


PARTS: dict[str, Callable[[Sizes, Path, dict[str, Any]], None]] = {
    "refusals": part_refusals, "learner": part_learner, "learn": part_learn, "extract": part_extract, "cifar": part_cifar,
    "startup": part_startup, "heads": part_heads, "online": part_online, "copies": part_copies, "scale": part_scale,
    "cold": part_cold, "vit": part_vit}
DEFAULT_PARTS = ("refusals", "learner", "learn", "extract", "cifar", "startup", "heads", "online", "copies")
"""What runs without ``--parts``; ``scale`` takes a device call of its own with ``cifar`` (``--parts refusals,scale,cifar``)."""


def run_order(parts: list[str]) -> list[str]:
    """``parts`` in the order asked, but ``vit`` last: its ``torch.compile`` leaves compile workers and the
    compiled state behind in this process, and part ``cifar`` ran slower after it on an H100 (33.5 s against
    28.2-28.6 s), so every command-timing part runs before it."""
    return sorted(parts, key=lambda name: name == "vit")


def part_deadline(sz: Sizes, name: str) -> int:
    """Seconds part ``name`` may take: ``scale`` stops its own runs at its deadline (a margin after it here)."""
    if name == "scale":
        return (gpu_scale.SCALE_DRY if sz == DRY else gpu_scale.SCALE_FULL).seconds + 15
    if name == "cold":
        return COLD_SECONDS
    if name == "refusals":
        return REFUSALS_SECONDS
    if name == "vit":
        return gpu_vit.SECONDS
    return sz.cifar_seconds if name == "cifar" else sz.part_seconds


def device_plan(parts: list[str]) -> dict[str, Any]:
    """The plan of a device call with ``parts`` at the device's sizes (:data:`FULL`), also in a dry run."""
    return gpu_scale.plan(gpu_scale.SCALE_FULL, part_deadline(FULL, "cifar"),
                          {name: part_deadline(FULL, name) for name in parts}, parts)


# ---------------------------------------------------------------------------------------------------------
# Machine, table, main
# ---------------------------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    import foal_pipe

    info: dict[str, Any] = {"python": platform.python_version(), "numpy": np.__version__, "nproc": os.cpu_count(),
                            "foal_pipe": foal_pipe.__version__, "foal_pipe_path": str(Path(foal_pipe.__file__).parent),
                            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for module in ("torch", "timm", "cupy", "zarr", "array_api_compat"):
        try:
            info[module] = __import__(module).__version__
        except Exception as exc:  # absent, or broken: say which
            info[module] = f"unavailable ({_one_line(exc)})"
    if _cuda():
        import torch

        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    info["commit"] = os.environ.get(COMMIT_VARIABLE) or _git_head()
    return info


def _git_head() -> str | None:
    """This checkout's HEAD; on a device machine that may be the session's first commit, not the tree sent."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=Path(__file__).parent)
        return commit.stdout.strip() or None
    except Exception:
        return None


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    return str(value)


EXTRACT_ROWS = {
    "end_to_end_resize_on_device": TARGETS["end_to_end_images_per_s"] + "; " + TARGETS["peak_gpu_gib"],
    "end_to_end_resize_on_workers": "",
    "end_to_end_resize_on_device_one_batch_at_a_time": "",
    "features_queued_ahead_equal_one_at_a_time": "True (bit for bit)",
    "model_alone_images_per_s": "",
    "model_with_device_resize_images_per_s": "",
    "device_resize_alone_images_per_s": "",
    "model_peak_gpu_gib": TARGETS["peak_gpu_gib"],
    "device_resize_vs_pil_max_levels": "0 (PIL's pixels exactly)",
    "features_device_vs_workers_max_abs": "0",
    "meets_targets": "",
}
"""Part (c)'s rows in the table, with the target shown beside each."""


def _rows(report: dict[str, Any]) -> Iterator[tuple[str, str, str, str]]:
    """``(part, what, result, target)`` for the table."""
    for part, result in report["parts"].items():
        if "error" in result:
            yield part, "error", result["error"], ""
        for key, run in result.get("runs", {}).items():
            if "skipped" in run:
                yield part, key, "skipped: " + run["skipped"], ""
            elif "error" in run:
                yield part, key, "error: " + run["error"], ""
            else:
                yield part, key, _fmt(run), f"W within {EXACT:g} of NumPy" if "W_vs_numpy" in run else ""
        if part == "extract":
            for key, target in EXTRACT_ROWS.items():
                if key in result:
                    yield part, key, _fmt(result[key]), target
        if part == "cifar" and "seconds" in result:
            yield part, "seconds (extract, learn, sweep)", _fmt(result["seconds"]), ""
            if "total_s" in result:
                yield part, "total_s", _fmt(result["total_s"]), "<= 20 s (paper: 261 s on an RTX 4070 Ti)"
        if part == "vit":
            for what, text, target in gpu_vit.rows(result):
                yield part, what, text, target


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    where = report["machine"].get("gpu", "no GPU") + (" (dry run)" if report["dry_run"] else "")
    table = Table(title=f"GPU check on {where}")
    for name in ("part", "what", "result", "target"):
        table.add_column(name, overflow="fold")
    for row in _rows(report):
        table.add_row(*(escape(cell) for cell in row))
    Console(width=200).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json")
    parser.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU (CI)")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temporary folder, removed after)")
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                        help=f"comma-separated subset of {', '.join(PARTS)} (default: all but scale, cold and vit)")
    args = parser.parse_args(argv)
    parts = run_order(args.parts.split(","))
    unknown = [name for name in parts if name not in PARTS]
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}")
    sizes = DRY if args.dry_run else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / "gpu_check.json"
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"dry_run": args.dry_run, "machine": machine(), "sizes": asdict(sizes),
                              "plan": device_plan(parts), "parts": {}}
    print(json.dumps(report["machine"]), flush=True)
    plan = report["plan"]
    print(f"plan on a device: {', '.join(parts)}; expected {plan['expected_s']} s, at most {plan['worst_s']} s of a "
          f"{plan['device_call_s']} s call", flush=True)
    try:
        for name in parts:
            start = time.perf_counter()
            result = report["parts"][name] = {}
            try:  # a part fills ``result`` as it goes: what it measured before failing is kept
                with deadline(part_deadline(sizes, name)):
                    PARTS[name](sizes, work, result)
            except Exception as exc:
                result.update(error=_one_line(exc), traceback=traceback.format_exc(limit=6))
            result["part_seconds"] = time.perf_counter() - start
            target.write_text(json.dumps(report, indent=2, default=str))
            print(f"{name}: done in {result['part_seconds']:.1f} s", flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print_table(report)
    print(f"-> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
