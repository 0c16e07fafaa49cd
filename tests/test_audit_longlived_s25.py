"""Audit s25, a long-lived process: the Python API called again and again in one process (a notebook, a service, a
Dask worker) leaks nothing and carries no state from one call to the next.

Faults found, fixed (``cached_inputs`` keeps the inputs only while they describe the data the store records, and
each ``extract_rows`` call closes the files it opened): the documented step-by-step extraction (docs/extract.md,
"Extraction from Python": ``create_store`` then ``extract_rows`` per range) opened the dataset once per process
(``foal_pipe.extract.spec.cached_inputs``, an ``lru_cache`` keyed by the spec alone) and kept it, an HDF5 file's open
handle included, after the call returned:

* the HDF5 file stays open (its descriptor leaks; h5py then refuses to rewrite the file in that process);
* once the file is replaced, the next extraction of the same spec writes the OLD file's pixels under the NEW file's
  labels and recorded SHA-256: a silently wrong store;
* once an image folder gains an image, the next one dies with a bare ``IndexError`` (a traceback), in that process
  for good, as the stale listing is never re-read.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import cluster_store, make_image_tree

h5py = pytest.importorskip("h5py")


def _open_paths() -> list[str]:
    paths = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor
            pass
    return paths


def _spec(out: Path, data: Path, **kw):
    from foal_pipe.extract import ExtractSpec

    return ExtractSpec(model="pixels", image_size=8, data_dir=str(data), out=str(out), chunk_rows=4, batch_size=2,
                       workers=0, device="cpu", **kw)


def _steps(spec) -> None:
    """docs/extract.md's extraction in steps, as a worker process would run it."""
    from foal_pipe.extract import create_store, extract_rows, finish_store, mark_progress
    from foal_pipe.store import writer_lock

    with writer_lock(spec.out_path):
        state = create_store(spec)
        for split in ("train", "test"):
            extract_rows(spec, split, 0, state.rows[split], path=state.path)
            mark_progress(state.path, split, state.rows[split])
        finish_store(state)


def _remove_store(path: Path) -> None:
    shutil.rmtree(path)
    Path(f"{path}.log.json").unlink(missing_ok=True)


def _write_h5(path: Path, seed: int) -> None:
    """Written beside and renamed into place, as a careful writer replaces a data file."""
    rng = np.random.default_rng(seed)
    with h5py.File(f"{path}.new", "w") as f:
        for split, n in (("train", 12), ("test", 4)):
            f[f"{split}/images"] = rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
            f[f"{split}/labels"] = np.arange(n) % 2
    os.replace(f"{path}.new", path)


def test_extract_rows_closes_the_hdf5_file_it_read(tmp_path):
    """A finished extraction in steps leaves no descriptor on the data file (run_extract leaves none), so the process
    may rewrite it. Now ``cached_inputs`` keeps the H5Source's handle open for the life of the process."""
    data = tmp_path / "d.h5"
    _write_h5(data, 0)
    _steps(_spec(tmp_path / "s.zarr", data, dataset="hdf5"))
    gc.collect()
    assert str(data) not in _open_paths(), "extract_rows left the HDF5 file open after it returned"
    with h5py.File(data, "w") as f:  # h5py refuses to truncate a file this process holds open
        f["x"] = 1


def test_extract_rows_reads_the_replaced_hdf5_file(tmp_path):
    """The same steps again after the data file was replaced store the new file's pixels (what a fresh process, or
    run_extract, stores), or refuse in one line. Now they store the old file's pixels, read through the cached handle
    of the deleted file, beside the new file's labels and SHA-256, and report success."""
    from foal_pipe.extract import run_extract
    from foal_pipe.store import read_split

    data, store = tmp_path / "d.h5", tmp_path / "s.zarr"
    _write_h5(data, 0)
    _steps(_spec(store, data, dataset="hdf5"))
    _remove_store(store)
    _write_h5(data, 1)
    _steps(_spec(store, data, dataset="hdf5"))
    got, got_labels, _ = read_split(store, "train")
    run_extract(_spec(tmp_path / "fresh.zarr", data, dataset="hdf5"))
    want, want_labels, _ = read_split(tmp_path / "fresh.zarr", "train")
    np.testing.assert_array_equal(got_labels, want_labels)
    np.testing.assert_array_equal(got, want, err_msg="rows of the replaced file stored under the new file's labels")


