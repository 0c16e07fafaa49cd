"""Faults of the second Dask audit: the memory check ignored what the Dask Gram pass holds, a damaged chunk was named
by its file key, messages named an option the user did not type, the rows read once that a Dask cluster reads
again, a float32 gamma figure that was itself refused, and each reader thread's own 60 s clock."""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest
from helpers import assert_clean_error, build_store, invoke

import foal_pipe.memory as memory
from foal_pipe import cluster
from foal_pipe.cli._app import cli_form
from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig

TASKS, D = 5, 300


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("daskfix") / "blobs.zarr", chunk=100)




def _parts(store, **execution):
    from foal_pipe.protocol.memoryparts import memory_parts
    from foal_pipe.protocol.run import prepare

    run = prepare(store, StreamConfig(tasks=TASKS), ModelConfig(projection_dim=D), EvaluationConfig(),
                  ExecutionConfig(backend="numpy", **execution))
    return memory_parts(run, 1, False)


def test_the_memory_check_counts_what_the_dask_gram_pass_holds(store, tmp_path, monkeypatch):
    """Every task's D x D sums come back at once (twice: frames, then arrays), and a LocalCluster's workers hold the
    partial sums of every task too; an external cluster's memory is not this machine's."""
    local, dask = _parts(store), _parts(store, scheduler="dask", workers=1)
    sums = TASKS * D * D * 8  # every task's G alone, float64
    extra = {name: size for name, size in dask.items() if name not in local}
    assert set(local) <= set(dask)
    received = next(size for name, size in extra.items() if "received from Dask" in name)
    partial = next(size for name, size in extra.items() if "Dask workers' partial sums (1 worker)" in name)
    assert 2 * sums <= received < 2.1 * sums
    assert partial >= 3 * sums  # the block being built, the one taken in and the tree's level partials
    two = _parts(store, scheduler="dask", workers=2)
    assert two[next(n for n in two if "partial sums (2 workers)" in n)] >= partial + 2 * sums
    external = _parts(store, scheduler="dask", dask_address="tcp://127.0.0.1:1")
    assert not any("workers' partial sums" in name for name in external) and received in external.values()

    # between the local estimate and the Dask one: the local run fits, the Dask run is refused before any cluster
    monkeypatch.setattr(memory, "available_memory", lambda: memory.BASELINE_BYTES + sum(local.values()) + sums)
    args = ("--features", store, "--tasks", TASKS, "--projection-dim", D, "--backend", "numpy")
    assert invoke("learn", *args, "--out", tmp_path / "local").exit_code == 0
    result = invoke("learn", *args, "--out", tmp_path / "dask", "--scheduler", "dask", "--workers", 1)
    assert_clean_error(result, "received from Dask", tmp_path / "dask")
    assert "--scheduler local" in result.output


def _damaged(store, tmp_path):
    import shutil

    from foal_pipe.store import open_store, write_store

    src = open_store(store)
    x, y = np.concatenate([c for _, c in src.train.iter_chunks()]), np.asarray(src.train.labels)
    xt, yt = np.concatenate([c for _, c in src.test.iter_chunks()]), np.asarray(src.test.labels)
    path = write_store(tmp_path / "damaged.zarr", (x, y), (xt, yt), list(src.classes), chunk_rows=100)
    chunk = path / "train/features/c/2/0"
    data = chunk.read_bytes()
    chunk.write_bytes(data[:-5] + bytes(b ^ 0xFF for b in data[-5:]))  # same size, wrong checksum
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    return path


def test_a_damaged_chunk_is_named_by_split_and_rows_on_dask(store, tmp_path, threads_cluster):
    path = _damaged(store, tmp_path)
    args = ("--features", path, "--tasks", 3, "--projection-dim", 32, "--backend", "numpy")
    local = invoke("learn", *args, "--out", tmp_path / "out")
    assert_clean_error(local, "train/features chunk at rows 200-299 is damaged", tmp_path / "out")
    dask = invoke("learn", *args, "--out", tmp_path / "out", "--scheduler", "dask", "--dask-address",
                  threads_cluster.scheduler_address)
    assert_clean_error(dask, "train/features chunk at rows 200-299 is damaged", tmp_path / "out")
    assert "chunk file" not in dask.output


