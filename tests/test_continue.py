"""learn --init-model: a saved model continued on a new store equals one run over both streams."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from helpers import assert_one_line_error
from typer.testing import CliRunner

import foal_pipe
from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError
from foal_pipe.store import write_store
from foal_pipe.store.integrity import compute_generation

runner = CliRunner()


def store(path, names, n_per_class, rng, dim=8, encoder=None):
    y = np.repeat(np.arange(len(names)), n_per_class)
    x = rng.normal(size=(y.size, dim)) + y[:, None] * 0.3
    return write_store(path, (x, y), (x[::3], y[::3]), list(names), chunk_rows=7, dtype="float64",
                       encoder=encoder), x, y


def learn(*args):
    return runner.invoke(app, ["learn", *map(str, args)])


@pytest.fixture
def two_stores(tmp_path):
    rng = np.random.default_rng(0)
    a = store(tmp_path / "a.zarr", ["cat", "dog", "emu", "fox"], 9, rng)
    b = store(tmp_path / "b.zarr", ["gnu", "dog", "cat"], 8, rng)  # two known names in another order, one new
    first = learn("--features", a[0], "--out", tmp_path / "run_a", "--tasks", 2, "--projection-dim", 30, "--gamma", 0.5)
    assert first.exit_code == 0, first.output
    return tmp_path, a, b


def test_continuation_equals_one_run(two_stores):
    tmp_path, (a, xa, ya), (b, xb, yb) = two_stores
    result = learn("--init-model", tmp_path / "run_a" / "model.safetensors", "--features", b, "--out",
                   tmp_path / "run_b", "--tasks", 3, "--eval-features", a)
    assert result.exit_code == 0, result.output
    model = foal_pipe.load_model(tmp_path / "run_b" / "model.safetensors")
    assert model.class_names == ["cat", "dog", "emu", "fox", "gnu"]
    assert model.classifier.classes_.tolist() == [0, 1, 2, 3, 4]
    merged = np.array([4, 1, 0])[yb]  # gnu -> new id 4, dog -> 1, cat -> 0
    P = model.projection
    H = P.transform(np.vstack([xa, xb]))
    Y = np.eye(5)[np.concatenate([ya, merged])]
    W = np.linalg.solve(H.T @ H + 0.5 * np.eye(H.shape[1]), H.T @ Y)
    np.testing.assert_allclose(model.classifier.weights_, W, atol=1e-9)
    assert model.classifier.n_samples_seen_ == ya.size + yb.size
    metrics = json.loads((tmp_path / "run_b" / "metrics.json").read_text())
    old = metrics["continuation"]["eval_features"][0]
    H_old = P.transform(xa[::3])
    expected = float((np.argmax(H_old @ W, axis=1) == ya[::3]).mean())
    assert old["accuracy"] == pytest.approx(expected) and old["n_test"] == ya[::3].size
    assert len(metrics["accuracy_matrix"]) == 3


def test_conflicting_settings_refused(two_stores):
    tmp_path, (a, _, _), (b, _, _) = two_stores
    init = tmp_path / "run_a" / "model.safetensors"
    for option, value, fragment in (("--gamma", 2, "--gamma 2.0 conflicts"),
                                    ("--projection-dim", 40, "--projection-dim 40 conflicts"),
                                    ("--dtype", "float32", "--dtype float32 conflicts"),
                                    ("--seed", 3, "drop --seed"), ("--activation", "relu", "--activation relu")):
        result = learn("--init-model", init, "--features", b, "--out", tmp_path / "run_b", option, value)
        assert_one_line_error(result, fragment)
    assert not (tmp_path / "run_b").exists()
    same = learn("--init-model", init, "--features", b, "--out", tmp_path / "run_b", "--gamma", 0.5, "--tasks", 1)
    assert same.exit_code == 0, same.output


def test_store_from_another_encoder_refused(two_stores):
    tmp_path, _, _ = two_stores
    other, _, _ = store(tmp_path / "c.zarr", ["cat", "owl"], 6, np.random.default_rng(3),
                        encoder={"name": "pixels", "fusion": "none", "image_size": 0, "normalize": False})
    result = learn("--init-model", tmp_path / "run_a" / "model.safetensors", "--features", other, "--out",
                   tmp_path / "run_c", "--tasks", 1)
    assert_one_line_error(result, "the store's encoder is 'pixels', the model's 'synthetic'")
    assert not (tmp_path / "run_c").exists()


def test_model_from_another_tool_refused(two_stores, tmp_path):
    from safetensors.numpy import save_file

    _, _, (b, _, _) = two_stores
    save_file({"W": np.zeros((2, 2))}, str(tmp_path / "other.safetensors"))
    result = learn("--init-model", tmp_path / "other.safetensors", "--features", b, "--out", tmp_path / "run_x")
    assert_one_line_error(result, "another tool")
    assert not (tmp_path / "run_x").exists()


def test_continuation_with_dask_equals_local(two_stores):
    tmp_path, _, (b, _, _) = two_stores
    init = tmp_path / "run_a" / "model.safetensors"
    local = learn("--init-model", init, "--features", b, "--out", tmp_path / "local", "--tasks", 3)
    dask = learn("--init-model", init, "--features", b, "--out", tmp_path / "dask", "--tasks", 3,
                 "--scheduler", "dask", "--workers", 1)
    assert local.exit_code == 0 and dask.exit_code == 0, dask.output
    W = [foal_pipe.load_model(tmp_path / run / "model.safetensors").classifier.weights_ for run in ("local", "dask")]
    np.testing.assert_allclose(W[1], W[0], atol=1e-9)


def test_class_name_clash_refused(two_stores):
    """A store naming one class twice: write_store refuses to write it, and one whose attributes say so (edited)
    is refused by learn --init-model, before any output."""
    tmp_path, _, _ = two_stores
    with pytest.raises(FoalPipeError, match="'cat' twice: two label ids"):
        store(tmp_path / "refused.zarr", ["cat", "owl", "cat"], 5, np.random.default_rng(4))
    assert not (tmp_path / "refused.zarr").exists()
    clash, _, _ = store(tmp_path / "clash.zarr", ["cat", "owl", "eel"], 5, np.random.default_rng(4))
    group = zarr.open_group(str(clash), mode="r+")
    attrs = {k: v for k, v in dict(group.attrs).items() if k != "generation"} | {"classes": ["cat", "owl", "cat"]}
    group.attrs.put(attrs)
    group.attrs.put(attrs | {"generation": compute_generation(clash)})
    result = learn("--init-model", tmp_path / "run_a" / "model.safetensors", "--features", clash, "--out",
                   tmp_path / "run_c", "--tasks", 1)
    assert_one_line_error(result, "'cat'", "two label ids")
    assert not (tmp_path / "run_c").exists()


def _learned_from(path) -> list[str]:
    from foal_pipe.model.modelfile import read_model

    return read_model(path)[1]["learned_from"]


@pytest.mark.parametrize("head", ["ridge", "ncm"])
def test_the_rows_a_model_has_learned_are_refused(two_stores, head):
    """A model records the stores it learned (their generation ids); continuing it on one of them, or on a copy,
    would count every row twice and is refused before any work. A continued model has learned both stores."""
    import shutil

    from foal_pipe.store import open_store

    tmp_path, (a, _, _), (b, _, _) = two_stores
    generation = {store: open_store(store).meta.generation for store in (a, b)}
    assert all(generation.values()) and generation[a] != generation[b]
    first = tmp_path / "run_a" / "model.safetensors"
    if head != "ridge":
        first = tmp_path / "head_a" / "model.safetensors"
        assert learn("--features", a, "--out", first.parent, "--tasks", 2, "--head", head).exit_code == 0
    assert _learned_from(first) == [generation[a]]
    copy = tmp_path / "copy.zarr"
    shutil.copytree(a, copy)
    for features in (a, copy):
        result = learn("--init-model", first, "--features", features, "--out", tmp_path / "again", "--tasks", 1)
        assert_one_line_error(result, f"{first} has already learned the training rows of {features}",
                              "count every row twice")
        assert not (tmp_path / "again").exists()
    result = learn("--init-model", first, "--features", b, "--out", tmp_path / "run_b", "--tasks", 1)
    assert result.exit_code == 0, result.output
    assert _learned_from(tmp_path / "run_b" / "model.safetensors") == [generation[a], generation[b]]
    for features in (a, b):
        result = learn("--init-model", tmp_path / "run_b" / "model.safetensors", "--features", features, "--out",
                       tmp_path / "again", "--tasks", 1)
        assert_one_line_error(result, "has already learned the training rows", "count every row twice")


@pytest.mark.parametrize("head", ["ridge", "ncm"])
def test_every_class_seen_is_scored_after_a_continuation(two_stores, head):
    """``all_classes``: the final model's accuracy over the test rows of both stores (A_last over every class
    seen), per task of the new store and for the old store, equals the count of its own predictions here."""
    tmp_path, (a, xa, ya), (b, xb, yb) = two_stores
    first = tmp_path / "run_a" / "model.safetensors"
    if head != "ridge":
        first = tmp_path / "head_a" / "model.safetensors"
        assert learn("--features", a, "--out", first.parent, "--tasks", 2, "--head", head).exit_code == 0
    out = tmp_path / "run_b"
    result = learn("--init-model", first, "--features", b, "--out", out, "--tasks", 2, "--eval-features", a)
    assert result.exit_code == 0, result.output
    model = foal_pipe.load_model(out / "model.safetensors")
    ids = dict(zip(model.class_names, model.classifier.classes_.tolist()))
    names_a, names_b = ["cat", "dog", "emu", "fox"], ["gnu", "dog", "cat"]
    hits_a = model.predict(xa[::3]) == np.array([ids[n] for n in names_a])[ya[::3]]
    hits_b = model.predict(xb[::3]) == np.array([ids[n] for n in names_b])[yb[::3]]
    metrics = json.loads((out / "metrics.json").read_text())
    everything = metrics["continuation"]["all_classes"]
    expected = (hits_a.sum() + hits_b.sum()) / (hits_a.size + hits_b.size)
    assert everything["A_last"] == pytest.approx(expected)
    assert everything["n_test"] == hits_a.size + hits_b.size == 12 + 8
    parts = {p["task"]: p for p in everything["tasks"]}
    assert list(parts) == ["T1", "T2", "eval"]
    for t, names in enumerate(metrics["continuation"]["task_names"]):
        rows = np.isin(np.array(names_b)[yb[::3]], names)
        assert parts[f"T{t + 1}"]["n_test"] == rows.sum()
        assert parts[f"T{t + 1}"]["accuracy"] == pytest.approx(hits_b[rows].mean())
        assert parts[f"T{t + 1}"]["features"] == str(b)
    assert parts["T2"]["accuracy"] == pytest.approx(metrics["accuracy_matrix"][-1][-1])
    assert parts["eval"] == {"task": "eval", "features": str(a), "n_test": 12, "accuracy": pytest.approx(hits_a.mean())}
    assert f"every class seen: A_last {100 * expected:.2f} over 20 test rows" in result.output


def test_metrics_without_all_classes_still_read(two_stores):
    """A continuation's metrics.json written before ``all_classes`` came reads as it is, and writes back the same."""
    from foal_pipe.protocol.schema import LearnMetrics

    tmp_path, (a, _, _), (b, _, _) = two_stores
    out = tmp_path / "run_b"
    assert learn("--init-model", tmp_path / "run_a" / "model.safetensors", "--features", b, "--out", out,
                 "--tasks", 2, "--eval-features", a).exit_code == 0
    data = json.loads((out / "metrics.json").read_text())
    del data["continuation"]["all_classes"]
    metrics = LearnMetrics.from_dict(data, "metrics.json")
    assert metrics.continuation.all_classes is None and metrics.continuation.eval_features[0].features == str(a)
    assert metrics.to_dict() == data


