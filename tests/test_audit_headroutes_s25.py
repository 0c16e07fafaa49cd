"""Audit s25: every route to the same head gives the same numbers.

Pairs checked and found to agree (scratch runs under /tmp, not kept here, most already covered by the s22 fuzz tests):
`learn --head H` against `sweep --heads ridge,...,H` (disjoint, Si-Blurry with --order-seeds, --dtype float32) and
against `table` cells (both streams, 2 task counts x 2 orders, balanced and dual at ridge's chosen gamma);
`--order-seeds 0,1` against separate `--order-seed` runs (every head, with --drop-last, --drop-remainder, Si-Blurry,
float32, --head-rows activations, --eval-every); `--scheduler dask` (threads cluster) against local, bytes equal (every
head, Si-Blurry, float32, orders, activations incl. cos rows); float32 on a float32 store: the feature heads' bits
unchanged; `--head-rows activations` against the implied form, same bytes; `--head-option` against the named flags;
balanced on equal class counts and dual at `--compensation 0` against ridge's matrix; `--class-order pilot` against the
same tasks as a file; `DeployedModel.partial_fit` against `learn --init-model` (within 1e-9, float64); accuracy
matrices of ncm, cosine, slda, fecam (NumPy, float32, torch) against the closed forms written in NumPy; sweep's exact
leave-one-out accuracy of ncm, cosine, balanced and ridge against refitting without each row.

Kept here: the one disagreement found (dual's continuation refuses the batch size the docs say the model supplies)
and the one route no other test takes (the scikit-learn estimator, task by task, against `learn --head`'s model file).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import build_store, documented_stream, invoke, read
from safetensors.numpy import load_file

from foal_pipe.store import write_store


def _ok(*args):
    result = invoke(*map(str, args))
    assert result.exit_code == 0, result.output
    return result


def _two_stores(root: Path) -> tuple[Path, Path]:
    """Store A: classes k0-k2; store B: classes k3-k5 (new names); 30 train and 8 test rows a class, 10 features."""
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(6, 10)) * 2

    def rows(classes: list[int], n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.permutation(np.repeat(classes, n))
        return (centres[y] + rng.normal(size=(y.size, 10))).astype(np.float32), y

    names = [f"k{c}" for c in range(6)]
    (xa, ya), (ta, sa), (xb, yb), (tb, sb) = rows([0, 1, 2], 30), rows([0, 1, 2], 8), rows([3, 4, 5], 30), rows([3, 4, 5], 8)
    a = write_store(root / "a.zarr", (xa, ya), (ta, sa), names[:3], chunk_rows=16)
    b = write_store(root / "b.zarr", (xb, yb - 3), (tb, sb - 3), names[3:], chunk_rows=16)
    return a, b


def test_dual_continuation_takes_its_batch_size_from_the_model(tmp_path):
    """docs/heads.md (A head's model file): "The head, its options, the projection and dual's batch size come from the
    model; a typed `--head`, head option, `--gamma`, `--projection-dim` or `--activation` that differs is refused, as
    is another `--batch-size` with dual." A dual model learnt with --batch-size 7 and continued with no --batch-size
    typed was refused ("the model's dual recursion ran on mini-batches of 7 rows; pass --batch-size 7"): learn's
    default 10 was taken as asked for, while gamma and the projection are taken from the model untyped. It now
    continues on the model's batches, equal to the continuation that types --batch-size 7."""
    a, b = _two_stores(tmp_path)
    _ok("learn", "--features", a, "--out", tmp_path / "a", "--tasks", 2, "--head", "dual", "--projection-dim", 24,
        "--gamma", 2, "--batch-size", 7, "--seed", 1)
    model = tmp_path / "a" / "model.safetensors"
    _ok("learn", "--init-model", model, "--features", b, "--out", tmp_path / "typed", "--tasks", 1, "--batch-size", 7)
    result = invoke("learn", "--init-model", str(model), "--features", str(b), "--out", str(tmp_path / "untyped"),
                    "--tasks", "1")
    assert result.exit_code == 0, f"dual's batch size should come from the model: {result.output}"
    typed, untyped = tmp_path / "typed", tmp_path / "untyped"
    assert (untyped / "model.safetensors").read_bytes() == (typed / "model.safetensors").read_bytes()
    assert json.loads((untyped / "metrics.json").read_text())["accuracy_matrix"] == \
        json.loads((typed / "metrics.json").read_text())["accuracy_matrix"]


def test_dual_continuation_still_refuses_a_typed_other_batch_size(tmp_path):
    """The other half of the same sentence (keeps the fix honest): a typed --batch-size other than the model's is
    refused in one line naming the model's, and nothing is written."""
    a, b = _two_stores(tmp_path)
    _ok("learn", "--features", a, "--out", tmp_path / "a", "--tasks", 2, "--head", "dual", "--projection-dim", 24,
        "--batch-size", 7)
    result = invoke("learn", "--init-model", str(tmp_path / "a" / "model.safetensors"), "--features", str(b), "--out",
                    str(tmp_path / "c"), "--tasks", "1", "--batch-size", "10")
    assert result.exit_code == 1 and "--batch-size 7" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "c").exists()