def test_a_damaged_chunk_on_dask_is_named_under_the_store_path_as_given(store, tmp_path, threads_cluster, monkeypatch):
    """The workers read the store by its resolved path; the message names it as the user typed it, as locally."""
    _damaged(store, tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ("--features", "damaged.zarr", "--tasks", 3, "--projection-dim", 32, "--backend", "numpy", "--out", "out")
    dask = invoke("learn", *args, "--scheduler", "dask", "--dask-address", threads_cluster.scheduler_address)
    assert_clean_error(dask, "damaged.zarr: train/features chunk at rows 200-299 is damaged", tmp_path / "out")
    assert str(tmp_path) not in dask.output


def test_a_chunk_file_a_worker_could_not_read_is_named_by_rows():
    """Where the chunk reads here after all (replaced in between), the worker's key is turned into rows."""
    from foal_pipe.protocol.distributed import chunk_file_error
    from foal_pipe.store.chunks import BadChunkFile, MissingChunk

    class Split:
        root = "s.zarr"
        features = type("Array", (), {"chunks": (100, 16), "shape": (250, 16)})()

    missing = str(chunk_file_error(Split(), MissingChunk("train/features/c/1/0")))
    assert missing.startswith("s.zarr: train/features chunk at rows 100-199 is missing"), missing
    bad = str(chunk_file_error(Split(), BadChunkFile("train/features/c/2/0", "its size changed while it was read")))
    assert "train/features chunk at rows 200-249 is damaged (its size changed" in bad and "c/2/0" not in bad


def test_a_models_fusion_refused_with_dask_is_named_as_the_models(store):
    """``learn --init-model M --scheduler dask`` takes M's fusion: the refusal names it, and the model as its source."""
    from foal_pipe.protocol.run import check_settings

    with pytest.raises(FoalPipeError) as info:
        check_settings(ModelConfig(fusion="last"), ExecutionConfig(scheduler="dask"))
    text = info.value.render(cli_form)
    assert "read-time fusion 'last'" in text and "--init-model" in text and "--scheduler local" in text
    with pytest.raises(FoalPipeError) as info:
        check_settings(ModelConfig(), ExecutionConfig(scheduler="dask"), ["last", "mean-cls"])
    assert info.value.render(cli_form).startswith("--fusions reads the stored blocks")


def test_orders_on_dask_say_the_cluster_reads_the_rows_again(store, tmp_path, threads_cluster):
    result = invoke("learn", "--features", store, "--out", tmp_path / "o", "--tasks", 3, "--projection-dim", 32,
                    "--backend", "numpy", "--order-seeds", "0,1,2", "--scheduler", "dask", "--dask-address",
                    threads_cluster.scheduler_address)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "each order's Gram sums read the train rows again on the Dask cluster" in text, text


def test_the_float32_gamma_figure_is_one_that_passes_and_says_more_may_be_needed():
    """The refusal's figure, rounded to 3 digits, is not itself below the floor (rounded down it was), passes every
    check of the sums, and a later task's larger sums may need more."""
    from foal_pipe.core.linalg import check_drift, check_gammas

    top = np.float32(116.0)  # eps32 x 116 = 1.3828e-05: rounds down to 1.38e-05
    floor = float(np.finfo(np.float32).eps) * float(top)
    assert float(f"{floor:.3g}") < floor
    G = np.diag(np.array([top, 1.0], dtype=np.float32))
    with pytest.raises(FoalPipeError, match=r"a later task's sums, over more rows, may need more") as info:
        check_gammas(G, 1e-6)
    figure = float(str(info.value).split("at least ")[1].split()[0])
    assert floor <= figure
    check_drift(G, figure)  # the figure itself passes, the sums' drift too


class _Pending:
    def result(self, timeout=None):
        time.sleep(timeout)
        raise TimeoutError


class _NoWorkers:
    """A client whose cluster has lost every worker: its tasks never finish."""

    def scheduler_info(self):
        return {"workers": {}}

    def submit(self, *args, **kwargs):
        return _Pending()


def test_reads_queued_after_the_last_worker_left_share_its_clock(monkeypatch):
    """The head path reads on several threads; one queued later stops when the first does (60 s after the last
    worker left), not a full timeout after it began waiting."""
    from foal_pipe.protocol import distributed as dist

    timeout = 1.0
    monkeypatch.setattr(cluster, "WORKER_TIMEOUT", timeout)
    monkeypatch.setattr(dist, "cluster_result", functools.partial(cluster.cluster_result, poll=0.02))
    split = dist.ClusterSplit(object(), _NoWorkers(), "s.zarr", None, True, "train", [0, 100, 200, 300], block=1,
                              ahead=0)
    waited: dict[int, float] = {}

    def read(lo: int) -> None:
        start = time.monotonic()
        with pytest.raises(FoalPipeError, match="has had no worker"):
            split.read_raw(lo, lo + 100)
        waited[lo] = time.monotonic() - start

    first = threading.Thread(target=read, args=(0,))
    first.start()
    time.sleep(0.6 * timeout)
    read(300)  # queued later
    first.join()
    assert waited[0] >= timeout and waited[300] < 0.75 * timeout, waited
