"""The heads other than ridge on Si-Blurry streams (classes recur across tasks): each head's model at every task end
against its float64 definition on all rows seen so far (the references of test_heads.py and
test_heads_projected.py), and `learn --head` / `sweep --heads` scored by Si-Blurry's definitions, by hand."""

from __future__ import annotations

import json

import array_api_compat.numpy as xnp
import numpy as np
import pytest
from helpers import N_CLASSES, assert_clean_error, build_store, invoke, read, ref_fecam, ref_ncm, ref_slda
from safetensors.numpy import load_file
from test_heads import REFERENCES
from test_heads_projected import assert_scores, balanced_closed_form, dsal_published

from foal_pipe.heads import make_head
from foal_pipe.protocol.stream import si_blurry

BLURRY = ("--stream", "si-blurry", "--tasks", "4", "--seed", "4", "--batch-size", "10", "--backend", "numpy")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("blurry") / "blobs.zarr")


def blurry_tasks(seed: int = 5, n: int = 900, classes: int = 6, dim: int = 8):
    """Gaussian rows in a Si-Blurry stream of 4 tasks: (rows, labels) per task in stream order; classes recur."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    X = rng.normal(size=(classes, dim))[y] + 1.3 * rng.normal(size=(n, dim))
    stream = si_blurry(y, classes, 4, 10, seed, disjoint_ratio=34, blurry_ratio=20)
    recurring = {c for k, t in enumerate(stream.tasks) for c in t if any(c in u for u in stream.tasks[:k])}
    assert recurring, "a stream whose classes recur"
    return [(X[r], y[r]) for r in stream.rows]


def fed(name, options, tasks, seed=0):
    """Each task's rows in stream order, in random-size blocks, then ``boundary()``: the scorer at every task end."""
    rng = np.random.default_rng(seed)
    head = make_head(name, dict(options), xnp, tasks[0][0].shape[1])
    for X, y in tasks:
        lo = 0
        while lo < y.size:
            hi = lo + int(rng.integers(1, 40))
            head.add(X[lo:hi], y[lo:hi])
            lo = hi
        yield head.boundary()


@pytest.mark.parametrize(("name", "options"), list(REFERENCES))
def test_feature_heads_equal_their_definition_at_every_si_blurry_task_end(name, options):
    tasks = blurry_tasks()
    probe = np.concatenate([X for X, _ in tasks])
    for t, scorer in enumerate(fed(name, options, tasks)):
        X = np.concatenate([X for X, _ in tasks[: t + 1]])
        y = np.concatenate([y for _, y in tasks[: t + 1]])
        classes, expected = REFERENCES[(name, options)](X, y, probe)
        assert_scores(scorer, classes, expected, probe, xnp)


def test_balanced_equals_its_closed_form_at_every_si_blurry_task_end():
    tasks = blurry_tasks(6)
    probe = np.concatenate([X for X, _ in tasks])
    for t, scorer in enumerate(fed("balanced", {"gamma": 0.4}, tasks)):
        classes, W = balanced_closed_form(np.concatenate([X for X, _ in tasks[: t + 1]]),
                                          np.concatenate([y for _, y in tasks[: t + 1]]), 0.4)
        assert_scores(scorer, classes, probe @ W, probe, xnp)


def test_dual_equals_the_published_recursion_on_a_si_blurry_stream():
    """A recurring class is one of an earlier task: its residual columns are zeroed (dual.py's rule)."""
    tasks = blurry_tasks(7)
    probe = np.concatenate([X for X, _ in tasks])
    options = {"gamma": 1.0, "gamma_comp": 0.5, "compensation": 0.7, "batch_size": 10}
    reference = dsal_published(tasks, 1.0, 0.5, 0.7, 10, "task")
    for scorer, (classes, scores) in zip(fed("dual", options, tasks), reference, strict=True):
        assert_scores(scorer, classes, scores(probe), probe, xnp)


