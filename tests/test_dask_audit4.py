"""Faults of the fourth Dask audit: a LocalCluster that failed to start (a worker killed as it started) gave
distributed's chained tracebacks; ``--workers`` was refused with ``--dask-address ""`` (which is ``local``); a store
replaced during a Dask run was reported as damaged; continuing a head's model on Dask was refused as if the head
never ran there. None of these tests starts a cluster: distributed's entry points are replaced."""

from __future__ import annotations

import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import assert_clean_error, build_store, cluster_store, invoke

import foal_pipe.protocol.distributed as dist
from foal_pipe.errors import FoalPipeError
from foal_pipe.store.chunks import BadChunkFile


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("dask4") / "blobs.zarr")


class _Failed(Exception):
    """What the replaced LocalCluster raises once it has recorded how it was asked for."""


def _no_cluster(monkeypatch, error: Exception) -> list[dict]:
    """``distributed.LocalCluster`` replaced by one that raises ``error``: the keywords of each call."""
    distributed = pytest.importorskip("distributed")
    calls: list[dict] = []

    def start(**kwargs):
        calls.append(kwargs)
        raise error

    monkeypatch.setattr(distributed, "LocalCluster", start)
    return calls


def test_a_local_cluster_that_fails_to_start_is_one_line(store, tmp_path, monkeypatch):
    """Before: distributed's RuntimeError escaped (a ~93-line traceback on the command line). Now: one line, exit 1,
    nothing written."""
    _no_cluster(monkeypatch, RuntimeError("Nanny failed to start."))
    out = tmp_path / "run"
    result = invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 32, "--backend",
                    "numpy", "--scheduler", "dask", "--workers", 1)
    assert_clean_error(result, "cannot start a local Dask cluster of 1 worker process(es) (RuntimeError: Nanny failed "
                               "to start.); check that the workers are not killed", out)
    assert "or use --scheduler local" in result.output


def test_a_client_that_fails_on_a_started_local_cluster_closes_it(monkeypatch):
    """The cluster started but its client failed: the cluster's worker processes are closed, the error is one line."""
    distributed = pytest.importorskip("distributed")
    from foal_pipe.cluster import dask_client

    closed: list[bool] = []

    class Cluster:
        def __init__(self, **kwargs):
            pass

        def close(self):
            closed.append(True)

    def client(cluster):
        raise OSError("Timed out trying to connect to tcp://127.0.0.1:1")

    monkeypatch.setattr(distributed, "LocalCluster", Cluster)
    monkeypatch.setattr(distributed, "Client", client)
    with pytest.raises(FoalPipeError) as info, dask_client("local", 3):
        pass
    assert str(info.value).startswith("cannot start a local Dask cluster of 3 worker process(es) (OSError: Timed out")
    assert closed == [True]


@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_workers_act_with_an_empty_dask_address(store, tmp_path, monkeypatch, command):
    """``--dask-address ""`` is ``local``: ``--workers`` sizes the LocalCluster (before: refused as ignored)."""
    calls = _no_cluster(monkeypatch, _Failed("recorded"))
    out = tmp_path / "run"
    result = invoke(command, "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 32, "--backend",
                    "numpy", "--scheduler", "dask", "--dask-address", "", "--workers", 3)
    assert_clean_error(result, "cannot start a local Dask cluster of 3 worker process(es) (_Failed: recorded)", out)
    assert [call["n_workers"] for call in calls] == [3]


def test_extract_workers_act_with_an_empty_dask_address():
    from foal_pipe.cli.extract import EXTRACT_WORKERS

    applies = EXTRACT_WORKERS[1]
    assert applies({"scheduler": "dask", "dask_address": ""})
    assert applies({"scheduler": "dask", "dask_address": "local"})
    assert not applies({"scheduler": "dask", "dask_address": "tcp://127.0.0.1:8786"})


# --- a store replaced under a Dask run ---------------------------------------------------------------------------

class _Client:
    """Enough of a client for :func:`dask_statistics` up to the adding tree (replaced in the tests)."""

    def compute(self, items):
        return [SimpleNamespace(key=f"block-{i}") for i, _ in enumerate(items)]

    def submit(self, *args, **kwargs):
        return SimpleNamespace(key="read")


