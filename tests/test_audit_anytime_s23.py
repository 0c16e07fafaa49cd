"""Audit (s23, anytime): `learn --eval-every` for ridge and the heads against a NumPy recomputation written from
docs/streams.md and docs/heads.md. Angles not covered elsewhere: every point that falls on a task end equals that
end's A_step (and, with `--gamma auto`, its selected gamma) for ridge, slda and balanced on a Si-Blurry stream at
`--eval-every 1`; `--drop-last` points count only the kept rows, in stream order; a head's `--order-seeds` curves
(each order against its own stream), their mean A_auc and byte-identical reruns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import cluster_store, invoke, read, unit
from safetensors.numpy import load_file

from foal_pipe.protocol.stream import build_stream, si_blurry

C = 6
COMMON = ("--tasks", "3", "--seed", "3", "--backend", "numpy")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return cluster_store(tmp_path_factory.mktemp("anyt") / "s.zarr", C, 16, 120, 100, 0, n_train=300)


def run(store: Path, out: Path, *args) -> tuple[dict, dict]:
    result = invoke("learn", "--features", store, "--out", out, *COMMON, *args)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text()), load_file(str(out / "model.safetensors"))


def fit(head: str, H: np.ndarray, y: np.ndarray, gamma: float):
    """The head's definition on rows ``H`` (docs/heads.md, docs/heads-projected.md): (classes, scorer)."""
    cl = np.unique(y)
    Y = (y[:, None] == cl[None]).astype(float)
    n = Y.sum(0)
    if head in ("ridge", "balanced"):
        w = np.ones(len(y)) if head == "ridge" else ((1 / n) * len(cl) / (1 / n).sum())[Y.argmax(1)]
        W = np.linalg.solve((H * w[:, None]).T @ H + gamma * np.eye(H.shape[1]), (H * w[:, None]).T @ Y)
        return cl, lambda Z: Z @ W
    if head == "ncm":
        mu = (Y.T @ unit(H)) / n[:, None]
        return cl, lambda Z: -((unit(Z)[:, None] - mu[None]) ** 2).sum(2)
    assert head == "slda"
    mu = (Y.T @ H) / n[:, None]
    R = H - mu[Y.argmax(1)]
    Lam = np.linalg.pinv((1 - 1e-4) * (R.T @ R) / len(H) + 1e-4 * np.eye(H.shape[1]))
    W, b = Lam @ mu.T, -0.5 * np.einsum("cd,dc->c", mu, Lam @ mu.T)
    return cl, lambda Z: Z @ W + b


def rows_of(model: dict, X: np.ndarray) -> np.ndarray:
    """The rows a head sees: the store's, or sigmoid(X P) with the saved projection (learn's default activation)."""
    return 1 / (1 + np.exp(-X.astype(np.float64) @ model["projection"])) if "projection" in model else X.astype(np.float64)


def expected_curve(store: Path, model: dict, head: str, order: np.ndarray, every: int, gammas) -> list[float]:
    """docs/streams.md: after every N rows of the stream (counted across tasks), the model on the rows seen, scored
    on the test rows of the classes seen, pooled; ``gammas(k)``: the gamma at point k."""
    X, y, T, yt = read(store)
    H, Ht = rows_of(model, X), rows_of(model, T)
    out = []
    for k in range(every, order.size + 1, every):
        cl, score = fit(head, H[order[:k]], y[order[:k]], gammas(k))
        sel = np.isin(yt, cl)
        out.append(float(np.mean(cl[score(Ht[sel]).argmax(1)] == yt[sel])))
    return out


def ridge_gammas_at(ends: np.ndarray, selected: list[float]):
    """docs/streams.md "Gamma at a point": the last task end's choice at or before k, 1 before the first."""
    return lambda k: 1.0 if (done := int(np.searchsorted(ends, k, side="right"))) == 0 else selected[done - 1]


@pytest.mark.parametrize("head,extra", [("ridge", ("--projection-dim", "20", "--gamma", "auto")),
                                        ("slda", ()), ("balanced", ("--projection-dim", "20", "--gamma", "0.5"))])