# --- learn --head / sweep --heads on --stream si-blurry, by hand ------------------------------------------------


def sigmoid(H):
    return 1 / (1 + np.exp(-H))


def reference_for(args: tuple[str, ...], model: dict):
    """The definition of the head ``args`` runs (test_heads.py's references; balanced's closed form on the
    activations of the run's projection): (X, y, T) -> (classes, scores of T)."""
    if args[0] != "balanced":
        return {("ncm",): ref_ncm, ("slda",): ref_slda, ("slda", "--shrinkage", "oas"): lambda X, y, T: ref_slda(X, y, T, "oas"),
                ("fecam",): ref_fecam}[args]
    P = model["projection"].astype(np.float64)

    def balanced(X, y, T):
        classes, W = balanced_closed_form(sigmoid(X @ P), y, float(args[-1]))
        return classes, sigmoid(T @ P) @ W
    return balanced


def by_hand(store, stream, reference):
    """Si-Blurry's accuracy matrix (docs/streams.md): a[i][j], the definition on the train rows of tasks 1..i,
    argmax over the classes seen, on the test rows of the classes seen by task end j; and each A_t = a[t][t]."""
    x, y, xt, yt = (a.astype(np.float64) if a.dtype.kind == "f" else a for a in read(store))
    matrix, ends, per_class = [], [], []
    for i in range(len(stream.tasks)):
        rows = np.concatenate(stream.rows[: i + 1])
        classes, scores = reference(x[rows], y[rows], xt)
        ends.append(classes)
        pred = classes[scores.argmax(axis=1)]
        matrix.append([float(np.mean(pred[np.isin(yt, ends[j])] == yt[np.isin(yt, ends[j])])) for j in range(i + 1)])
        per_class.append({int(c): float(np.mean(pred[yt == c] == c)) for c in classes})
    T = len(matrix)
    drops = [max(per_class[i][c] for i in range(T - 1) if c in per_class[i]) - per_class[-1][c] for c in ends[T - 2]]
    return matrix, float(np.mean(drops))


def stream_of(store, metrics):
    _, ytr, _, _ = read(store)
    stream = si_blurry(ytr, N_CLASSES, 4, 10, metrics["order_seed"], metrics["disjoint_ratio"], metrics["blurry_ratio"])
    assert stream.tasks == metrics["tasks"]
    assert any(c in u for k, t in enumerate(stream.tasks) for c in t for u in stream.tasks[:k]), "classes recur"
    return stream


@pytest.mark.parametrize("args", [("ncm",), ("slda",), ("slda", "--shrinkage", "oas"), ("fecam",),
                                  ("balanced", "--projection-dim", "24", "--gamma", "0.5")], ids=" ".join)
def test_learn_head_on_si_blurry_equals_the_hand_computation(store, tmp_path, args):
    out = tmp_path / "run"
    result = invoke("learn", "--features", store, "--out", out, "--head", *args, *BLURRY)
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stream"] == "si-blurry" and metrics["head"] == args[0]
    stream = stream_of(store, metrics)
    reference = reference_for(args, load_file(str(out / "model.safetensors")))
    matrix, F = by_hand(store, stream, reference)
    assert np.allclose(np.concatenate(metrics["accuracy_matrix"]), np.concatenate(matrix), rtol=0, atol=1e-12)
    steps = [row[-1] for row in matrix]
    assert metrics["A_steps"] == pytest.approx(steps, abs=1e-12)
    assert metrics["A_avg"] == pytest.approx(np.mean(steps), abs=1e-12)
    assert metrics["A_last"] == pytest.approx(steps[-1], abs=1e-12) and 0.3 < steps[-1] < 1.0
    assert metrics["F"] == pytest.approx(F, abs=1e-12)


