"""``--scheduler dask``: the same numbers as the single-process run, on a 2-process LocalCluster."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file
from typer.testing import CliRunner

distributed = pytest.importorskip("distributed")

from helpers import cluster_store, write_nonfinite_store  # noqa: E402

from foal_pipe.cli import app  # noqa: E402

pytestmark = pytest.mark.slow  # local Dask clusters

runner = CliRunner()
N_CLASSES, DIM = 12, 24


@pytest.fixture(scope="module")
def cluster():
    """One 2-worker process cluster for the module; commands reach it with --dask-address."""
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=40
    ) as c:
        yield c


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Gaussian class clusters; odd chunk size so blocks and task rows do not line up."""
    return cluster_store(tmp_path_factory.mktemp("dist") / "synthetic.zarr", N_CLASSES, DIM, 600, 170, seed=1)


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    return result


COMMON = ("--tasks", "4", "--projection-dim", "150", "--seed", "3", "--backend", "numpy")


def test_learn_dask_equals_local(store, cluster, tmp_path):
    local = invoke("learn", "--features", store, "--out", tmp_path / "local", *COMMON)
    assert local.exit_code == 0, local.output
    dask = invoke("learn", "--features", store, "--out", tmp_path / "dask", *COMMON,
                  "--scheduler", "dask", "--dask-address", cluster.scheduler_address)
    assert dask.exit_code == 0, dask.output
    m_local = json.loads((tmp_path / "local/metrics.json").read_text())
    m_dask = json.loads((tmp_path / "dask/metrics.json").read_text())
    for key in ("A_avg", "A_last", "F", "accuracy_matrix", "tasks", "n_train_seen"):
        assert m_dask[key] == m_local[key], key
    assert 0.5 < m_local["A_last"] < 1.0  # a real classification problem, not a degenerate one
    w_local, w_dask = load_file(tmp_path / "local/model.safetensors"), load_file(tmp_path / "dask/model.safetensors")
    assert set(w_local) == set(w_dask)
    np.testing.assert_array_equal(w_dask["classes"], w_local["classes"])
    for name in ("W", "G", "Q"):
        assert np.abs(w_local[name]).max() > 1.0
        np.testing.assert_allclose(w_dask[name], w_local[name], rtol=0, atol=1e-9, err_msg=name)


def test_sweep_dask_equals_local_with_own_local_cluster(store, tmp_path):
    """Also covers --dask-address local: the command starts and stops its own LocalCluster."""
    args = ("--gammas", "0.01,1,100", *COMMON)
    local = invoke("sweep", "--features", store, "--out", tmp_path / "local", *args)
    assert local.exit_code == 0, local.output
    dask = invoke("sweep", "--features", store, "--out", tmp_path / "dask", *args,
                  "--scheduler", "dask", "--dask-address", "local", "--workers", "2")
    assert dask.exit_code == 0, dask.output
    s_local = json.loads((tmp_path / "local/sweep.json").read_text())
    s_dask = json.loads((tmp_path / "dask/sweep.json").read_text())
    for a, b in zip(s_local["results"], s_dask["results"], strict=True):
        for key in ("gamma", "A_avg", "A_last", "F", "accuracy_matrix", "loo_accuracy"):
            assert b[key] == a[key], key
        for key in ("gcv", "loo_mse"):  # sums in another order: equal to rounding
            np.testing.assert_allclose(b[key], a[key], rtol=1e-9, err_msg=key)
    assert s_dask["best_gamma"] == s_local["best_gamma"]
    assert len({r["A_avg"] for r in s_local["results"]}) > 1  # the gammas really differ


