"""The heads audit's faults: dual's per-batch recursion refused where its conditioning may move the residuals (at
gamma 1e-12 they were off by half their size, the boundary's exact solves well conditioned), and exact where it
runs; float64 rows narrowed to float32 refused where they leave float32's range (rows of 1e-150 became zeros)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe.core.backend import get_namespace
from foal_pipe.errors import FoalPipeError
from foal_pipe.heads.dual import DualHead
from foal_pipe.store import write_store


def _tasks(scale: float = 1.0):
    rng = np.random.default_rng(0)
    D = 24
    centres = rng.normal(size=(6, D))
    tasks = []
    for classes in ([0, 1, 2], [3, 4, 5]):
        y = np.repeat(classes, 20)
        rng.shuffle(y)
        tasks.append(((centres[y] + rng.normal(size=(y.size, D))) * scale, y))
    return tasks


def _stable_dual(tasks, gamma, gamma_comp, batch):
    """The published recursion's model by exact per-batch solves (no Woodbury steps): after each batch the main
    stream's W solves its sums so far; the residual of the batch under it, earlier tasks' columns zeroed, is
    summed into the compensation stream's right-hand side."""
    D, C = tasks[0][0].shape[1], 6
    G_m, Q_m, G_c, Q_c = np.zeros((D, D)), np.zeros((D, C)), np.zeros((D, D)), np.zeros((D, C))
    earlier: list[int] = []
    for h, y in tasks:
        for lo in range(0, y.size, batch):
            X, Y = h[lo:lo + batch], np.eye(C)[y[lo:lo + batch]]
            Z, T = np.maximum(X, 0), np.tanh(X)
            G_m += Z.T @ Z
            Q_m += Z.T @ Y
            residual = Y - Z @ np.linalg.solve(G_m + gamma * np.eye(D), Q_m)
            residual[:, earlier] = 0
            G_c += T.T @ T
            Q_c += T.T @ residual
        earlier = sorted(set(earlier) | set(y.tolist()))
    return np.linalg.solve(G_c + gamma_comp * np.eye(D), Q_c)


def _fit(tasks, gamma):
    head = DualHead(gamma=gamma, gamma_comp=1.0, compensation=1.0, batch_size=10, xp=get_namespace("numpy"),
                    dim=tasks[0][0].shape[1])
    for h, y in tasks:
        head.add(h, y)
        model = head.boundary()
    return model


def test_dual_at_a_gamma_its_recursion_cannot_resolve_is_refused():
    with pytest.raises(FoalPipeError, match=r"dual's per-batch recursion's rounding moved .* use a larger gamma for dual"):
        _fit(_tasks(), 1e-12)
    with pytest.raises(FoalPipeError, match="dual's per-batch recursion"):
        _fit(_tasks(1e6), 1.0)  # the default gamma, features of large scale


@pytest.mark.parametrize(("scale", "gamma"), [(1.0, 1e-6), (1.0, 1.0), (1e6, 1e6)])
def test_dual_where_it_runs_equals_exact_per_batch_solves(scale, gamma):
    tasks = _tasks(scale)
    W_comp = np.asarray(_fit(tasks, gamma).W_comp)
    reference = _stable_dual(tasks, gamma, 1.0, 10)
    np.testing.assert_allclose(W_comp, reference, rtol=0, atol=1e-6 * np.abs(reference).max())


def test_a_dual_model_continues_where_its_recursion_starts_well_conditioned(tmp_path):
    """After the first task the recursion starts from the boundary's exact inverse of a full-rank G_main: a continued
    model at a gamma far below trace(G_main) runs (an up-front bound of trace(G_main)/gamma refused it)."""
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(4, 8))
    paths = []
    for name in ("a", "b"):
        y = rng.integers(0, 4, 600)
        X = (centres[y] + 0.8 * rng.normal(size=(600, 8))) * 100
        paths.append(write_store(tmp_path / f"{name}.zarr", (X, y), (X[:80], y[:80]), ["k0", "k1", "k2", "k3"],
                                 dtype="float64"))
    args = ("--tasks", 2, "--projection-dim", 0, "--gamma-comp", 1)
    first = invoke("learn", "--features", paths[0], "--out", tmp_path / "m", "--head", "dual", "--gamma", "1e-4", *args)
    assert first.exit_code == 0, first.output
    result = invoke("learn", "--features", paths[1], "--init-model", tmp_path / "m" / "model.safetensors", "--out",
                    tmp_path / "c", "--tasks", 2)
    assert result.exit_code == 0, result.output


@pytest.fixture
def stores(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(3), 12)
    X = rng.normal(size=(y.size, 6)) + y[:, None]
    return {name: write_store(tmp_path / f"{name}.zarr", (X * scale, y), (X * scale, y), ["a", "b", "c"], dtype="float64")
            for name, scale in (("tiny", 1e-150), ("huge", 1e140))}


@pytest.mark.parametrize("name", ["tiny", "huge"])
@pytest.mark.parametrize("head", [("--head", "ncm"), ("--head", "balanced"), ("--gamma", "1"), ("--projection-dim", "0")])
def test_float64_rows_outside_float32s_range_are_refused(stores, tmp_path, name, head):
    out = tmp_path / "run"
    result = invoke("learn", "--features", stores[name], "--out", out, "--tasks", 3, "--dtype", "float32", *head)
    assert_clean_error(result, "float32's range, which --dtype float32 would turn into inf or zeros", out)
    if name == "tiny" and "--projection-dim" not in head:  # float64 takes them (not ridge's own Gram sums of them)
        again = invoke("learn", "--features", stores[name], "--out", out, "--tasks", 3, *head)
        if "ncm" in head:  # on the store's features
            assert again.exit_code == 0, again.output
        else:  # projected, rows of scale 1e-150 leave every sigmoid at 0.5: refused, not learnt at chance
            assert_clean_error(again, "project below the activation's rounding", out)
