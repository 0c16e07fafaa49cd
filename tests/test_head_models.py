"""Every head's model file: ``learn --head`` writes it, ``load_model`` and ``predict`` give the run's own predictions,
``learn --init-model`` continues it exactly, bad files are refused in one line, ridge's file is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import array_api_compat.numpy as xp
import numpy as np
import pytest
from helpers import assert_one_line_error, build_store, invoke, read, ref_cosine, ref_fecam, ref_ncm, ref_slda
from safetensors.numpy import load_file, save_file

from foal_pipe.errors import FoalPipeError
from foal_pipe.heads import HEADS, make_head
from foal_pipe.heads.state import export_head
from foal_pipe.model.deploy import load_model
from foal_pipe.model.headmodel import HeadClassifier
from foal_pipe.model.modelfile import read_model, validate_model, write_model
from foal_pipe.model.predict import predict_split
from foal_pipe.model.projection import SmoothProjection
from foal_pipe.protocol.stream import build_stream
from foal_pipe.store import write_store
from foal_pipe.store.integrity import compute_generation

DATA = Path(__file__).parent / "data"
#: Each head's ``learn`` options beyond the store (balanced and dual take the projection).
ARGS = {"ncm": (), "slda": ("--shrinkage", "0.25"), "fecam": ("--shrinkage", "0.5", "--shrinkage-offdiag", "0.3"),
        "balanced": ("--projection-dim", "24", "--gamma", "0.5"),
        "dual": ("--projection-dim", "24", "--gamma", "0.5", "--compensation", "0.7", "--batch-size", "7"),
        "cosine": ()}
REFERENCES = {"ncm": ref_ncm, "slda": lambda X, y, T: ref_slda(X, y, T, 0.25),
              "fecam": lambda X, y, T: ref_fecam(X, y, T, 0.5, 0.3), "cosine": ref_cosine}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every head learned on one store (4 tasks)."""
    tmp = tmp_path_factory.mktemp("headmodels")
    store = build_store(tmp / "blobs.zarr")
    for name, args in ARGS.items():
        result = invoke("learn", "--features", store, "--out", tmp / name, "--head", name, *args, "--tasks", 4,
                        "--seed", 2, "--backend", "numpy")
        assert result.exit_code == 0, result.output
    return tmp, store


def unambiguous(scores):
    top2 = np.sort(scores, axis=1)[:, -2:]
    assert ((top2[:, 1] - top2[:, 0]) > 1e-9 * np.abs(scores).max()).all(), "a near-tie: pick another seed"


@pytest.mark.parametrize("name", list(ARGS))
def test_round_trip_predicts_the_runs_test_predictions(runs, name):
    tmp, store = runs
    path = tmp / name / "model.safetensors"
    metrics = json.loads((tmp / name / "metrics.json").read_text())
    _, meta = read_model(path)
    assert meta["head"] == name and meta["format_version"] == 3
    assert {k: v for k, v in meta["head_options"].items() if k != "batch_size"} == metrics["head_options"]
    predictions = predict_split(path, store)
    # the run's own accuracy of its last model on every task's test rows, from the file's predictions
    hits = predictions.predicted == predictions.true
    last = [float(hits[np.isin(predictions.true, task)].mean()) for task in metrics["tasks"]]
    assert last == metrics["accuracy_matrix"][-1]
    deployed = load_model(path)
    assert isinstance(deployed.classifier, HeadClassifier) and deployed.classifier.name == name
    assert deployed.class_names == [f"c{i}" for i in range(12)]
    # the head fitted here on the same rows (any order: ncm, slda, fecam, balanced; dual: a stream recursion,
    # compared through the run's accuracies above and its continuation below)
    x, y, xt, _ = (a.astype(np.float64) if a.dtype.kind == "f" else a for a in read(store))
    if name != "dual":
        head = make_head(name, meta["head_options"], xp, deployed.rows(x[:1]).shape[1])
        head.add(deployed.rows(x), y)
        scorer = head.boundary()
        np.testing.assert_allclose(deployed.scores(xt), scorer.scores(deployed.rows(xt)), rtol=1e-9, atol=1e-9)
        assert (deployed.predict(xt) == scorer.classes[np.argmax(scorer.scores(deployed.rows(xt)), axis=1)]).all()
    if name in REFERENCES:  # an independent float64 computation of the definition on every train row
        classes, expected = REFERENCES[name](x, y, xt)
        unambiguous(expected)
        assert (deployed.predict(xt) == classes[expected.argmax(axis=1)]).all()
        assert (predictions.predicted == classes[expected.argmax(axis=1)]).all()