def test_dask_statistics_match_local(store, cluster):
    """Library level: the statistics of each task's rows, computed on the cluster in one pass, against one local
    batch each."""
    from foal_pipe.core.statistics import RidgeStatistics
    from foal_pipe.model.projection import SmoothProjection
    from foal_pipe.protocol.distributed import dask_statistics
    from foal_pipe.protocol.stream import build_stream
    from foal_pipe.store import open_store

    opened = open_store(store)
    train = opened.train
    stream = build_stream(train.labels, N_CLASSES, 3, 7, 5, drop_last=True)
    projection = SmoothProjection(n_components=64, activation="relu", random_state=5).fit(np.zeros((1, DIM)))
    X = np.concatenate([x for _, x in train.iter_chunks()])
    row_task = stream.row_tasks(train.n_rows)
    with distributed.Client(cluster.scheduler_address) as client:
        per_task = dask_statistics(client, str(store), row_task, 3, train.labels, projection, step=50)
        assert len(per_task) == 3
        for t, got in enumerate(per_task):
            rows = np.flatnonzero(row_task == t)
            ref = RidgeStatistics.from_batch(projection.transform(X[rows]), train.labels[rows])
            np.testing.assert_array_equal(got.classes, ref.classes)
            np.testing.assert_array_equal(got.counts, ref.counts)
            assert got.n == ref.n == rows.size
            np.testing.assert_allclose(got.G, ref.G, rtol=0, atol=1e-9)
            np.testing.assert_allclose(got.Q, ref.Q, rtol=0, atol=1e-9)
            assert np.abs(ref.G).max() > 1.0


def test_rls_with_dask_is_refused(store, tmp_path):
    result = invoke("learn", "--features", store, "--out", tmp_path, "--engine", "rls", "--scheduler", "dask")
    assert result.exit_code == 1, result.output
    assert "Error:" in result.output and "--engine gram" in result.output
    assert "Traceback" not in result.output