def _replace(path):
    """Another complete store (its own generation, the same shapes) moved to ``path``, as ``extract --overwrite``
    leaves it."""
    other = cluster_store(path.parent / "other.zarr", 3, 8, 40, 50, seed=9, n_train=300)
    shutil.rmtree(path)
    os.rename(other, path)


def _statistics(path, monkeypatch, error: Exception, replace: bool):
    def fail(client, futures, combine, advance, failed=None):
        if replace:
            _replace(path)
        failed.append(futures[0].key)
        raise error

    monkeypatch.setattr(dist, "reduce_tree", fail)
    pytest.importorskip("distributed")
    groups = np.zeros(300, dtype=np.int64)
    with pytest.raises(FoalPipeError) as info:
        dist.dask_statistics(_Client(), str(path), groups, 1, np.zeros(300, dtype=np.int64), None, 50,
                             shown=path.name)
    return str(info.value)


@pytest.mark.parametrize("error", [BadChunkFile("train/features/c/0/0", "checksum mismatch"),
                                   ValueError("checksum mismatch in a zstd frame")], ids=["chunk-file", "decode"])
def test_a_store_replaced_under_the_dask_gram_pass_is_changed_not_damaged(tmp_path, monkeypatch, error):
    """Before: the new store was read by name, found sound, and the worker's error named it "damaged ...;
    re-extract it" (a chunk-file error), or escaped as a traceback (a decode error). Now: "changed while it was being
    read", as a local run says."""
    path = cluster_store(tmp_path / "s.zarr", 3, 8, 40, 50, seed=1, n_train=300)
    monkeypatch.chdir(tmp_path)
    message = _statistics(path, monkeypatch, error, replace=True)
    assert message.startswith("feature store s.zarr changed while it was being read (generation "), message
    assert "re-run the command" in message and "damaged" not in message


def test_a_damaged_chunk_in_an_unchanged_store_is_still_named_damaged(tmp_path, monkeypatch):
    path = cluster_store(tmp_path / "s.zarr", 3, 8, 40, 50, seed=1, n_train=300)
    monkeypatch.chdir(tmp_path)
    message = _statistics(path, monkeypatch, BadChunkFile("train/features/c/2/0", "checksum mismatch"), replace=False)
    assert message.startswith("s.zarr: train/features chunk at rows 100-149 is damaged (checksum mismatch)"), message


def test_a_store_replaced_under_a_dask_heads_read_is_changed_not_damaged(tmp_path, monkeypatch):
    """The heads' reads (:class:`ClusterSplit`): the same, where the chunk reads here from the new store (one
    without chunk records, format 1, whose chunks the opened split reads without noticing the swap)."""
    from foal_pipe.store import open_store

    path = build_store(tmp_path / "s.zarr", n_train=300, chunk=50)
    monkeypatch.chdir(tmp_path)
    split = open_store("s.zarr").train

    def fail(client, future, poll=2.0, watch=None):
        other = build_store(tmp_path / "other.zarr", n_train=300, chunk=50, seed=9)
        shutil.rmtree(path)
        os.rename(other, path)
        raise BadChunkFile("train/features/c/0/0", "checksum mismatch")

    monkeypatch.setattr(dist, "cluster_result", fail)
    monkeypatch.setattr(dist, "WorkerWatch", lambda client: None)
    reader = dist.ClusterSplit(split, _Client(), str(path), None, True, "train", [0, 50, 100], block=1)
    with pytest.raises(FoalPipeError) as info:
        reader.read_raw(0, 50)
    assert str(info.value).startswith("feature store s.zarr changed while it was being read ("), str(info.value)


# --- continuing a head's model on Dask ----------------------------------------------------------------------------

def test_continuing_a_head_model_on_dask_names_the_continuation(store, tmp_path):
    """slda runs on Dask when it starts fresh; only continuing its model is local (before: "the slda head runs in
    this process")."""
    model = tmp_path / "slda"
    args = ("--features", store, "--tasks", 2, "--projection-dim", 32, "--backend", "numpy")
    first = invoke("learn", *args, "--out", model, "--head", "slda")
    assert first.exit_code == 0, first.output
    out = tmp_path / "continued"
    result = invoke("learn", *args, "--out", out, "--init-model", model / "model.safetensors", "--scheduler", "dask")
    assert_clean_error(result, "continuing a slda model (--init-model) runs in this process (only ridge's sums are "
                               "added on a cluster); continue it with --scheduler local", out)
