"""Faults of the Dask audit of session 21: the heads' cluster reads named a bad chunk or rows that are not finite under
the store's resolved path (and, for a block of several chunks, the worker's message alone); a worker that saw another
store at the store's path fed its rows to a head silently, and the Gram pass called a store the workers could not see
"missing ... re-extract it"; ``extract`` on an external cluster sent the workers the client's relative ``--data-dir``,
which each worker read from its own working directory. Only a one-thread in-process cluster is started; the other
tests replace the client."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import assert_clean_error, assert_identical_stores, invoke, make_image_tree, write_nonfinite_store

import foal_pipe.protocol.distributed as dist
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import open_store, write_store
from foal_pipe.store.chunks import MissingChunk

WORKER = "tcp://worker:1"




def _rows(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(400, 8)), np.arange(400) % 4


def _nan_store(path: Path) -> Path:
    x, y = _rows()
    x[257, 3] = np.nan
    return write_nonfinite_store(path, (x, y), (x[:40], y[:40]), list("abcd"), chunk_rows=50)


def _damaged_store(path: Path) -> Path:
    x, y = _rows()
    write_store(path, (x, y), (x[:40], y[:40]), list("abcd"), chunk_rows=50)
    chunk = path / "train/features/c/2/0"
    data = chunk.read_bytes()
    chunk.write_bytes(data[:-5] + bytes(b ^ 0xFF for b in data[-5:]))  # same size, wrong checksum
    return path


@pytest.mark.parametrize("make, message", [
    (_nan_store, "nan.zarr: train/features has NaN or inf values (first bad row: 257); re-extract the store"),
    (_damaged_store, "nan.zarr: train/features chunk at rows 100-149 is damaged (checksum mismatch)"),
], ids=["nan", "damaged"])
def test_a_heads_cluster_read_names_the_store_as_given_and_as_locally(tmp_path, monkeypatch, threads_cluster, make,
                                                                     message):
    """Before: ``/abs/path/nan.zarr: ...`` (the workers' resolved path), where a local run says ``nan.zarr: ...``; the
    chunk at fault is not the first of the cluster's block, so reading the asked-for chunk here found nothing."""
    make(tmp_path / "nan.zarr")
    monkeypatch.chdir(tmp_path)
    args = ("learn", "--features", "nan.zarr", "--tasks", 2, "--projection-dim", 16, "--head", "ncm")
    local = invoke(*args, "--out", "local")
    assert_clean_error(local, message, tmp_path / "local")
    dask = invoke(*args, "--out", "dask", "--scheduler", "dask", "--dask-address", threads_cluster.scheduler_address)
    assert_clean_error(dask, message, tmp_path / "dask")
    assert dask.output.strip().splitlines()[-1] == local.output.strip().splitlines()[-1]
    assert str(tmp_path) not in dask.output


# --- workers that do not see the store as this process does -----------------------------------------------------

class _Done:
    def __init__(self, key: str, value=None, error: BaseException | None = None) -> None:
        self.key, self.status, self._value, self._error = key, "error" if error else "finished", value, error

    def result(self, timeout=None):
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self):
        return self._error

    def release(self) -> None:
        pass


class _Elsewhere:
    """A client whose one worker sees ``there`` where this process sees ``here`` (another node's disk): each task and
    ``run`` is called at once, with the path swapped."""

    def __init__(self, here: Path, there: Path, cwd: Path | None = None) -> None:
        self.here, self.there, self.cwd = str(here), str(there), cwd

    def _swap(self, args):
        """``args`` as the worker sees them: ``here`` in a string, or in a string field of a spec, is ``there``."""
        def swap(a):
            if dataclasses.is_dataclass(a) and not isinstance(a, type):
                return dataclasses.replace(a, **{f.name: swap(getattr(a, f.name)) for f in dataclasses.fields(a)})
            return a.replace(self.here, self.there) if isinstance(a, str) else a

        return [swap(a) for a in args]

    def _call(self, fn, args):
        back = os.getcwd()
        os.chdir(self.cwd or back)  # the worker's own working directory
        try:
            return fn(*self._swap(args))
        finally:
            os.chdir(back)

    def submit(self, fn, *args, **kwargs):
        key = kwargs.get("key", "task")
        try:
            return _Done(key, self._call(fn, args))
        except Exception as exc:  # noqa: BLE001  a task's error, as a future holds it
            return _Done(key, error=exc)

    def run(self, fn, *args):
        return {WORKER: self._call(fn, args)}

    def scheduler_info(self):
        return {"workers": {WORKER: {}}}


def test_a_worker_that_sees_another_store_feeds_no_head_its_rows(tmp_path):
    """Before: the worker opened the store it saw at the path, a sound store of its own, and the head learned its rows
    (A_avg 36.25 against the store's own 51.25 on an external cluster, outputs written)."""
    ours = write_store(tmp_path / "s.zarr", _rows(0), _rows(1), list("abcd"), chunk_rows=50)
    theirs = write_store(tmp_path / "other.zarr", _rows(2), _rows(3), list("abcd"), chunk_rows=50)
    split = open_store(ours).train
    reader = dist.ClusterSplit(split, _Elsewhere(ours, theirs), str(ours), None, True, "train", [0, 50, 100], block=2)
    with pytest.raises(FoalPipeError) as info:
        reader.read_raw(50, 100)
    assert str(info.value).startswith(f"the Dask workers do not see the feature store {ours} as this process does (1 of "
                                      f"1: {WORKER} sees another store at {ours}); every worker must see the store at "
                                      "the same path"), str(info.value)


