"""A second outside fault hunt (after issue 24's): each case below was wrong on main and is now refused in one line.

Before: `predict --out` wrote its CSV over the model it read, over an input image or over a store's zarr.json
(data loss, exit 0); `learn`/`sweep`/`evaluate`/`predict` wrote their outputs into a feature store (every
later read of it warned, `extract --overwrite` would delete them); an empty `--gamma-grid` was an IndexError
traceback (and `gamma_grid=[]` fitted, to fail at the first prediction); a chunk shape edited to 0 was a
ZeroDivisionError traceback in every reader, `info` included; a store naming a class twice was trained on and
refused only when the model was written, naming a temporary file; `--heads ""` ran the plain gamma sweep;
`evaluate --model` or `--sweep` of another run or store was reported as the run's own; `gamma_grid=5` was a
TypeError traceback, `gamma_grid=b"1"` was read as the gamma 49 (a byte) and `gamma=True` as gamma 1;
`extract --out` inside a store made that store read as damaged; a huge pixels `--image-size` was a MemoryError
traceback; `learn --out .` failed after all its work with "Device or resource busy ... free some space";
A_avg 3.0 in a sweep.json result was shown as 300%; the Python API saved model files inside a store; `--per-decade
100000000` was a MemoryError traceback (learn) or an out-of-memory kill (sweep).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import helpers
import numpy as np
import pytest

from foal_pipe import AnalyticClassifier
from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import ExtractSpec, run_extract
from foal_pipe.store import write_store

CLASSES = helpers.FAULT_CLASSES
assert_one_line_error = partial(helpers.assert_one_line_error, after_notes=True)
_data = helpers.fault_rows
_invoke = helpers.invoke


@pytest.fixture
def store(tmp_path) -> Path:
    return helpers.fault_store(tmp_path / "s.zarr")


def _learn(store: Path, out: Path, *extra: object):
    return _invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 16, *extra)


@pytest.fixture
def model(store, tmp_path) -> Path:
    assert _learn(store, tmp_path / "run").exit_code == 0
    return tmp_path / "run" / "model.safetensors"


# -- an output over an input, or inside a feature store ----------------------------------------------------------
def test_predict_refuses_to_write_over_the_model_it_reads(store, model, tmp_path):
    before = model.read_bytes()
    link = tmp_path / "link.safetensors"
    link.symlink_to(model)
    for out in (model, link):
        result = _invoke("predict", "--model", model, "--features", store, "--out", out)
        assert_one_line_error(result, f"output {out} is an input of this command", "choose another --out")
    assert model.read_bytes() == before


def test_predict_images_refuses_to_write_over_an_input_image(tmp_path):
    tree = helpers.make_image_tree(tmp_path / "tree", {"a": 4, "b": 4})
    run_extract(ExtractSpec(dataset="imagefolder", data_dir=str(tree), model="pixels", image_size=8,
                            out=str(tmp_path / "px.zarr"), device="cpu", workers=0, batch_size=4, chunk_rows=4))
    assert _invoke("learn", "--features", tmp_path / "px.zarr", "--out", tmp_path / "run", "--tasks", 2,
                   "--projection-dim", 16).exit_code == 0
    image = tree / "test" / "a" / "img000.png"
    before = image.read_bytes()
    for given in (tree / "test", image, str(tree / "test" / "*" / "*.png")):
        result = _invoke("predict", "--model", tmp_path / "run" / "model.safetensors", "--images", given,
                         "--out", image)
        assert_one_line_error(result, f"output {image} is an input of this command")
    assert image.read_bytes() == before
    ok = _invoke("predict", "--model", tmp_path / "run" / "model.safetensors", "--images", tree / "test",
                 "--out", tmp_path / "pred.csv")
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "pred.csv").read_text().count("\n") == 1 + 4


@pytest.mark.parametrize("where", ["zarr.json", "p.csv", "train/labels/c/0"])
def test_predict_refuses_an_out_inside_the_store(store, model, where):
    files = helpers.store_files(store)
    result = _invoke("predict", "--model", model, "--features", store, "--out", store / where)
    assert_one_line_error(result, f"lies in the feature store {store.resolve()}", "outside it")
    assert helpers.store_files(store) == files


@pytest.mark.parametrize("command", ["learn", "sweep", "evaluate"])
@pytest.mark.parametrize("where", [".", "train", "runs/x"])
def test_run_outputs_inside_a_store_are_refused(store, model, command, where):
    files = helpers.store_files(store)
    out = store / where
    if command == "evaluate":
        result = _invoke("evaluate", "--run", model.parent, "--out", out, "--no-plots")
    else:
        result = _invoke(command, "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 16)
    assert_one_line_error(result, "lies in the feature store", "choose an --out outside it")
    assert helpers.store_files(store) == files


def test_outputs_beside_a_store_are_still_written(store, model, tmp_path):
    result = _invoke("predict", "--model", model, "--features", store, "--out", tmp_path / "p.csv")
    assert result.exit_code == 0, result.output
    assert _invoke("evaluate", "--run", model.parent, "--no-plots").exit_code == 0
    assert (model.parent / "eval" / "summary.md").is_file()


# -- an empty gamma grid -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("grid", ["", " , "])
def test_an_empty_gamma_grid_is_refused_in_one_line(store, tmp_path, grid):
    result = _learn(store, tmp_path / "run", "--gamma", "auto", "--gamma-grid", grid)
    assert result.exit_code == 2 and result.output.startswith("Error: --gamma-grid is empty;"), result.output
    assert not (tmp_path / "run").exists()


def test_an_empty_gamma_grid_is_refused_by_fit():
    X, y = _data(40, 3)
    with pytest.raises(FoalPipeError, match="gamma_grid is empty"):
        AnalyticClassifier(gamma="auto", gamma_grid=[]).fit(X, y)
    # a fixed gamma does not use the grid: still fitted, and exactly the ridge solution
    clf = AnalyticClassifier(gamma=2.0, gamma_grid=[]).fit(X.astype(np.float64), y)
    Y = np.eye(4)[y]
    X64 = X.astype(np.float64)
    W = np.linalg.solve(X64.T @ X64 + 2.0 * np.eye(6), X64.T @ Y)
    np.testing.assert_array_equal(clf.predict(X64), np.argmax(X64 @ W, axis=1))


# -- a chunk side edited to 0 ------------------------------------------------------------------------------------
def _zero_chunk(store: Path, array: str) -> None:
    meta_file = store / array / "zarr.json"
    meta = json.loads(meta_file.read_text())
    meta["chunk_grid"]["configuration"]["chunk_shape"][0] = 0
    meta_file.write_text(json.dumps(meta))


@pytest.mark.parametrize("array", ["train/features", "test/labels"])
@pytest.mark.parametrize("command", [("info",), ("info", "--verify"), ("learn",), ("predict",)])
def test_a_chunk_shape_edited_to_zero_is_refused_in_one_line(tmp_path, array, command):
    store = helpers.build_store(tmp_path / "b.zarr")  # format 1: no generation id to notice the edit first
    assert _invoke("learn", "--features", store, "--out", tmp_path / "run", "--tasks", 4,
                   "--projection-dim", 16).exit_code == 0
    _zero_chunk(store, array)
    args = {"info": ("info", store, *command[1:]),
            "learn": ("learn", "--features", store, "--out", tmp_path / "run2", "--tasks", 4),
            "predict": ("predict", "--model", tmp_path / "run" / "model.safetensors", "--features", store)}
    result = _invoke(*args[command[0]])
    assert_one_line_error(result, f"array {array} in {store} has chunk shape (0", "re-extract it")


def test_an_extracted_store_with_a_zero_chunk_side_is_refused_by_info(store):
    _zero_chunk(store, "train/features")
    assert_one_line_error(_invoke("info", store), "array train/features", "has chunk shape (0, 6)")


# -- a class named twice -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["learn", "sweep", "info"])
def test_a_store_naming_a_class_twice_is_refused_before_training(tmp_path, command):
    names = [f"c{i}" for i in range(helpers.N_CLASSES - 1)] + ["c0"]
    store = helpers.build_store(tmp_path / "b.zarr", attrs={"classes": names})
    args = ("info", store) if command == "info" else (command, "--features", store, "--out", tmp_path / "run",
                                                       "--tasks", 4, "--projection-dim", 16)
    result = _invoke(*args)
    assert_one_line_error(result, "attribute 'classes' names 'c0' twice")
    assert ".tmp-" not in result.output
    assert not (tmp_path / "run").exists()


# -- --heads that names no head ----------------------------------------------------------------------------------
@pytest.mark.parametrize("heads", ["", ",", " , "])
def test_heads_naming_no_head_is_refused(store, tmp_path, heads):
    result = _invoke("sweep", "--features", store, "--out", tmp_path / "sw", "--tasks", 2, "--heads", heads)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output  # usage error
    assert "--heads" in result.output and "names no head" in result.output and "ridge, ncm" in result.output
    assert not (tmp_path / "sw").exists()


# -- evaluate with another run's model or another store's sweep --------------------------------------------------
def test_evaluate_refuses_a_model_of_another_run(store, model, tmp_path):
    other_store = helpers.build_store(tmp_path / "blobs.zarr")
    assert _invoke("learn", "--features", other_store, "--out", tmp_path / "blobs", "--tasks", 4,
                   "--projection-dim", 16).exit_code == 0
    assert _learn(store, tmp_path / "wider", "--projection-dim", 24).exit_code == 0
    for other, what in ((tmp_path / "blobs", "its dataset is 'blobs' but the run's metrics.json has 'synthetic'"),
                        (tmp_path / "wider", "its projection dimension D is 24 but the run's metrics.json has 16")):
        result = _invoke("evaluate", "--run", model.parent, "--model", other / "model.safetensors", "--out",
                         tmp_path / "ev", "--no-plots")
        assert_one_line_error(result, f"is not the model of run {model.parent}", what)
        assert not (tmp_path / "ev").exists()
    result = _invoke("evaluate", "--run", model.parent, "--model", model, "--out", tmp_path / "ev", "--no-plots")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "ev" / "class_accuracy.csv").is_file()


def test_evaluate_refuses_a_model_the_run_did_not_write(store, model, tmp_path):
    """Same store, same D, another seed: only the checksum metrics.json records tells the models apart."""
    import shutil

    from foal_pipe.model.modelfile import read_model

    run = model.parent
    recorded = json.loads((run / "metrics.json").read_text())["model_checksum"]
    assert recorded == read_model(model)[1]["checksum"]  # verified against the file's content
    assert _learn(store, tmp_path / "seed1", "--seed", 1).exit_code == 0
    other = tmp_path / "seed1" / "model.safetensors"
    result = _invoke("evaluate", "--run", run, "--model", other, "--out", tmp_path / "ev", "--no-plots")
    assert_one_line_error(result, f"{other} is not the model run {run} wrote", "pass the run's own model")
    assert not (tmp_path / "ev").exists()
    shutil.copy(model, tmp_path / "own.safetensors")  # the run's own model, moved: still its own
    result = _invoke("evaluate", "--run", run, "--model", tmp_path / "own.safetensors", "--out", tmp_path / "ev",
                     "--no-plots")
    assert result.exit_code == 0, result.output
    shutil.copy(other, model)  # the run's file replaced after the run
    result = _invoke("evaluate", "--run", run, "--out", tmp_path / "ev2", "--no-plots")
    assert_one_line_error(result, "is not the model run", "replaced after the run")
    helpers.as_old_run(run)  # a run written before the checksum was recorded: its seed draws another projection
    result = _invoke("evaluate", "--run", run, "--out", tmp_path / "ev3", "--no-plots")
    assert_one_line_error(result, "its projection is not the one the run's seed 0 draws")


@pytest.mark.parametrize("extra", [("--head", "ncm"), ("--order-seeds", "0,1"), ("--init-model",)],
                         ids=["head", "order-seeds", "init-model"])
def test_every_run_records_the_checksum_of_the_model_it_wrote(store, model, tmp_path, extra):
    from foal_pipe.model.modelfile import read_model

    features = store
    if extra == ("--init-model",):
        features = write_store(tmp_path / "more.zarr", _data(64, 5), _data(32, 6), ["e", "f", "g", "h"],
                               chunk_rows=32)
        extra = ("--init-model", model)
    result = _invoke("learn", "--features", features, "--out", tmp_path / "run2", "--tasks", 2, *extra)
    assert result.exit_code == 0, result.output
    recorded = json.loads((tmp_path / "run2" / "metrics.json").read_text())["model_checksum"]
    assert recorded == read_model(tmp_path / "run2" / "model.safetensors")[1]["checksum"]


def test_evaluate_refuses_a_sweep_of_another_store(store, model, tmp_path):
    other_store = helpers.build_store(tmp_path / "blobs.zarr")
    assert _invoke("sweep", "--features", other_store, "--out", tmp_path / "blobs-sweep", "--tasks", 4,
                   "--projection-dim", 16).exit_code == 0
    result = _invoke("evaluate", "--run", model.parent, "--sweep", tmp_path / "blobs-sweep", "--out",
                     tmp_path / "ev", "--no-plots")
    assert_one_line_error(result, "swept other features than run", "its dataset is 'blobs'")
    assert not (tmp_path / "ev").exists()
    assert _invoke("sweep", "--features", store, "--out", tmp_path / "own-sweep", "--tasks", 2,
                   "--projection-dim", 16).exit_code == 0
    result = _invoke("evaluate", "--run", model.parent, "--sweep", tmp_path / "own-sweep", "--out", tmp_path / "ev",
                     "--no-plots")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "ev" / "gamma.csv").is_file()


@pytest.mark.parametrize("other, what", [(("--projection-dim", 24), "its projection_dim is 24"),
                                         (("--tasks", 3), "its tasks is"), (("--seed", 5), "its seed is 5"),
                                         (("--stream", "si-blurry"), "its stream is 'si-blurry'")])
def test_a_sweep_of_other_settings_is_not_the_runs(store, model, tmp_path, other, what):
    """A sweep of the run's store at another projection, order, seed or stream has another gamma curve: given, it
    is refused; found beside the run (RUN-sweep), it is left out with a note instead of plotted as the run's."""
    base = ("sweep", "--features", store, "--tasks", 2, "--projection-dim", 16)
    assert _invoke(*base, "--out", tmp_path / "other", *other).exit_code == 0
    result = _invoke("evaluate", "--run", model.parent, "--sweep", tmp_path / "other", "--out", tmp_path / "ev",
                     "--no-plots")
    assert_one_line_error(result, "swept other settings than run", what, "pass a sweep of the run's store and settings")
    assert not (tmp_path / "ev").exists()
    assert _invoke(*base, "--out", tmp_path / "run-sweep", *other).exit_code == 0
    result = _invoke("evaluate", "--run", model.parent, "--out", tmp_path / "ev", "--no-plots")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "ev" / "gamma.csv").exists()
    assert "No gamma plot:" in (tmp_path / "ev" / "summary.md").read_text()
    assert _invoke(*base, "--out", tmp_path / "run-sweep").exit_code == 0  # the run's own settings: plotted
    assert _invoke("evaluate", "--run", model.parent, "--out", tmp_path / "ev2", "--no-plots").exit_code == 0
    assert (tmp_path / "ev2" / "gamma.csv").is_file()