# --- the scikit-learn estimator against learn --head ------------------------------------------------------------
SEED, BATCH = 5, 7
HEADS = ("ncm", "slda", "fecam", "balanced", "dual", "cosine")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """300 train rows of 6 overlapping classes in 10 features (helpers.build_store), chunks of 40 rows."""
    return build_store(tmp_path_factory.mktemp("headroutes25") / "s.zarr", n_train=300, n_test=120, n_classes=6,
                       train_dim=10, test_dim=10, chunk=40)


@pytest.mark.parametrize("head", HEADS)
def test_the_estimator_task_by_task_equals_learn_heads_model(store, tmp_path, head):
    """docs/python-api.md: `head_classifier(H).partial_fit` (one task a call) is exact over every row so far;
    docs/heads.md: `learn --head H` writes the head after the last task. Fed the stream's tasks in learn's stream order
    (dual at learn's --batch-size; balanced and dual on the model's projection), the estimator predicts the test rows
    as the model file does, its scores within 1e-12 of the largest and its statistics equal to rounding. No other test
    takes the estimator against the command line's model."""
    from foal_pipe import head_classifier, load_model

    X, y, T, _ = (np.asarray(a, dtype=np.float64) if i % 2 == 0 else a for i, a in enumerate(read(store)))
    projected = ["--projection-dim", 24] if head in ("balanced", "dual") else []
    _ok("learn", "--features", store, "--out", tmp_path, "--tasks", 3, "--batch-size", BATCH, "--seed", SEED,
        "--backend", "numpy", "--head", head, *projected)
    tasks, rows = documented_stream(y, 6, 3, SEED)
    assert json.loads((tmp_path / "metrics.json").read_text())["tasks"] == tasks
    tensors = load_file(str(tmp_path / "model.safetensors"))
    P = tensors.get("projection")
    space = {"balanced": lambda A: 1 / (1 + np.exp(-(A @ P))), "dual": lambda A: A @ P}.get(head, lambda A: A)
    estimator = head_classifier(head, **({"batch_size": BATCH} if head == "dual" else {}))
    for idx in rows:
        estimator.partial_fit(space(X[idx]), y[idx])
    deployed = load_model(tmp_path / "model.safetensors")
    np.testing.assert_array_equal(estimator.predict(space(T)), deployed.predict(T))
    columns = [list(estimator.classes_).index(c) for c in tensors["classes"]]
    mine, theirs = estimator.class_scores(space(T))[:, columns], deployed.scores(T)
    assert np.abs(mine - theirs).max() <= 1e-12 * np.abs(theirs).max()
    state = estimator.__getstate__()["_tensors"]
    by_label = [[label for label, i in estimator._ids.items() if i == c][0] for c in state["classes"]]
    order = [by_label.index(c) for c in tensors["classes"]]
    for key in ("counts", "means", "prototypes", "W", "W_main", "W_comp"):
        if key in tensors:
            got = np.take(state[key], order, axis=0 if state[key].ndim == 1 or key in ("means", "prototypes") else 1)
            assert np.abs(got - tensors[key]).max() <= 1e-12 * np.abs(tensors[key]).max(), key