@pytest.mark.parametrize("copied, given", [("b", ("a", "b", "b_copy")), ("a", ("a", "a", "a_copy"))],
                         ids=["the-runs-own-store", "an-eval-store-twice"])
def test_every_store_is_counted_once(two_stores, copied, given):
    """``--eval-features`` naming the new store itself, or one eval store twice (each also as a copy), adds those
    rows to ``all_classes`` once; every store given is still scored in ``eval_features``."""
    import shutil

    tmp_path, (a, _, _), (b, _, _) = two_stores
    stores = {"a": a, "b": b}
    stores[f"{copied}_copy"] = tmp_path / f"{copied}_copy.zarr"
    shutil.copytree(stores[copied], stores[f"{copied}_copy"])
    out = tmp_path / "run_b"
    evals = [arg for name in given for arg in ("--eval-features", stores[name])]
    result = learn("--init-model", tmp_path / "run_a" / "model.safetensors", "--features", b, "--out", out,
                   "--tasks", 2, *evals)
    assert result.exit_code == 0, result.output
    continuation = json.loads((out / "metrics.json").read_text())["continuation"]
    assert [p["task"] for p in continuation["all_classes"]["tasks"]] == ["T1", "T2", "eval"]
    assert continuation["all_classes"]["n_test"] == 12 + 8
    assert len(continuation["eval_features"]) == 3