def test_extract_rows_reads_the_folder_again(tmp_path):
    """An image folder that gained an image since the last extraction of the same spec in this process: the steps
    store the folder as it is now (as run_extract does). Now ``extract_rows`` walks the cached listing of the folder
    as it was and dies with a bare ``IndexError``, in this process for good."""
    from foal_pipe.errors import FoalPipeError
    from foal_pipe.extract import run_extract
    from foal_pipe.store import read_split

    tree, store = tmp_path / "imgs", tmp_path / "s.zarr"
    make_image_tree(tree, {"a": 3, "b": 5}, seed=0)
    _steps(_spec(store, tree, dataset="imagefolder"))
    _remove_store(store)
    shutil.copy(tree / "train/b/img004.png", tree / "train/a/img001b.png")
    try:
        _steps(_spec(store, tree, dataset="imagefolder"))
    except FoalPipeError:
        pytest.fail("refused, though the folder is readable and nothing changes it any more")
    except Exception as exc:  # noqa: BLE001 (what escapes is the fault)
        pytest.fail(f"not a one-line error: {type(exc).__name__}: {exc}")
    run_extract(_spec(tmp_path / "fresh.zarr", tree, dataset="imagefolder"))
    for got, want in zip(read_split(store, "train")[:2], read_split(tmp_path / "fresh.zarr", "train")[:2], strict=True):
        np.testing.assert_array_equal(got, want)


def _process_state() -> dict:
    import matplotlib
    from threadpoolctl import threadpool_info

    gc.collect()
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": sorted(t.name for t in threading.enumerate()),
        "blas": sorted((p["internal_api"], p["num_threads"]) for p in threadpool_info()),
        "signals": [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)],
        "environ": dict(os.environ), "cwd": os.getcwd(), "errstate": np.geterr(), "print": np.get_printoptions(),
        "logging": {name: (len(lg.handlers), len(lg.filters), lg.level) for name, lg in
                    [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]
                    # a module's import adds a bare logger: not a change of the process's logging
                    if isinstance(lg, logging.Logger) and (lg.handlers or lg.filters or lg.level)},
        "backend": matplotlib.get_backend(), "figures": _figures(),
    }


def _figures() -> list[int] | None:
    import sys

    return sys.modules["matplotlib.pyplot"].get_fignums() if "matplotlib.pyplot" in sys.modules else None


def _digest(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "timings.json"}


def test_repeated_api_calls_leave_the_process_as_they_found_it(tmp_path):
    """Coverage (no other test loops the API in one process): learn, sweep, evaluate, load_model + predict +
    store_predictions and the estimators, called again and again, leak no descriptor or thread, change no process
    setting (BLAS threads, signal handlers, environment, directory, NumPy's errstate and print options, logging, the
    matplotlib backend or figures), leave no temporary behind, and write the same bytes every time."""
    import foal_pipe
    from foal_pipe.model.headestimator import ESTIMATORS
    from foal_pipe.protocol import LearnSettings, ModelConfig, StreamConfig, SweepSettings, learn, sweep
    from foal_pipe.report import evaluate

    store = cluster_store(tmp_path / "s.zarr", 4, 8, 60, 64, 0, n_train=300)
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(80, 8)), np.arange(80) % 4

    def once(run: Path) -> dict[str, bytes]:
        learn(store, run, LearnSettings(stream=StreamConfig(tasks=2), model=ModelConfig(projection_dim=40, gamma="auto")),
              log=lambda _: None)
        sweep(store, run, SweepSettings(stream=StreamConfig(tasks=2), model=ModelConfig(projection_dim=40)),
              log=lambda _: None)
        evaluate(run)
        model = foal_pipe.load_model(run / "model.safetensors")
        model.predict(X)
        model.store_predictions(store)
        for estimator in ESTIMATORS.values():
            estimator().partial_fit(X[:40], y[:40]).partial_fit(X[40:], y[40:]).predict(X)
        files = _digest(run)
        shutil.rmtree(run)
        return files

    first = once(tmp_path / "run")
    before = _process_state()
    for _ in range(4):
        assert once(tmp_path / "run") == first
    after = _process_state()
    assert {k: v for k, v in after.items() if before[k] != v} == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr", "s.zarr.log.json"] or \
        sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]