def test_evaluate_of_a_sweep_folder_points_to_sweep_not_to_learn(store, tmp_path):
    """The advice was `foal-pipe learn --out SWEEP_DIR`, which overwrote the sweep's timings.json."""
    assert _invoke("sweep", "--features", store, "--out", tmp_path / "sw", "--tasks", 2, "--projection-dim", 16).exit_code == 0
    result = _invoke("evaluate", "--run", tmp_path / "sw")
    assert_one_line_error(result, "holds a sweep (sweep.json), not a learn run", "this one as --sweep")
    assert "learn --out" not in result.output


def test_an_encoder_that_differs_is_named_by_its_setting(store, model, tmp_path):
    """Another encoder is named by the setting that differs, not by two dicts cut off mid-word."""
    assert _invoke("sweep", "--features", store, "--out", tmp_path / "sw", "--tasks", 2, "--projection-dim", 16).exit_code == 0
    data = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    data["encoder"] = {**data["encoder"], "fusion": "cls"}
    (tmp_path / "sw" / "sweep.json").write_text(json.dumps(data))
    result = _invoke("evaluate", "--run", model.parent, "--sweep", tmp_path / "sw", "--out", tmp_path / "ev")
    assert_one_line_error(result, "swept other features than run", "its encoder's fusion is 'cls' but the run's")


