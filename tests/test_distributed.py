"""``--scheduler dask``: the same numbers as the single-process run, on a 2-process LocalCluster."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file
from typer.testing import CliRunner

distributed = pytest.importorskip("distributed")

from foal_pipe.cli import app  # noqa: E402
from foal_pipe.store import write_store  # noqa: E402

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
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(N_CLASSES, DIM))
    y_train, y_test = rng.integers(0, N_CLASSES, 3000), rng.integers(0, N_CLASSES, 600)
    x_train = centres[y_train] + 1.5 * rng.normal(size=(3000, DIM))
    x_test = centres[y_test] + 1.5 * rng.normal(size=(600, DIM))
    path = tmp_path_factory.mktemp("dist") / "synthetic.zarr"
    return write_store(path, (x_train, y_train), (x_test, y_test), [f"c{k}" for k in range(N_CLASSES)], chunk_rows=170)


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
    assert s_dask["results"] == s_local["results"]
    assert s_dask["best_gamma"] == s_local["best_gamma"]
    assert len({r["A_avg"] for r in s_local["results"]}) > 1  # the gammas really differ


def test_dask_statistics_match_per_task(store, cluster):
    """Library level: every task's G, Q, classes and sample count, against the local pass."""
    from foal_pipe.learn import LearnConfig, prepare, task_statistics

    kwargs = dict(tasks=3, projection_dim=64, seed=5, backend="numpy", drop_last=True, batch_size=7)
    ref = task_statistics(prepare(store, LearnConfig(**kwargs)))
    got = task_statistics(
        prepare(store, LearnConfig(**kwargs, scheduler="dask", dask_address=cluster.scheduler_address))
    )
    assert len(got) == len(ref) == 3
    for a, b in zip(ref, got):
        np.testing.assert_array_equal(b.classes_, a.classes_)
        assert b.n_samples_seen_ == a.n_samples_seen_
        np.testing.assert_allclose(b._engine.G, a._engine.G, rtol=0, atol=1e-9)
        np.testing.assert_allclose(b._engine.Q, a._engine.Q, rtol=0, atol=1e-9)
        np.testing.assert_allclose(b.weights_, a.weights_, rtol=0, atol=1e-9)


def test_rls_with_dask_is_refused(store, tmp_path):
    result = invoke("learn", "--features", store, "--out", tmp_path, "--engine", "rls", "--scheduler", "dask")
    assert result.exit_code == 1, result.output
    assert "Error:" in result.output and "--engine gram" in result.output
    assert "Traceback" not in result.output


def test_missing_distributed_gives_clear_error(store, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` now raises ImportError
    result = invoke("learn", "--features", store, "--out", tmp_path, "--scheduler", "dask")
    assert result.exit_code == 1, result.output
    assert "foal-pipe[dist]" in result.output
    assert not (tmp_path / "metrics.json").exists()


def test_nan_features_reported_from_a_worker(tmp_path, cluster):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(400, 8)), np.arange(400) % 4
    x[257, 3] = np.nan
    path = write_store(tmp_path / "nan.zarr", (x, y), (x[:40], y[:40]), list("abcd"), chunk_rows=50)
    result = invoke("learn", "--features", path, "--out", tmp_path / "out", "--tasks", "2",
                    "--scheduler", "dask", "--dask-address", cluster.scheduler_address)
    assert result.exit_code == 1, result.output
    assert "NaN or inf" in result.output and "row: 257" in result.output


def test_unknown_scheduler_and_bad_workers(store, tmp_path):
    result = invoke("learn", "--features", store, "--out", tmp_path, "--scheduler", "ray")
    assert result.exit_code == 1 and "choose local or dask" in result.output
    result = invoke("learn", "--features", store, "--out", tmp_path, "--scheduler", "dask", "--workers", "0")
    assert result.exit_code == 1 and "--workers must be at least 1" in result.output
