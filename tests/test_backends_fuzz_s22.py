"""`learn`, `sweep` and the Python estimators on ``--backend numpy`` against ``--backend torch`` (on the CPU here), over
random small stores and options.

What must agree, by the documents: in float64 the accuracy matrices, the chosen gammas and every other recorded
number but the criteria's curves exactly (one code path, docs/gpu.md "Array backends"), the model tensors to 1e-9 of
their largest entry (the same page: "compares with NumPy to 1e-9 in float64"), the GCV curve to its reported
resolution (``RSS_RESOLUTION``, docs/gamma.md) and LOO MSE to 1e-9. In float32 each backend's sums round in their own
order: the weights lie within ``DRIFTS["float32"]`` of float64's on each (docs/learn.md, float32), so within twice it
of each other, and the accuracy matrices within 0.01 (docs/heads.md, Tolerance). A model saved by one backend predicts
the same classes loaded with either. A refusal on one backend is the same refusal on the other, except a drift check at
its limit, which each backend measures on its own weights (the one that passes has weights within the limit).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import blob_store, invoke
from safetensors.numpy import load_file

from foal_pipe import AnalyticClassifier, FoalPipeError, head_classifier, load_model
from foal_pipe.core.drift import DRIFTS
from foal_pipe.core.gammapath import RSS_RESOLUTION

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")

HEADS = ("ridge", "ncm", "slda", "fecam", "cosine", "balanced", "dual")
PROJECTED = ("ridge", "balanced", "dual")
BLOCKS = 3
#: Keys whose values are bits of a backend's own rounding or of the run itself, not results.
UNCOMPARED = {"backend", "timings", "model_checksum"}
#: The criteria's curves, compared to their resolution rather than exactly.
CURVES = {"gcv", "loo_mse", "values"}
#: What float32 runs may choose differently: the searches and their choices (their accuracies are compared).
FLOAT32_CHOICES = ("gamma_search", "selections", "best_gamma", "gammas_selected", "/results")
#: A refusal each backend decides on its own weights' measured drift (a threshold on a rounding they do not share).
DRIFT_LIMIT = ("rounding moved the weights by", "may move the weights by")


def make_store(path: Path, rng: np.random.Generator) -> Path:
    """Gaussian blobs (:func:`helpers.blob_store`), 3-10 classes of uneven sizes, 6-24 features, float16 or float32,
    with per-block tokens and a layer norm (for --fusion)."""
    n_classes, dim = int(rng.integers(3, 11)), int(rng.integers(6, 25))
    centres = rng.normal(size=(n_classes, dim)) * rng.uniform(0.5, 2.0)
    weights = rng.dirichlet(np.full(n_classes, 0.7))
    dtype = str(rng.choice(["float16", "float32"]))
    return blob_store(path, rng, centres, weights, dtype, (120, 300), (50, 120), (16, 100), True, BLOCKS)


def learn_args(rng: np.random.Generator) -> list[str]:
    """A random `learn` configuration: any head, fixed gammas or auto with each --select, rls, float32, class orders,
    --projection-dim 0 or more, activations, fusions, the si-blurry stream, --eval-every."""
    head = str(rng.choice(HEADS))
    args = ["--head", head, "--tasks", str(int(rng.integers(1, 4))), "--seed", str(int(rng.integers(50))),
            "--batch-size", str(int(rng.choice([1, 7, 10, 32])))]
    dim = int(rng.choice([0, 8, 24, 40])) if head in PROJECTED else int(rng.choice([0, 0, 8, 24]))
    if dim or head in PROJECTED:
        args += ["--projection-dim", str(dim)]
    if head != "dual" and rng.random() < 0.5:
        args += ["--activation", str(rng.choice(["sigmoid", "relu", "identity"] + (["cos"] if dim and head != "ridge" else [])))]
    auto = head == "ridge" and rng.random() < 0.5
    if head in PROJECTED:
        args += ["--gamma", "auto" if auto else str(rng.choice([0.05, 0.3, 1.0, 10.0]))]
    if auto:
        args += ["--select", str(rng.choice(["loo", "gcv", "loo_accuracy"]))]
        if args[-1] != "gcv" and rng.random() < 0.4:
            args += ["--loo-sample", str(int(rng.choice([0, 20, 60])))]
    if head == "ridge" and not auto and rng.random() < 0.3:
        args += ["--engine", "rls"]
    elif head == "ridge" and rng.random() < 0.3:
        args += ["--dtype", "float32"]
    if rng.random() < 0.4:
        args += ["--fusion", str(rng.choice(["mean-cls", "last", "mean:1-2", "concat:2-3"]))]
    stream = rng.random()
    if stream < 0.25:
        args += ["--order-seeds", ",".join(str(int(s)) for s in rng.choice(30, 2, replace=False))]
    elif stream < 0.45:
        args += ["--stream", "si-blurry"]
    if head not in ("dual", "fecam") and "--order-seeds" not in args and rng.random() < 0.3:
        args += ["--eval-every", str(int(rng.integers(40, 100)))]
    return args


def sweep_args(rng: np.random.Generator) -> list[str]:
    """A random `sweep`: listed gammas or the default grid, each --select, a sampled or exact leave-one-out, --no-loo,
    other heads beside ridge, class orders, float32, fusions."""
    args = ["--tasks", str(int(rng.integers(1, 4))), "--seed", str(int(rng.integers(50))),
            "--projection-dim", str(int(rng.choice([0, 8, 24, 40])))]
    if rng.random() < 0.4:
        args += ["--activation", str(rng.choice(["sigmoid", "relu", "identity"]))]
    if rng.random() < 0.2:
        args += ["--no-loo"]
    else:
        args += ["--select", str(rng.choice(["loo", "gcv", "loo_accuracy", "test"]))]
        if rng.random() < 0.4:
            args += ["--loo-sample", str(int(rng.choice([0, 20, 60])))]
    if rng.random() < 0.5:
        args += ["--gammas", "0.01,0.1,1,10,100"]
    if rng.random() < 0.3:
        args += ["--heads", "ridge,ncm,slda,cosine,balanced"]
    if rng.random() < 0.3:
        args += ["--order-seeds", "1,2"]
    if rng.random() < 0.25:
        args += ["--dtype", "float32"]
    if rng.random() < 0.3:
        args += ["--fusion", str(rng.choice(["mean-cls", "last", "concat:2-3"]))]
    return args


def differences(a: object, b: object, float32: bool, path: str = "", criterion: str = "") -> list[str]:
    """Where two records differ beyond what the documents allow (see the module's docstring); ``criterion``: that of
    the enclosing search, whose ``values`` are its curve."""
    key = path.rsplit("/", 1)[-1].split("[")[0]
    if float32 and any(part in path for part in FLOAT32_CHOICES) and "accuracy" not in path:
        return []  # float32 sums round differently on each backend: so may the criteria, and a choice among neighbours
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) - UNCOMPARED != set(b) - UNCOMPARED:
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        inner = str(a.get("criterion", criterion))
        return [d for k in sorted(set(a) - UNCOMPARED) for d in differences(a[k], b[k], float32, f"{path}/{k}", inner)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, float32, f"{path}[{i}]", criterion)]
    gcv = key == "gcv" or (key == "values" and criterion == "gcv")
    if float32 and isinstance(a, float) and isinstance(b, float):
        return [f"{path}: {a} vs {b}"] if "accuracy" in path and abs(a - b) > 0.01 else []
    if gcv and (a is None or b is None):  # at the edge of its resolution one backend may report it, the other not
        return []
    if (gcv or key in CURVES) and isinstance(a, float) and isinstance(b, float):
        return [] if abs(a - b) <= (RSS_RESOLUTION if gcv else 1e-9) * abs(a) else [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def assert_tensors_agree(numpy_file: Path, torch_file: Path, float32: bool) -> None:
    """Every tensor of the two model files: integers equal, floats within 1e-9 of the largest entry (float64) or, for
    float32 sums, the weights within twice ``DRIFTS["float32"]`` (Frobenius) and the sums within 1e-5."""
    ref, got = load_file(str(numpy_file)), load_file(str(torch_file))
    assert set(ref) == set(got)
    for name, expected in ref.items():
        if expected.dtype.kind not in "fc":
            np.testing.assert_array_equal(got[name], expected, err_msg=name)
            continue
        e, g = expected.astype(np.float64), got[name].astype(np.float64)
        if float32 and name == "W":
            assert np.linalg.norm(g - e) <= 2 * DRIFTS["float32"] * np.linalg.norm(e), name
        else:
            scale = max(float(np.abs(e).max(initial=0.0)), 1.0)
            assert float(np.abs(g - e).max(initial=0.0)) <= (1e-5 if float32 else 1e-9) * scale, name


def assert_cross_loaded_predictions_agree(store: Path, files: list[Path]) -> None:
    """A ridge model file loaded on either backend predicts the same classes of the store's test activations."""
    import zarr

    features = np.asarray(zarr.open_group(str(store), mode="r")["test/features"][:], dtype=np.float64)
    for path in files:
        rows = load_model(path).activations(features)
        on = {b: AnalyticClassifier.load(path, backend=b).predict(rows) for b in ("numpy", "torch")}
        np.testing.assert_array_equal(on["torch"], on["numpy"], err_msg=str(path))


def compare(tmp_path: Path, command: str, rng: np.random.Generator) -> None:
    store = make_store(tmp_path / "s.zarr", rng)
    args = learn_args(rng) if command == "learn" else sweep_args(rng)
    results = {b: invoke(command, "--features", store, "--out", tmp_path / b, "--backend", b, *args) for b in ("numpy", "torch")}
    where = f"{command} {' '.join(args)}"
    for b, result in results.items():
        assert result.exit_code in (0, 1) and "Traceback" not in result.output, f"{where} on {b}: {result.output}"
    if results["numpy"].exit_code or results["torch"].exit_code:
        lines = {b: r.output.strip().splitlines()[-1] for b, r in results.items() if r.exit_code}
        if len(lines) == 2:
            assert lines["numpy"] == lines["torch"], where
        else:
            assert any(limit in line for line in lines.values() for limit in DRIFT_LIMIT), f"{where}: only {lines}"
        return
    float32 = "float32" in args
    name = "metrics.json" if command == "learn" else "sweep.json"
    docs = {b: json.loads((tmp_path / b / name).read_text()) for b in results}
    assert docs["torch"]["backend"] == "torch" and docs["numpy"]["backend"] == "numpy"
    assert differences(docs["numpy"], docs["torch"], float32) == [], where
    if command == "learn":
        assert_tensors_agree(tmp_path / "numpy" / "model.safetensors", tmp_path / "torch" / "model.safetensors", float32)
        if args[1] == "ridge" and "--fusion" not in args:
            assert_cross_loaded_predictions_agree(store, [tmp_path / b / "model.safetensors" for b in results])


FAST_LEARN, FAST_SWEEP = (0, 2, 3, 4, 7, 9), (0, 2, 3)


@pytest.mark.parametrize("case", [c if c in FAST_LEARN else pytest.param(c, marks=pytest.mark.slow) for c in range(40)])
def test_learn_agrees_on_numpy_and_torch(tmp_path, case):
    compare(tmp_path, "learn", np.random.default_rng(15000 + case))


@pytest.mark.parametrize("case", [c if c in FAST_SWEEP else pytest.param(c, marks=pytest.mark.slow) for c in range(20)])
def test_sweep_agrees_on_numpy_and_torch(tmp_path, case):
    compare(tmp_path, "sweep", np.random.default_rng(16000 + case))


REFUSED = [  # each refused on NumPy (the reason in the last line); torch must refuse it alike
    ("learn", "--gamma", "1e-6", "--projection-dim", "40", "--dtype", "float32"),
    ("learn", "--engine", "rls", "--dtype", "float32"),
    ("learn", "--gamma", "auto", "--gamma-grid", "1e-7,1e-6", "--projection-dim", "400", "--select", "gcv"),
    ("sweep", "--gammas", "1e-5,1", "--projection-dim", "40", "--dtype", "float32"),
    ("learn", "--head", "dual", "--gamma", "1e-12", "--projection-dim", "40"),
    ("learn", "--gamma", "1e-9", "--projection-dim", "40", "--activation", "identity"),
    ("learn", "--gamma", "1e-9", "--projection-dim", "40", "--activation", "identity", "--engine", "rls"),
]


@pytest.mark.parametrize("command", REFUSED, ids=lambda c: " ".join(c))
def test_a_refusal_is_the_same_on_both_backends(tmp_path, command):
    store = make_store(tmp_path / "s.zarr", np.random.default_rng(3))
    lines = {}
    for b in ("numpy", "torch"):
        result = invoke(command[0], "--features", store, "--out", tmp_path / b, "--backend", b, "--tasks", 2, *command[1:])
        assert result.exit_code == 1 and "Traceback" not in result.output and not (tmp_path / b).exists(), result.output
        lines[b] = result.output.strip().splitlines()[-1]
    assert lines["numpy"].startswith("Error: ") and lines["torch"] == lines["numpy"]


def tensor_variants(X: np.ndarray) -> dict[str, object]:
    import torch

    return {"numpy": X, "float64 tensor": torch.as_tensor(X), "transposed tensor": torch.as_tensor(np.ascontiguousarray(X.T)).T,
            "tensor requiring grad": torch.as_tensor(X).requires_grad_()}


@pytest.mark.parametrize("case", range(12))
def test_analytic_classifier_agrees_on_numpy_and_torch_and_on_tensors(case):
    """Random shapes, chunks, gammas (auto too) and engines: the weights within 1e-9 of the largest on both backends,
    whether the rows come as NumPy arrays or torch tensors, the same predictions, and each saved state predicting the
    same loaded on either backend."""
    rng = np.random.default_rng(case)
    n, d, C = int(rng.integers(20, 120)), int(rng.integers(1, 25)), int(rng.integers(1, 6))
    X, y, T = rng.normal(size=(n, d)), rng.integers(0, C, n), rng.normal(size=(15, d))
    gamma = rng.choice(["auto", "0.01", "0.5", "10"])
    gamma = "auto" if gamma == "auto" else float(gamma)
    engine = "rls" if gamma != "auto" and rng.random() < 0.4 else "gram"
    cuts = np.sort(rng.choice(np.arange(1, n), int(rng.integers(0, 4)), replace=False))
    ref = AnalyticClassifier(gamma=gamma, engine=engine, backend="numpy")
    for Xc, yc in zip(np.split(X, cuts), np.split(y, cuts), strict=True):
        ref.partial_fit(Xc, yc)
    scale = max(float(np.abs(ref.weights_).max()), 1.0)
    for backend in ("numpy", "torch"):
        for kind, rows in tensor_variants(X).items():
            model = AnalyticClassifier(gamma=gamma, engine=engine, backend=backend)
            for lo, hi in zip([0, *cuts], [*cuts, n], strict=True):
                model.partial_fit(rows[lo:hi], y[lo:hi])
            assert model.gamma_ == ref.gamma_, (backend, kind)
            assert float(np.abs(model.weights_ - ref.weights_).max()) <= 1e-9 * scale, (backend, kind)
            np.testing.assert_array_equal(model.predict(tensor_variants(T)[kind]), ref.predict(T))


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_saved_state_predicts_alike_loaded_on_either_backend(tmp_path, backend):
    rng = np.random.default_rng(7)
    X, y, T = rng.normal(size=(90, 12)), rng.integers(0, 4, 90), rng.normal(size=(40, 12))
    path = tmp_path / "state.safetensors"
    AnalyticClassifier(gamma=0.3, backend=backend).fit(X, y).save(path)
    loaded = {b: AnalyticClassifier.load(path, backend=b) for b in ("numpy", "torch")}
    np.testing.assert_array_equal(loaded["torch"].predict(T), loaded["numpy"].predict(T))
    W = np.linalg.solve(X.T @ X + 0.3 * np.eye(12), X.T @ (y[:, None] == np.arange(4)))
    np.testing.assert_allclose(loaded["torch"].weights_, W, rtol=0, atol=1e-9 * np.abs(W).max())


@pytest.mark.parametrize("head", HEADS)
def test_head_estimators_take_torch_tensors_as_numpy_arrays(head):
    """A head estimator given torch tensors (float64, a transposed view, one requiring grad) scores as given the same
    values as a NumPy array, to 1e-12 of the largest score."""
    import torch

    rng = np.random.default_rng(HEADS.index(head))
    y = rng.integers(0, 4, 80)
    X, T = rng.normal(size=(80, 6)) + y[:, None], rng.normal(size=(20, 6))
    ref = head_classifier(head).fit(X, y).class_scores(T)
    for kind, rows in tensor_variants(X).items():
        got = head_classifier(head).fit(rows, torch.as_tensor(y)).class_scores(tensor_variants(T)[kind])
        np.testing.assert_allclose(np.asarray(got), ref, rtol=0, atol=1e-12 * np.abs(ref).max(), err_msg=kind)


def test_an_unresolvable_gamma_is_refused_by_the_estimator_on_both_backends():
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(40, 6)) * 1e3, rng.integers(0, 3, 40)
    messages = set()
    for backend in ("numpy", "torch"):
        with pytest.raises(FoalPipeError, match="below the resolution") as refused:
            AnalyticClassifier(gamma=1e-12, backend=backend).fit(X, y).predict(X)
        messages.add(str(refused.value))
    assert len(messages) == 1