# -- gammas the Python API misread -------------------------------------------------------------------------------
@pytest.mark.parametrize("grid", [5, "1,10", b"1"])
def test_a_gamma_grid_that_is_not_a_sequence_is_refused(grid):
    X, y = _data(40, 3)
    with pytest.raises(FoalPipeError, match="gamma_grid must be a sequence of gammas"):
        AnalyticClassifier(gamma="auto", gamma_grid=grid).fit(X, y)


@pytest.mark.parametrize("gamma", [True, np.True_])
def test_a_boolean_gamma_is_refused(gamma):
    X, y = _data(40, 3)
    with pytest.raises(FoalPipeError, match="gamma must be a positive number"):
        AnalyticClassifier(gamma=gamma).fit(X, y)


# -- extract: a store inside a store, features too wide for memory -----------------------------------------------
def test_extract_refuses_a_store_inside_a_store(store, tmp_path):
    files = helpers.store_files(store)
    for inner in (store / "inner.zarr", store / "train" / "deep" / "x.zarr"):
        result = _invoke("extract", "--dataset", "digits", "--model", "pixels", "--out", inner)
        assert_one_line_error(result, f"--out {inner} lies in the feature store {store.resolve()}", "outside it")
        with pytest.raises(FoalPipeError, match="lies in the feature store"):
            write_store(inner, _data(8, 0), _data(8, 1), CLASSES)
    assert helpers.store_files(store) == files
    assert _learn(store, tmp_path / "run").exit_code == 0  # not damaged: on main its generation id no longer matched