def test_gamma_search_options_a_continuation_would_ignore_are_refused(two_stores):
    """The model's gamma is fixed (0.5), and a head has no gamma search: --select, --gamma-grid, --per-decade and
    --loo-sample would be ignored, so each is refused; untyped, the continuation runs."""
    tmp_path, (a, _, _), (b, _, _) = two_stores
    assert learn("--features", a, "--out", tmp_path / "head_a", "--tasks", 2, "--head", "slda").exit_code == 0
    for init in (tmp_path / "run_a" / "model.safetensors", tmp_path / "head_a" / "model.safetensors"):
        for option, value in (("--select", "gcv"), ("--gamma-grid", "1,10"), ("--per-decade", 3), ("--loo-sample", 10)):
            result = learn("--init-model", init, "--features", b, "--out", tmp_path / "run_b", option, value)
            assert_one_line_error(result, f"{option} acts with", f"drop {option}")
        assert not (tmp_path / "run_b").exists()


def test_an_auto_models_grid_and_sample_are_checked(two_stores):
    """A model of ``AnalyticClassifier(gamma="auto")`` continues by GCV over its own grid: another --gamma-grid and
    any --loo-sample are refused; its own grid and --select gcv run."""
    from foal_pipe.model.deploy import DeployedModel

    tmp_path, (a, xa, ya), (b, _, _) = two_stores
    ridge = foal_pipe.load_model(tmp_path / "run_a" / "model.safetensors")
    auto = foal_pipe.AnalyticClassifier(gamma="auto", gamma_grid=[1e-2, 1e2]).partial_fit(ridge.projection.transform(xa), ya)
    init = tmp_path / "auto.safetensors"
    DeployedModel(auto, ridge.projection, ridge.class_names, ridge.encoder_spec, ridge.metadata).save(init)
    base = ("--init-model", init, "--features", b, "--out", tmp_path / "run_b", "--tasks", 1, "--select", "gcv")
    assert_one_line_error(learn(*base, "--loo-sample", 10), "chooses gamma by GCV", "drop it")
    assert_one_line_error(learn(*base, "--gamma-grid", "1,10"), "--gamma-grid 1,10 conflicts with the model's grid")
    assert not (tmp_path / "run_b").exists()
    result = learn(*base, "--gamma-grid", "0.01,100")
    assert result.exit_code == 0, result.output