def test_the_workers_read_the_store_the_client_opened(tmp_path):
    from foal_pipe.store.seen import store_identity

    ours = write_store(tmp_path / "s.zarr", _rows(0), _rows(1), list("abcd"), chunk_rows=50)
    theirs = write_store(tmp_path / "other.zarr", _rows(2), _rows(3), list("abcd"), chunk_rows=50)
    mine = dist.read_chunks(str(ours), None, True, "train", store_identity(ours), [0, 50])
    np.testing.assert_array_equal(mine[50], _rows(0)[0][50:100].astype(np.float32))  # as stored
    with pytest.raises(FoalPipeError, match="does not see the feature store"):
        dist.read_chunks(str(theirs), None, True, "train", store_identity(ours), [0])


def test_a_store_the_workers_cannot_see_is_not_called_damaged(tmp_path, monkeypatch):
    """The Gram pass: a worker that cannot read the store's chunks (a path only this node has) raised MissingChunk,
    the chunk read here, and the store was named "missing (deleted, ...); re-extract it"."""
    pytest.importorskip("distributed")
    path = write_store(tmp_path / "s.zarr", _rows(0), _rows(1), list("abcd"), chunk_rows=50)

    class Client(_Elsewhere):
        def compute(self, items):
            return [SimpleNamespace(key=f"block-{i}") for i, _ in enumerate(items)]

    def fail(client, futures, combine, advance, failed=None):
        failed.append(futures[0].key)
        raise MissingChunk("train/features/c/0/0")

    monkeypatch.setattr(dist, "reduce_tree", fail)
    monkeypatch.chdir(tmp_path)
    groups = np.zeros(400, dtype=np.int64)
    with pytest.raises(FoalPipeError) as info:
        dist.dask_statistics(Client(path, tmp_path / "absent.zarr"), str(path), groups, 1, _rows(0)[1], None, 50,
                             shown="s.zarr")
    message = str(info.value)
    assert message.startswith(f"the Dask workers do not see the feature store s.zarr as this process does (1 of 1: "
                              f"{WORKER} cannot read {path}, FileNotFoundError); every worker must see the store at the "
                              "same path (a shared filesystem, docs/dask.md): mount it there, or use "), message
    assert "re-extract" not in message and "missing" not in message


def test_workers_that_see_the_store_pass_the_check(tmp_path):
    from foal_pipe.store.seen import check_workers_see

    path = write_store(tmp_path / "s.zarr", _rows(0), _rows(1), list("abcd"), chunk_rows=50)
    check_workers_see(_Elsewhere(path, path), path, "s.zarr", "fix")  # nothing raised
    twin = tmp_path / "twin.zarr"  # the same bytes elsewhere (a copy on another node's disk) is the same store
    shutil.copytree(path, twin)
    check_workers_see(_Elsewhere(path, twin), path, "s.zarr", "fix")
    other = write_store(tmp_path / "t.zarr", _rows(2), _rows(1), list("abcd"), chunk_rows=50)  # other rows, same shapes
    with pytest.raises(FoalPipeError, match=r"\(1 of 1: tcp://worker:1 sees another store at .*\): fix$"):
        check_workers_see(_Elsewhere(path, other), path, "s.zarr", "fix")


# --- extract on an external cluster ---------------------------------------------------------------------------------

def _extract_on(client: _Elsewhere, spec, monkeypatch):
    """:func:`dask_extract` at an external address, its client replaced by ``client``."""
    import distributed

    import foal_pipe.extract.distributed as extract

    monkeypatch.setattr(extract, "dask_client", lambda address, workers: contextlib.nullcontext(client))
    monkeypatch.setattr(distributed, "as_completed", iter)
    return extract.dask_extract(spec, address="tcp://scheduler:8786")


def test_extract_on_an_external_cluster_reads_the_data_dir_the_client_named(tmp_path, monkeypatch):
    """Before: the workers were sent ``--data-dir imgs`` as typed and, in a working directory of their own, found no
    images there ("imagefolder dataset not found: imgs/train is not a folder"), or others' images."""
    pytest.importorskip("distributed")
    from foal_pipe.extract import ExtractSpec, run_extract

    make_image_tree(tmp_path / "imgs", {"a": 5, "b": 5})
    elsewhere = tmp_path / "worker-cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    base = dict(dataset="imagefolder", data_dir="imgs", model="pixels", chunk_rows=4, batch_size=3, workers=0,
                device="cpu")
    run_extract(ExtractSpec(out=str(tmp_path / "local.zarr"), **base))
    client = _Elsewhere(tmp_path / "dask.zarr", tmp_path / "dask.zarr", cwd=elsewhere)
    report = _extract_on(client, ExtractSpec(out="dask.zarr", **base), monkeypatch)
    assert report.status == "created"
    assert_identical_stores(tmp_path / "local.zarr", tmp_path / "dask.zarr")


def test_extract_into_a_store_the_workers_cannot_see_says_so(tmp_path, monkeypatch):
    """Before: "cannot write train/features of ...: ... does not exist; free some space or make it writable"."""
    pytest.importorskip("distributed")
    from foal_pipe.extract import ExtractSpec

    monkeypatch.chdir(tmp_path)
    spec = ExtractSpec(dataset="digits", model="pixels", out="new.zarr", chunk_rows=500, batch_size=100, workers=0,
                       device="cpu")
    client = _Elsewhere(tmp_path / "new.zarr", tmp_path / "absent.zarr")
    with pytest.raises(FoalPipeError) as info:
        _extract_on(client, spec, monkeypatch)
    message = str(info.value)
    assert message.startswith(f"the Dask workers do not see the feature store new.zarr as this process does (1 of 1: "
                              f"{WORKER} cannot read {tmp_path / 'new.zarr'}, FileNotFoundError)"), message
    assert "re-run the same command (new.zarr is resumable)" in message and "free some space" not in message
    assert os.path.isdir(tmp_path / "new.zarr")  # resumable, as any interrupted extraction