def test_every_point_on_a_task_end_is_that_ends_step(store, tmp_path, head, extra):
    metrics, model = run(store, tmp_path / "r", "--head", head, "--stream", "si-blurry", "--eval-every", "1", *extra)
    _, y, _, _ = read(store)
    stream = si_blurry(y, C, 3, 10, 3, metrics["disjoint_ratio"], metrics["blurry_ratio"])
    assert [list(t) for t in stream.tasks] == metrics["tasks"]
    order, ends = np.concatenate(stream.rows), np.cumsum([r.size for r in stream.rows])
    curve = metrics["anytime"]
    assert curve["samples_seen"] == list(range(1, 301))
    np.testing.assert_allclose([curve["accuracy"][e - 1] for e in ends], metrics["A_steps"], rtol=0, atol=1e-12)
    assert curve["accuracy"][-1] == pytest.approx(metrics["A_last"], abs=1e-12)
    if head == "ridge":
        gammas = ridge_gammas_at(ends, metrics["gammas_selected"])
        assert curve["gammas"] == [gammas(k) for k in curve["samples_seen"]]
    else:
        assert "gammas" not in curve
        gammas = lambda k: 0.5  # noqa: E731
    expected = expected_curve(store, model, head, order, 1, gammas)
    np.testing.assert_allclose(curve["accuracy"], expected, rtol=0, atol=1e-12)
    assert metrics["A_auc"] == pytest.approx(np.mean(expected), abs=1e-12)


@pytest.mark.parametrize("head,extra", [("ridge", ("--projection-dim", "20")), ("slda", ())])
def test_drop_last_points_count_the_kept_rows_in_stream_order(store, tmp_path, head, extra):
    metrics, model = run(store, tmp_path / "r", "--head", head, "--drop-last", "--batch-size", "7", "--eval-every", "40",
                         *extra)
    _, y, _, _ = read(store)
    stream = build_stream(y, C, 3, 7, 3, drop_last=True)
    order = np.concatenate(stream.rows)
    assert metrics["n_train_seen"] == order.size < 300
    curve = metrics["anytime"]
    assert curve["samples_seen"] == list(range(40, order.size + 1, 40))
    expected = expected_curve(store, model, head, order, 40, lambda k: 1.0)
    np.testing.assert_allclose(curve["accuracy"], expected, rtol=0, atol=1e-12)
    assert metrics["A_auc"] == pytest.approx(np.mean(expected), abs=1e-12)


@pytest.mark.parametrize("head,stream_kind,extra", [("balanced", "disjoint", ("--projection-dim", "20")),
                                                    ("ncm", "si-blurry", ())])
def test_head_order_seeds_curves_mean_and_same_bytes(store, tmp_path, head, stream_kind, extra):
    args = ("--head", head, "--stream", stream_kind, "--eval-every", "25", "--order-seeds", "4,1", *extra)
    metrics, model = run(store, tmp_path / "a", *args)
    _, y, _, _ = read(store)
    for entry in metrics["orders"]:
        seed = entry["order_seed"]
        stream = (si_blurry(y, C, 3, 10, seed, 50, 10) if stream_kind == "si-blurry" else build_stream(y, C, 3, 10, seed))
        assert [list(t) for t in stream.tasks] == entry["tasks"]
        expected = expected_curve(store, model, head, np.concatenate(stream.rows), 25, lambda k: 1.0)
        np.testing.assert_allclose(entry["anytime"]["accuracy"], expected, rtol=0, atol=1e-12)
        assert entry["A_auc"] == pytest.approx(np.mean(expected), abs=1e-12)
    assert metrics["anytime"] == metrics["orders"][0]["anytime"]  # the first order's (docs/orders.md)
    assert metrics["A_auc"] == pytest.approx(np.mean([e["A_auc"] for e in metrics["orders"]]), abs=1e-15)
    run(store, tmp_path / "b", *args)
    for name in ("metrics.json", "model.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