def test_a_learn_gamma_auto_model_keeps_choosing(tmp_path):
    """`learn --gamma auto` wrote only its last gamma, so a continued model kept it fixed (and refused --select gcv),
    against the docs; its file now holds the grid: the continuation chooses by GCV at every boundary, and with one
    task per store its last choice (on the sums of every row, whatever their order) and weights equal one GCV run's
    over both stores."""
    rng = np.random.default_rng(1)
    names = ["cat", "dog", "emu", "fox"]
    y = np.repeat(np.arange(4), 15)
    x = rng.normal(size=(y.size, 8)) + 2.0 * np.eye(4, 8)[y]
    first, second = y < 2, y >= 2
    a = write_store(tmp_path / "a.zarr", (x[first], y[first]), (x[first][::3], y[first][::3]), names[:2], chunk_rows=7,
                    dtype="float64")
    b = write_store(tmp_path / "b.zarr", (x[second], y[second] - 2), (x[second][::3], y[second][::3] - 2), names[2:],
                    chunk_rows=7, dtype="float64")
    both = write_store(tmp_path / "ab.zarr", (x, y), (x[::3], y[::3]), names, chunk_rows=7, dtype="float64")
    auto = ("--gamma", "auto", "--select", "gcv", "--projection-dim", 30)
    assert learn("--features", a, "--out", tmp_path / "ra", "--tasks", 1, *auto).exit_code == 0
    assert learn("--features", both, "--out", tmp_path / "rab", "--tasks", 2, *auto).exit_code == 0
    base = ("--init-model", tmp_path / "ra" / "model.safetensors", "--features", b, "--tasks", 1)
    assert_one_line_error(learn(*base, "--out", tmp_path / "no", "--select", "loo_accuracy"),
                          "--select loo_accuracy: a continued model chooses gamma by GCV")
    result = learn(*base, "--out", tmp_path / "rb")  # GCV without a word: the one criterion the sums give
    assert result.exit_code == 0, result.output
    continued = json.loads((tmp_path / "rb" / "metrics.json").read_text())
    whole = json.loads((tmp_path / "rab" / "metrics.json").read_text())
    assert continued["gamma"] == "auto"
    assert continued["gammas_selected"][-1] == whole["gammas_selected"][-1]
    model = foal_pipe.load_model(tmp_path / "rb" / "model.safetensors")
    H = model.projection.transform(x)
    gamma = whole["gammas_selected"][-1]
    W = np.linalg.solve(H.T @ H + gamma * np.eye(H.shape[1]), H.T @ np.eye(4)[y])
    np.testing.assert_allclose(model.classifier.weights_, W, atol=1e-9)