@pytest.mark.parametrize("name", list(ARGS))
def test_a_loaded_head_model_saves_the_same_bytes(runs, tmp_path, name):
    tmp, _ = runs
    path = tmp / name / "model.safetensors"
    load_model(path).save(tmp_path / "again.safetensors")
    assert (tmp_path / "again.safetensors").read_bytes() == path.read_bytes()


@pytest.mark.parametrize("name", ["fecam", "dual"])
def test_same_command_twice_gives_the_same_model_bytes(runs, tmp_path, name):
    tmp, store = runs
    result = invoke("learn", "--features", store, "--out", tmp_path / "again", "--head", name, *ARGS[name],
                    "--tasks", 4, "--seed", 2, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (tmp / name / "model.safetensors").read_bytes()


def test_predict_cli_and_probabilities(runs, tmp_path):
    tmp, store = runs
    for name in ARGS:
        out = tmp_path / f"{name}.csv"
        result = invoke("predict", "--model", tmp / name / "model.safetensors", "--features", store, "--out", out)
        assert result.exit_code == 0, result.output
        rows = out.read_text().splitlines()
        assert rows[0].startswith("row,predicted_class") and len(rows) == 241
    x = read(store)[2].astype(np.float64)
    slda = load_model(tmp / "slda" / "model.safetensors")
    scores = slda.scores(x)
    expected = np.exp(scores - scores.max(axis=1, keepdims=True))
    np.testing.assert_allclose(slda.predict_proba(x), expected / expected.sum(axis=1, keepdims=True), rtol=1e-12)
    balanced = load_model(tmp / "balanced" / "model.safetensors")
    shares = np.clip(balanced.scores(x), 0, None)
    np.testing.assert_allclose(balanced.predict_proba(x), shares / shares.sum(axis=1, keepdims=True), rtol=1e-12)
    for name in ("ncm", "fecam", "cosine"):
        with pytest.raises(FoalPipeError, match=f"the {name} head's scores are distances or cosines, not probabilities"):
            load_model(tmp / name / "model.safetensors").predict_proba(x)


# --- continuing ---------------------------------------------------------------------------------------------------

def _rows(rng, n, d, classes):
    y = np.repeat(np.asarray(classes), n)
    return rng.normal(size=(y.size, d)) + y[:, None] * 0.4 + 0.1 * rng.normal(size=(y.size, 1)), y


@pytest.mark.parametrize("name", list(ARGS))
def test_continued_head_equals_the_head_on_both_streams_in_order(tmp_path, name):
    """A head saved after stream 1, loaded and given stream 2 equals, bit for bit, one head given both streams."""
    rng = np.random.default_rng(1)
    d = 6
    x1, y1 = _rows(rng, 9, d, [0, 2, 3])
    x2, y2 = _rows(rng, 8, d, [1, 2, 5])
    perm1, perm2 = rng.permutation(y1.size), rng.permutation(y2.size)
    x1, y1, x2, y2 = x1[perm1], y1[perm1], x2[perm2], y2[perm2]
    options = {"ncm": {}, "slda": {"shrinkage": "oas"}, "fecam": {"shrinkage": 0.5, "shrinkage_offdiag": 0.3},
               "balanced": {"gamma": 0.5}, "dual": {"gamma": 0.5, "gamma_comp": 2.0, "compensation": 0.7,
                                                    "batch_size": 4}, "cosine": {}}[name]
    if HEADS[name].space != "features":
        x1, x2 = np.tanh(x1), np.tanh(x2)
    one = make_head(name, options, xp, d)
    one.add(x1[:10], y1[:10])
    one.add(x1[10:], y1[10:])
    first = one.boundary()
    path = tmp_path / "m.safetensors"
    identity = SmoothProjection(n_components=0, activation="identity").fit(x1)  # rows given as they are
    HeadClassifier(name, options, export_head(name, one, first), y1.size).save(path, projection=identity)
    model = load_model(path).classifier
    assert model.n_samples_seen_ == y1.size
    np.testing.assert_allclose(model.class_scores(x2), np.asarray(first.scores(x2)), rtol=1e-12, atol=1e-12)
    one.add(x2, y2)
    both = one.boundary()
    model.partial_fit(x2, y2)
    assert model.classes_.tolist() == both.classes.tolist() == [0, 1, 2, 3, 5]
    np.testing.assert_allclose(model.class_scores(x1), np.asarray(both.scores(x1)), rtol=1e-12, atol=1e-12)
    for key, value in export_head(name, one, both).items():
        np.testing.assert_array_equal(model.tensors[key], value, err_msg=key)


def _named_store(path, names, n_per_class, rng, d=8):
    y = np.repeat(np.arange(len(names)), n_per_class)
    x = rng.normal(size=(y.size, d)) + y[:, None] * 0.5
    return write_store(path, (x, y), (x[::3], y[::3]), list(names), chunk_rows=7, dtype="float64"), x, y


@pytest.mark.parametrize("name", ["ncm", "slda", "fecam", "cosine"])
def test_init_model_continues_a_head_exactly(tmp_path, name):
    """learn --init-model of a head's model on a store with known and new class names: the final model equals the
    head's definition on both stores' train rows (classes matched by name)."""
    rng = np.random.default_rng(0)
    a, xa, ya = _named_store(tmp_path / "a.zarr", ["cat", "dog", "emu", "fox"], 9, rng)
    b, xb, yb = _named_store(tmp_path / "b.zarr", ["gnu", "dog", "cat"], 8, rng)
    args = {"ncm": (), "slda": ("--shrinkage", "0.25"), "fecam": ("--shrinkage", "0.5"), "cosine": ()}[name]
    first = invoke("learn", "--features", a, "--out", tmp_path / "a", "--head", name, *args, "--tasks", 2)
    assert first.exit_code == 0, first.output
    result = invoke("learn", "--init-model", tmp_path / "a" / "model.safetensors", "--features", b, "--out",
                    tmp_path / "b", "--tasks", 3, "--eval-features", a)
    assert result.exit_code == 0, result.output
    model = load_model(tmp_path / "b" / "model.safetensors")
    assert model.class_names == ["cat", "dog", "emu", "fox", "gnu"]
    assert model.classifier.n_samples_seen_ == ya.size + yb.size
    merged = np.array([4, 1, 0])[yb]
    reference = {"ncm": ref_ncm, "slda": lambda X, y, T: ref_slda(X, y, T, 0.25),
                 "fecam": lambda X, y, T: ref_fecam(X, y, T, 0.5), "cosine": ref_cosine}[name]
    test = np.vstack([xa[::3], xb[::3]])
    classes, expected = reference(np.vstack([xa, xb]), np.concatenate([ya, merged]), test)
    unambiguous(expected)
    assert (model.predict(test) == classes[expected.argmax(axis=1)]).all()
    metrics = json.loads((tmp_path / "b" / "metrics.json").read_text())
    continued = metrics["continuation"]
    assert metrics["head"] == name and continued["init_model"].endswith("model.safetensors")
    assert continued["label_ids"] == {"gnu": 4, "dog": 1, "cat": 0}
    old = continued["eval_features"][0]
    assert old["accuracy"] == pytest.approx(float((model.predict(xa[::3]) == ya[::3]).mean()))


def test_init_model_of_a_head_refuses_what_it_fixes(tmp_path):
    rng = np.random.default_rng(0)
    a, _, _ = _named_store(tmp_path / "a.zarr", ["cat", "dog", "emu"], 6, rng)
    assert invoke("learn", "--features", a, "--out", tmp_path / "ncm", "--head", "ncm", "--tasks", 1).exit_code == 0
    assert invoke("learn", "--features", a, "--out", tmp_path / "dual", "--head", "dual", "--projection-dim", 8,
                  "--tasks", 1).exit_code == 0
    ncm, dual = tmp_path / "ncm" / "model.safetensors", tmp_path / "dual" / "model.safetensors"
    cases = [((ncm, "--head", "slda"), "--head slda conflicts with the model's ncm head"),
             ((ncm, "--shrinkage", "0.3"), "--shrinkage 0.3 conflicts with the model's ncm head (which does not take it)"),
             ((dual, "--batch-size", "5"), "pass --batch-size 10 to continue it exactly"),
             ((dual, "--gamma", "3"), "--gamma 3.0 conflicts with the model's dual head (its 1.0)")]
    for (model, *extra), message in cases:
        result = invoke("learn", "--init-model", model, "--features", a, "--out", tmp_path / "x", *extra)
        assert_one_line_error(result, message)
        assert not (tmp_path / "x").exists()
    ridge = invoke("learn", "--features", a, "--out", tmp_path / "ridge", "--projection-dim", 8, "--tasks", 1)
    assert ridge.exit_code == 0
    result = invoke("learn", "--init-model", tmp_path / "ridge" / "model.safetensors", "--features", a, "--out",
                    tmp_path / "x", "--head", "ncm")
    assert_one_line_error(result, "is a ridge model; --head ncm cannot continue it")


# --- strict validation ----------------------------------------------------------------------------------------------

def _edited(runs, tmp_path, name, tensors=None, meta=None):
    """The run's model file rewritten by the safetensors library with edited tensors or metadata (no foal-pipe
    checks on the way)."""
    tmp, _ = runs
    path = tmp / name / "model.safetensors"
    t = load_file(str(path))
    _, m = read_model(path)
    t = tensors(t) if tensors else t
    m = {k: v for k, v in (m | (meta or {})).items() if k != "checksum"}  # the checksum would fail first
    out = tmp_path / "bad.safetensors"
    save_file(t, str(out), metadata={k: json.dumps(v) for k, v in m.items()})
    return out


BAD = {
    "unknown head": ("ncm", None, {"head": "knn"}, "metadata 'head' ('knn') is not a head this foal-pipe stores"),
    "means shape": ("ncm", lambda t: {**t, "means": t["means"][:, :3]}, None,
                    "tensor 'sums' has shape (16, 12) but 'means' has d = 3"),
    "precision NaN": ("fecam", lambda t: {**t, "precisions": np.where(t["precisions"] > 0.5, np.nan, t["precisions"])},
                      None, "tensor 'precisions' holds NaN or inf"),
    "W float32": ("slda", lambda t: {**t, "W": t["W"].astype(np.float32)}, None,
                  "tensor 'W' is float32 but the slda head keeps float64"),
    "missing state": ("balanced", lambda t: {k: v for k, v in t.items() if k != "grams"}, None,
                      "the balanced head's tensor 'grams' is missing"),
    "stray tensor": ("dual", lambda t: {**t, "G": t["G_main"]}, None, "tensor 'G' does not belong to the dual head"),
    "no projection": ("dual", lambda t: {k: v for k, v in t.items() if k != "projection"}, None,
                      "the dual head's tensor 'projection' is missing"),
    "bad option": ("slda", None, {"head_options": {"shrinkage": 2.0}}, "holds a value the slda head refuses"),
    "missing option": ("dual", None, {"head_options": {"gamma": 1.0}}, "must map the dual head's options"),
    "counts": ("ncm", None, {"n_samples_seen": 5}, "the class row counts sum to 600 but 'n_samples_seen' is 5"),
    "dtype": ("ncm", None, {"dtype": "float16"}, "metadata 'dtype' ('float16') must be one of"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_head_model_files_are_refused_in_one_line(runs, tmp_path, case):
    name, tensors, meta, message = BAD[case]
    path = _edited(runs, tmp_path, name, tensors, meta)
    for load in (read_model, load_model):
        with pytest.raises(FoalPipeError) as info:
            load(path)
        assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
    result = invoke("predict", "--model", path, "--features", runs[1], "--out", tmp_path / "p.csv")
    assert_one_line_error(result, message)


def test_altered_head_model_fails_its_checksum_and_write_refuses_bad_tensors(runs, tmp_path):
    tmp, _ = runs
    data = bytearray((tmp / "ncm" / "model.safetensors").read_bytes())
    data[-3] ^= 1  # a bit of the last tensor (the largest element size first, then by name)
    path = tmp_path / "flipped.safetensors"
    path.write_bytes(bytes(data))
    with pytest.raises(FoalPipeError, match="does not match its checksum"):
        load_model(path)
    tensors, meta = read_model(tmp / "ncm" / "model.safetensors")
    meta = {k: v for k, v in meta.items() if k not in ("format", "format_version", "checksum")}
    with pytest.raises(FoalPipeError, match="holds NaN or inf"):
        write_model(tmp_path / "nan.safetensors", {**tensors, "means": tensors["means"] * np.nan}, meta)
    assert not (tmp_path / "nan.safetensors").exists()
    with pytest.raises(FoalPipeError, match="is not a head this foal-pipe stores"):
        validate_model(tensors, {**meta, "head": "ridge", "format": "foal-pipe/model", "format_version": 3})


# --- ridge ----------------------------------------------------------------------------------------------------------

def test_ridge_model_file_is_unchanged_and_an_old_file_predicts_as_before(tmp_path):
    """tests/data/ridge_v2_blobs.safetensors was written by foal-pipe before heads had model files (`learn` on
    helpers.build_store, 4 tasks, --projection-dim 8, --seed 2): today's learn writes the same file (the same header but
    the sums' rounding, recorded since, the same bytes of the projection, classes and counts, and the sums G and Q and
    the solve W within rounding of the old ones: BLAS products, whose last bits are the kernels' and so the CPU's, as
    OpenBLAS's Sandybridge kernels show on G), and the old file predicts what its tensors, read by the safetensors
    library, give."""
    store = build_store(tmp_path / "blobs.zarr")
    result = invoke("learn", "--features", store, "--out", tmp_path / "ridge", "--tasks", 4, "--projection-dim", 8,
                    "--seed", 2, "--backend", "numpy")
    assert result.exit_code == 0, result.output
    old = DATA / "ridge_v2_blobs.safetensors"
    new, tensors = load_file(str(tmp_path / "ridge" / "model.safetensors")), load_file(str(old))
    assert new.keys() == tensors.keys()
    header = [{k: v for k, v in read_model(path)[1].items() if k != "checksum"}
              for path in (tmp_path / "ridge" / "model.safetensors", old)]
    # since then, a store without a generation id (format 1) is recorded by its content, so the model can continue
    assert header[0].pop("learned_data") == ["content:" + compute_generation(store)] and "learned_data" not in header[1]
    # since the twenty-seventh stop, the gram sums' rounding (docs/model-file.md); the old file is read without it
    rounding, errors = header[0].pop("sums_rounding"), header[0].pop("sums_rounding_errors")
    assert rounding > 0 and len(errors) == 64 and "sums_rounding" not in header[1]
    assert len(header[0].pop("sums_rounding_diagonal")) == 8  # since the thirtieth stop, G's diagonal's rounding
    assert header[0] == header[1]
    for name in tensors:
        assert new[name].dtype == tensors[name].dtype
        if name in ("G", "Q", "W"):
            np.testing.assert_allclose(new[name], tensors[name], rtol=1e-12, atol=1e-14)
        else:
            np.testing.assert_array_equal(new[name], tensors[name])
    xt = read(store)[2].astype(np.float64)
    scores = (1 / (1 + np.exp(-(xt @ tensors["projection"])))) @ tensors["W"]
    deployed = load_model(old)
    assert not isinstance(deployed.classifier, HeadClassifier)
    np.testing.assert_allclose(deployed.scores(xt), scores, rtol=1e-12)
    assert (deployed.predict(xt) == tensors["classes"][scores.argmax(axis=1)]).all()


def test_init_model_continues_balanced_and_dual_as_their_definitions_on_both_stores(tmp_path):
    """learn --init-model: balanced's W equals AIR's re-weighted ridge written plainly on both stores' activations
    (classes matched by name); dual's weights equal one recursion over both stores' tasks."""
    rng = np.random.default_rng(0)
    a, xa, ya = _named_store(tmp_path / "a.zarr", ["cat", "dog", "emu", "fox"], 9, rng)
    b, xb, yb = _named_store(tmp_path / "b.zarr", ["gnu", "dog", "cat"], 8, rng)
    for name in ("balanced", "dual"):
        first = invoke("learn", "--features", a, "--out", tmp_path / f"{name}_a", "--head", name, "--projection-dim", 12,
                       "--gamma", 0.5, "--tasks", 2)
        assert first.exit_code == 0, first.output
        result = invoke("learn", "--init-model", tmp_path / f"{name}_a" / "model.safetensors", "--features", b,
                        "--out", tmp_path / f"{name}_b", "--tasks", 3)
        assert result.exit_code == 0, result.output
    model = load_model(tmp_path / "balanced_b" / "model.safetensors")
    H = model.projection.transform(np.vstack([xa, xb]))  # sigmoid(x P), the activations balanced takes
    y = np.concatenate([ya, np.array([4, 1, 0])[yb]])
    classes = np.unique(y)
    n = np.array([(y == c).sum() for c in classes], dtype=np.float64)
    w = (1 / n) * classes.size / (1 / n).sum()
    A = sum(w[k] * H[y == c].T @ H[y == c] for k, c in enumerate(classes)) + 0.5 * np.eye(H.shape[1])
    B = np.stack([w[k] * H[y == c].sum(axis=0) for k, c in enumerate(classes)], axis=1)
    np.testing.assert_allclose(model.classifier.tensors["W"], np.linalg.solve(A, B), rtol=1e-9, atol=1e-12)
    dual = load_model(tmp_path / "dual_b" / "model.safetensors")
    assert dual.class_names == ["cat", "dog", "emu", "fox", "gnu"] and dual.classifier.n_samples_seen_ == y.size
    # dual: one DualHead given store a's tasks, then store b's (ids matched by name), each task's rows in its stream
    # order, a boundary at every task end: the recursion the continued model must equal
    head = make_head("dual", {"gamma": 0.5, "batch_size": 10}, xp, 12)
    P = dual.projection.components_
    for x, labels, ids, tasks in ((xa, ya, np.arange(4), 2), (xb, yb, np.array([4, 1, 0]), 3)):
        for rows in build_stream(labels, int(labels.max()) + 1, tasks, 10, 0).rows:
            head.add(x[rows] @ P, ids[labels[rows]])
            scorer = head.boundary()
    for key in ("W_main", "W_comp"):
        np.testing.assert_allclose(dual.classifier.tensors[key], getattr(scorer, key), rtol=1e-9, atol=1e-12)


def test_deployed_head_learns_new_names_and_saves(runs, tmp_path):
    tmp, store = runs
    model = load_model(tmp / "ncm" / "model.safetensors")
    x = read(store)[0].astype(np.float64)[:10]
    model.partial_fit(x, ["zebra"] * 5 + ["c0"] * 5)
    assert model.class_names[-1] == "zebra" and model.classifier.classes_.tolist()[-1] == 12
    unit = x[:5] / np.linalg.norm(x[:5], axis=1, keepdims=True)
    np.testing.assert_allclose(model.classifier.tensors["means"][-1], unit.mean(axis=0), rtol=1e-12)
    model.save(tmp_path / "more.safetensors")
    again = load_model(tmp_path / "more.safetensors")
    assert again.class_names == model.class_names
    np.testing.assert_allclose(again.scores(x), model.scores(x), rtol=1e-12)  # the same means, laid out contiguously
    assert (again.predict(x) == model.predict(x)).all()