def test_learn_dual_on_si_blurry_equals_the_published_recursion(store, tmp_path):
    out = tmp_path / "run"
    result = invoke("learn", "--features", store, "--out", out, "--head", "dual", "--projection-dim", "24",
                    "--compensation", "0.7", *BLURRY)
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    stream = stream_of(store, metrics)
    P = load_file(str(out / "model.safetensors"))["projection"].astype(np.float64)
    x, y, xt, _ = (a.astype(np.float64) if a.dtype.kind == "f" else a for a in read(store))
    models = dsal_published([(x[r] @ P, y[r]) for r in stream.rows], 1.0, 1.0, 0.7, 10, "task")

    def reference(X, y_seen, T):  # the published model at the task end whose rows these are
        classes, scores = models[next(k for k, r in enumerate(stream.rows) if sum(s.size for s in stream.rows[:k + 1])
                                      == y_seen.size)]
        return classes, scores(T @ P)

    matrix, F = by_hand(store, stream, reference)
    assert np.allclose(np.concatenate(metrics["accuracy_matrix"]), np.concatenate(matrix), rtol=0, atol=1e-12)
    assert metrics["F"] == pytest.approx(F, abs=1e-12)
    assert metrics["A_last"] == pytest.approx(matrix[-1][-1], abs=1e-12)


def test_sweep_heads_on_si_blurry_equal_learn_and_same_seed_same_bytes(store, tmp_path):
    args = ("--heads", "ridge,ncm,slda,fecam,balanced,dual", "--gammas", "0.5", "--no-loo", "--projection-dim", "24",
            *BLURRY)
    for run in ("a", "b"):
        result = invoke("sweep", "--features", store, "--out", tmp_path / run, *args)
        assert result.exit_code == 0, result.output
    assert (tmp_path / "a" / "sweep.json").read_bytes() == (tmp_path / "b" / "sweep.json").read_bytes()
    heads = json.loads((tmp_path / "a" / "sweep.json").read_text())["heads"]
    for name in ("ridge", "ncm", "fecam", "balanced", "dual"):
        extra = () if name in ("ncm", "fecam") else ("--gamma", "0.5", "--projection-dim", "24")
        result = invoke("learn", "--features", store, "--out", tmp_path / name, *(("--head", name) if name != "ridge"
                                                                                    else ()), *extra, *BLURRY)
        assert result.exit_code == 0, result.output
        one = json.loads((tmp_path / name / "metrics.json").read_text())
        for key in ("accuracy_matrix", "A_steps", "A_avg", "A_last", "F"):
            assert heads[name][key] == one[key], (name, key)
    result = invoke("learn", "--features", store, "--out", tmp_path / "c", "--head", "ncm", *BLURRY)
    for file in ("metrics.json", "model.safetensors"):
        assert (tmp_path / "c" / file).read_bytes() == (tmp_path / "ncm" / file).read_bytes()


@pytest.mark.parametrize("args", [("learn", "--head", "dual", "--stream", "si-blurry", "--eval-every", "100"),
                                  ("learn", "--head", "dual", "--eval-every", "100")], ids=" ".join)
def test_anytime_points_with_dual_are_refused_in_one_line(store, tmp_path, args):
    out = tmp_path / "out"
    result = invoke(*args, "--features", store, "--out", out, "--tasks", 3, "--backend", "numpy")
    assert_clean_error(result, "drop --eval-every", out)


def test_continuing_a_head_model_on_si_blurry_is_refused_in_one_line(store, tmp_path):
    assert invoke("learn", "--features", store, "--out", tmp_path / "first", "--head", "ncm", *BLURRY).exit_code == 0
    out = tmp_path / "out"
    result = invoke("learn", "--features", store, "--out", out, "--init-model", tmp_path / "first" / "model.safetensors",
                    "--stream", "si-blurry", "--tasks", "4", "--order-seed", "4", "--backend", "numpy")
    assert_clean_error(result, "continues a model over disjoint tasks scored at their ends; leave out --stream si-blurry",
                       out)