def test_head_rows_other_than_the_models_are_refused(two_stores):
    """A continued head's rows are the model's: `--head-rows features` on an activations model (or the reverse)
    was ignored in silence; the same rows as the model's still run."""
    tmp_path, (a, _, _), (b, _, _) = two_stores
    for rows, other in (("activations", "features"), ("features", "activations")):
        model = tmp_path / f"slda-{rows}"
        projection = ("--projection-dim", 20) if rows == "activations" else ()
        first = learn("--features", a, "--out", model, "--tasks", 2, "--head", "slda", "--head-rows", rows, *projection)
        assert first.exit_code == 0, first.output
        base = ("--init-model", model / "model.safetensors", "--features", b, "--tasks", 1)
        assert_one_line_error(learn(*base, "--out", tmp_path / "no", "--head-rows", other),
                              f"--head-rows {other} conflicts with the model's slda head (its {rows})")
        assert not (tmp_path / "no").exists()
        same = learn(*base, "--out", tmp_path / f"next-{rows}", "--head-rows", rows)
        assert same.exit_code == 0, same.output


@pytest.mark.parametrize("option, value, needs", [("--workers", 3, "--scheduler dask"),
                                                  ("--dask-address", "tcp://127.0.0.1:1", "--scheduler dask"),
                                                  ("--disjoint-ratio", 30, "--stream si-blurry")])
def test_options_a_continuation_would_ignore_are_refused(two_stores, option, value, needs):
    """These ran the continuation without a word (locally, on the disjoint stream) before."""
    tmp_path, _, (b, _, _) = two_stores
    result = learn("--init-model", tmp_path / "run_a" / "model.safetensors", "--features", b, "--out",
                   tmp_path / "run_b", "--tasks", 1, option, value)
    assert_one_line_error(result, f"{option} acts only with {needs}")
    assert not (tmp_path / "run_b").exists()