def test_missing_distributed_gives_clear_error(store, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` now raises ImportError
    result = invoke("learn", "--features", store, "--out", tmp_path, "--scheduler", "dask")
    assert result.exit_code == 1, result.output
    assert "pip install -e '.[dist]'" in result.output
    assert not (tmp_path / "metrics.json").exists()


def test_nan_features_reported_from_a_worker(tmp_path, cluster):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(400, 8)), np.arange(400) % 4
    x[257, 3] = np.nan
    path = write_nonfinite_store(tmp_path / "nan.zarr", (x, y), (x[:40], y[:40]), list("abcd"), chunk_rows=50)
    result = invoke("learn", "--features", path, "--out", tmp_path / "out", "--tasks", "2",
                    "--scheduler", "dask", "--dask-address", cluster.scheduler_address)
    assert result.exit_code == 1, result.output
    assert f"{path}: train/features has NaN or inf values (first bad row: 257); re-extract the store" in \
        " ".join(result.output.split())  # the store named (it was not, from a worker), no float16 hint for float64


def test_unknown_scheduler_and_bad_workers(store, tmp_path):
    result = invoke("learn", "--features", store, "--out", tmp_path, "--scheduler", "ray")
    assert result.exit_code == 2 and "Invalid value for '--scheduler'" in result.output
    result = invoke("learn", "--features", store, "--out", tmp_path, "--scheduler", "dask", "--workers", "0")
    assert result.exit_code == 1 and "--workers must be at least 1" in result.output


# ---------------------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------------------
def _tiny_vit_spec(out, checkpoint, **kw):
    from helpers import TINY_VIT, TINY_VIT_KWARGS

    from foal_pipe.extract import ExtractSpec

    return ExtractSpec(dataset="digits", model=TINY_VIT, checkpoint=str(checkpoint), model_kwargs=TINY_VIT_KWARGS,
                       out=str(out), chunk_rows=128, batch_size=48, workers=0, device="cpu", **kw)


def assert_same_store(a, b):
    """Every file of the two stores byte-identical, group attributes included (they hold no run times)."""
    import zarr

    def files(root):
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    fa, fb = files(a), files(b)
    assert sorted(fa) == sorted(fb)
    assert [name for name in fa if fa[name] != fb[name]] == []
    assert zarr.open_group(str(b), mode="r").attrs["complete"] is True


@pytest.fixture(scope="module")
def vit_reference(tmp_path_factory, tiny_vit_checkpoint):
    """A single-process tiny-ViT extraction of digits (12 train + 3 test chunks of 128 rows)."""
    import torch

    from foal_pipe.extract import run_extract

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("ref") / "digits.zarr"
        run_extract(_tiny_vit_spec(out, tiny_vit_checkpoint))
    finally:
        torch.set_num_threads(threads)
    return out


def _fault_plugin(marker: str, after_writes: int, action: str):
    """A worker plugin that makes one fault in the whole cluster: the first worker process to write its
    ``after_writes``-th chunk then either SIGKILLs itself (``kill``) or raises OSError (``raise``), right after
    that write. ``marker`` records the victim's pid; teardown restores the real writer."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class Fault(WorkerPlugin):
        name = "foal-pipe-fault"

        def setup(self, worker):
            import os
            import signal

            import foal_pipe.store as st

            real, count = st.FeatureWriter.write, [0]
            self.real = real

            def write(writer, lo, block):
                real(writer, lo, block)
                count[0] += 1
                if count[0] != after_writes:
                    return
                try:
                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    return
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                if action == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise OSError("injected write failure")

            st.FeatureWriter.write = write

        def teardown(self, worker):
            import foal_pipe.store as st

            st.FeatureWriter.write = self.real

    return Fault()


def test_extract_survives_a_killed_worker(tmp_path, vit_reference, tiny_vit_checkpoint):
    """2 worker processes, ranges of 2 chunks; one worker is SIGKILLed mid-range (after the first chunk of its
    second range): its ranges are rerun elsewhere and the store equals the single-process one."""
    import os

    from foal_pipe.extract.distributed import dask_extract

    marker = tmp_path / "killed.pid"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  silence_logs=50) as cluster, distributed.Client(cluster) as client:
        client.register_plugin(_fault_plugin(str(marker), after_writes=3, action="kill"))
        spec = _tiny_vit_spec(tmp_path / "digits.zarr", tiny_vit_checkpoint)
        report = dask_extract(spec, address=cluster.scheduler_address, range_chunks=2)
        victim = int(marker.read_text())
        alive = set(client.run(os.getpid).values())
    assert victim not in alive  # a worker process really died and was replaced
    assert report.status == "created" and report.rows == {"train": 1442, "test": 355}
    assert_same_store(vit_reference, spec.out_path)


def test_extract_retries_a_range_that_raised(tmp_path, cluster):
    """A range whose task raises (after writing its first chunk) is resubmitted; the store is still exact."""
    from foal_pipe.extract import ExtractSpec, run_extract
    from foal_pipe.extract.distributed import dask_extract

    base = dict(dataset="digits", model="pixels", chunk_rows=100, batch_size=30, workers=0, device="cpu")
    run_extract(ExtractSpec(out=str(tmp_path / "ref.zarr"), **base))
    marker = tmp_path / "failed.pid"
    with distributed.Client(cluster.scheduler_address) as client:
        client.register_plugin(_fault_plugin(str(marker), after_writes=4, action="raise"))
        try:
            dask_extract(ExtractSpec(out=str(tmp_path / "dask.zarr"), **base), address=cluster.scheduler_address,
                         range_chunks=3)
        finally:
            client.unregister_worker_plugin("foal-pipe-fault")
    assert marker.exists()  # the fault happened
    assert_same_store(tmp_path / "ref.zarr", tmp_path / "dask.zarr")


def test_cli_extract_dask_equals_local(tmp_path, cluster):
    """`foal-pipe extract --scheduler dask` (pixels encoder) writes the same store as the plain command."""
    args = ["extract", "--dataset", "digits", "--model", "pixels", "--chunk-rows", "200", "--batch-size", "64",
            "--device", "cpu"]
    local = invoke(*args, "--out", tmp_path / "local.zarr", "--workers", "0")
    assert local.exit_code == 0, local.output
    dask = invoke(*args, "--out", tmp_path / "dask.zarr", "--scheduler", "dask", "--dask-address",
                  cluster.scheduler_address)
    assert dask.exit_code == 0, dask.output
    assert_same_store(tmp_path / "local.zarr", tmp_path / "dask.zarr")
    again = invoke(*args, "--out", tmp_path / "dask.zarr", "--scheduler", "dask", "--dask-address",
                   cluster.scheduler_address)
    assert again.exit_code == 0 and "already complete" in again.output


def test_extract_resumes_a_partial_store_on_dask(tmp_path, cluster):
    """A store interrupted after some chunks is finished by the Dask path from its recorded progress."""
    from foal_pipe.extract import ExtractSpec, create_store, extract_rows, mark_progress, run_extract
    from foal_pipe.extract.distributed import dask_extract

    base = dict(dataset="digits", model="pixels", chunk_rows=100, batch_size=30, workers=0, device="cpu")
    run_extract(ExtractSpec(out=str(tmp_path / "ref.zarr"), **base))
    spec = ExtractSpec(out=str(tmp_path / "part.zarr"), **base)
    create_store(spec)
    extract_rows(spec, "train", 0, 300)
    mark_progress(spec.out_path, "train", 300)
    report = dask_extract(spec, address=cluster.scheduler_address)
    assert report.status == "resumed" and report.resumed_from == {"train": 300, "test": 0}
    assert_same_store(tmp_path / "ref.zarr", spec.out_path)


def test_cli_extract_scheduler_errors(tmp_path, monkeypatch):
    args = ["extract", "--model", "pixels", "--out", tmp_path / "x.zarr", "--device", "cpu"]
    result = invoke(*args, "--scheduler", "spark")
    assert result.exit_code == 2 and "Invalid value for '--scheduler'" in result.output
    monkeypatch.setitem(sys.modules, "distributed", None)
    result = invoke(*args, "--scheduler", "dask")
    assert result.exit_code == 1 and "pip install -e '.[dist]'" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "x.zarr").exists()


def test_extract_keep_blocks_on_dask_equals_local(tmp_path, cluster, tiny_vit_checkpoint):
    """With --keep-blocks every worker writes each range's blocks chunks with its features chunks: the store
    (blocks, norm parameters and all) equals the single-process one, byte for byte."""
    import torch

    from foal_pipe.extract import run_extract
    from foal_pipe.extract.distributed import dask_extract

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_extract(_tiny_vit_spec(tmp_path / "ref.zarr", tiny_vit_checkpoint, keep_blocks=True))
    finally:
        torch.set_num_threads(threads)
    spec = _tiny_vit_spec(tmp_path / "dask.zarr", tiny_vit_checkpoint, keep_blocks=True)
    report = dask_extract(spec, address=cluster.scheduler_address, range_chunks=3)
    assert report.status == "created"
    assert (spec.out_path / "train" / "blocks" / "c" / "11" / "0" / "0").is_file()
    assert_same_store(tmp_path / "ref.zarr", spec.out_path)


@pytest.mark.parametrize(("head", "dtype"), [("ncm", "float64"), ("slda", "float64"), ("dual", "float64"),
                                             ("dual", "float32")])  # dual's float32: rows through a float32 projection
def test_learn_head_dask_equals_local(store, cluster, tmp_path, monkeypatch, head, dtype):
    """A head on --scheduler dask: the cluster reads and decodes the train chunks, the head takes the rows in stream
    order here; the same bytes as a local run (metrics.json and the model file)."""
    from foal_pipe.protocol.distributed import ClusterSplit

    reads = []
    real = ClusterSplit.read_raw
    monkeypatch.setattr(ClusterSplit, "read_raw", lambda self, lo, hi: reads.append(lo) or real(self, lo, hi))
    args = ("--tasks", "4", "--seed", "3", "--backend", "numpy", "--head", head, "--dtype", dtype,
            *(("--projection-dim", "150") if head == "dual" else ()))
    local = invoke("learn", "--features", store, "--out", tmp_path / "local", *args)
    assert local.exit_code == 0, local.output
    assert not reads
    dask = invoke("learn", "--features", store, "--out", tmp_path / "dask", *args, "--scheduler", "dask",
                  "--dask-address", cluster.scheduler_address)
    assert dask.exit_code == 0, dask.output
    assert sorted(reads) == list(range(0, 3000, 170))  # every train chunk, read by the cluster
    for name in ("metrics.json", "model.safetensors"):
        assert (tmp_path / "dask" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    assert 0.5 < json.loads((tmp_path / "local/metrics.json").read_text())["A_last"] < 1.0


def test_head_orders_on_dask_read_once_by_the_cluster_and_equal_local(store, cluster, tmp_path, monkeypatch):
    from foal_pipe.protocol.distributed import ClusterSplit

    reads = []
    real = ClusterSplit.read_raw
    monkeypatch.setattr(ClusterSplit, "read_raw", lambda self, lo, hi: reads.append(lo) or real(self, lo, hi))
    args = ("--tasks", "4", "--seed", "3", "--backend", "numpy", "--head", "slda", "--order-seeds", "0,1")
    assert invoke("learn", "--features", store, "--out", tmp_path / "local", *args).exit_code == 0
    dask = invoke("learn", "--features", store, "--out", tmp_path / "dask", *args, "--scheduler", "dask",
                  "--dask-address", cluster.scheduler_address)
    assert dask.exit_code == 0, dask.output
    assert sorted(reads) == list(range(0, 3000, 170))  # one read of every chunk, for both orders
    for name in ("metrics.json", "model.safetensors"):
        assert (tmp_path / "dask" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