def test_extract_refuses_features_too_wide_for_memory(tmp_path):
    out = tmp_path / "huge.zarr"
    result = _invoke("extract", "--dataset", "digits", "--model", "pixels", "--image-size", 100_000, "--out", out)
    assert_one_line_error(result, "one chunk of features", "choose a smaller --image-size")
    assert not out.exists()


# -- an output directory named '.' or '..' -----------------------------------------------------------------------
@pytest.mark.parametrize("name", [".", "sub/.."])
def test_an_output_named_dot_is_refused_before_the_work(store, model, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    for args in (("learn", "--features", store, "--out", name, "--tasks", 2, "--projection-dim", 16),
                 ("evaluate", "--run", model.parent, "--out", name, "--no-plots")):
        result = _invoke(*args)
        assert_one_line_error(result, f"output {name} names a directory by '.' or '..'", f"--out {tmp_path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# -- accuracies outside [0, 1] in a sweep.json or metrics.json ---------------------------------------------------
@pytest.mark.parametrize("edit", [{"A_avg": 3.0}, {"A_last": -0.5}, {"A_steps": [1.0, 2.0]}])
def test_sweep_and_metrics_accuracies_outside_zero_one_are_refused(store, model, tmp_path, edit):
    assert _invoke("sweep", "--features", store, "--out", tmp_path / "sw", "--tasks", 2,
                   "--projection-dim", 16).exit_code == 0
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    sweep["results"][0].update(edit)
    (tmp_path / "sw" / "sweep.json").write_text(json.dumps(sweep))
    result = _invoke("evaluate", "--run", model.parent, "--sweep", tmp_path / "sw", "--out", tmp_path / "ev")
    assert_one_line_error(result, "sweep.json: results[0]", "in [0, 1]")
    metrics = json.loads((model.parent / "metrics.json").read_text())
    (model.parent / "metrics.json").write_text(json.dumps({**metrics, **edit}))
    assert_one_line_error(_invoke("evaluate", "--run", model.parent, "--out", tmp_path / "ev"), "metrics.json",
                          "in [0, 1]")
    assert not (tmp_path / "ev").exists()


def test_the_python_api_refuses_to_save_a_model_inside_a_store(store, model, tmp_path):
    from foal_pipe import load_model

    files = helpers.store_files(store)
    X, y = _data(40, 3)
    for save in (AnalyticClassifier().fit(X, y).save, load_model(model).save):
        for where in (store / "m.safetensors", store / "train" / "features" / "m.safetensors"):
            with pytest.raises(FoalPipeError, match=f"lies in the feature store {store.resolve()}"):
                save(where)
        save(tmp_path / "beside.safetensors")
        assert (tmp_path / "beside.safetensors").is_file()
    assert helpers.store_files(store) == files


# -- a refined gamma search too fine to fit in memory ------------------------------------------------------------
@pytest.mark.parametrize("command", [("learn", "--gamma", "auto"), ("sweep",)])
def test_a_huge_per_decade_is_refused_in_one_line(store, tmp_path, command):
    result = _invoke(*command, "--features", store, "--out", tmp_path / "run", "--tasks", 2, "--projection-dim", 16,
                     "--per-decade", 100_000_000)
    assert_one_line_error(result, "--per-decade 100000000 asks for 1,200,000,000 gammas", "e.g. --per-decade 8")
    assert not (tmp_path / "run").exists()


def test_evaluate_of_a_store_does_not_advise_writing_a_run_into_it(store, tmp_path):
    result = _invoke("evaluate", "--run", store)
    assert_one_line_error(result, f"{store} is a feature store, not a run directory")
    assert f"--out {store}" not in result.output


# -- an option that this command line would ignore ---------------------------------------------------------------
@pytest.mark.parametrize("command, typed, needs, fix", [
    ("learn", ("--gamma-grid", "1,10"), "--gamma auto", ("--gamma", "auto")),
    ("learn", ("--select", "gcv"), "--gamma auto", ("--gamma", "auto")),
    ("learn", ("--per-decade", 4), "--gamma auto", ("--gamma", "auto")),
    ("learn", ("--loo-sample", 40), "a leave-one-out --select (loo, loo_accuracy) with --gamma auto", ("--gamma", "auto")),
    ("learn", ("--loo-sample", 40, "--gamma", "auto", "--select", "gcv"),
     "a leave-one-out --select (loo, loo_accuracy) with --gamma auto", ("--select", "loo")),
    ("learn", ("--disjoint-ratio", 30), "--stream si-blurry", ("--stream", "si-blurry")),
    ("sweep", ("--blurry-ratio", 20), "--stream si-blurry", ("--stream", "si-blurry")),
    ("learn", ("--workers", 1), "--scheduler dask and --dask-address local", None),
    ("sweep", ("--workers", 2, "--scheduler", "dask", "--dask-address", "tcp://127.0.0.1:1"),
     "--scheduler dask and --dask-address local", None),
    ("sweep", ("--dask-address", "local"), "--scheduler dask", None),
    ("learn", ("--no-fusion-norm",), "--fusion", None),
    ("sweep", ("--no-fusion-norm",), "--fusion or --fusions", None),
])
def test_an_option_the_command_would_ignore_is_refused(store, tmp_path, command, typed, needs, fix):
    """Typed without the setting it acts with, an option used to be ignored: the run looked tuned and was not."""
    flag = typed[0]
    base = (command, "--features", store, "--tasks", 2, "--projection-dim", 16)
    result = _invoke(*base, "--out", tmp_path / "run", *typed)
    assert_one_line_error(result, f"{flag} acts only with {needs}", f"drop {flag} or add {needs}")
    assert not (tmp_path / "run").exists()
    if fix is not None:  # with the setting, the option is taken
        assert _invoke(*base, "--out", tmp_path / "taken", *typed, *fix).exit_code == 0
    assert _invoke(*base, "--out", tmp_path / "default").exit_code == 0  # the defaults alone are not "typed"


@pytest.mark.parametrize("command, option", [("sweep", "--gammas"), ("learn", "--gamma-grid")])
def test_a_gamma_listed_twice_is_refused(store, tmp_path, command, option):
    """sweep evaluated a gamma listed twice twice (two identical results in sweep.json)."""
    auto = ("--gamma", "auto") if command == "learn" else ()
    result = _invoke(command, "--features", store, "--out", tmp_path / "run", "--tasks", 2, *auto, option, "1,10,1.0")
    assert_one_line_error(result, f"{option} lists 1 twice; list each gamma once")
    assert not (tmp_path / "run").exists()
    assert _invoke(command, "--features", store, "--out", tmp_path / "once", "--tasks", 2, *auto, option,
                   "1,10").exit_code == 0
