"""``learn --init-model`` as the continuation audit left it: the model's fusion and gamma grid kept, rows that cannot
be shown new refused, ``--eval-features`` checked before any work, a model file's ``gamma_grid`` validated, the
projection's dtype kept; messages that name the option at fault."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import assert_clean_error, build_store, invoke, make_image_tree
from safetensors.numpy import load_file

from foal_pipe.errors import FoalPipeError
from foal_pipe.model import modelfile
from foal_pipe.model.modelfile import read_model, write_model
from foal_pipe.protocol.config import ExecutionConfig, StreamConfig
from foal_pipe.store import write_store

D_IN, BLOCKS = 6, 3
RUN = ("--tasks", "2", "--backend", "numpy")
FIRST = (*RUN, "--projection-dim", "8", "--seed", "3")


def _store(path: Path, names: list[str], seed: int, dim: int = D_IN) -> Path:
    """A complete store (with a generation id) of ``names``, 10 train and 3 test rows each, and 3 blocks a row."""
    rng = np.random.default_rng(seed)
    y, yt = np.repeat(np.arange(len(names)), 10), np.repeat(np.arange(len(names)), 3)
    blocks = [(rng.normal(size=(n, BLOCKS, dim)) + labels[:, None, None]).astype(np.float32) for n, labels in
              ((y.size, y), (yt.size, yt))]
    return write_store(path, (blocks[0][:, -1], y), (blocks[1][:, -1], yt), names, chunk_rows=7, blocks=tuple(blocks))


@pytest.fixture
def stores(tmp_path: Path) -> dict[str, Path]:
    return {name: _store(tmp_path / f"{name}.zarr", [f"{name.lower()}{i}" for i in range(4)], seed)
            for seed, name in enumerate("ABC")}


def _learn(store: Path, out: Path, *extra: str) -> Path:
    result = invoke("learn", "--features", store, "--out", out, *extra)
    assert result.exit_code == 0, result.output
    return out / "model.safetensors"


def _continue(model: Path, store: Path, out: Path, *extra: str):
    return invoke("learn", "--init-model", model, "--features", store, "--out", out, *RUN, *extra)


def test_a_fusion_other_than_the_models_is_refused(stores, tmp_path):
    plain = _learn(stores["A"], tmp_path / "plain", *FIRST, "--gamma", "0.5")
    fused = _learn(stores["A"], tmp_path / "fused", *FIRST, "--gamma", "0.5", "--fusion", "mean-cls")
    out = tmp_path / "out"
    for model, extra, message in (
            (plain, ("--fusion", "mean-cls"), "--fusion mean-cls conflicts with the model's fusion (none"),
            (plain, ("--no-fusion-norm",), "--no-fusion-norm conflicts with the model's fusion (none"),
            (fused, ("--fusion", "last"), "--fusion last conflicts with the model's fusion (mean-cls)"),
            (fused, ("--fusion", "mean-cls", "--no-fusion-norm"), "drop --fusion and --no-fusion-norm")):
        assert_clean_error(_continue(model, stores["B"], out, *extra), message, out)


@pytest.mark.parametrize("extra", [(), ("--fusion", "mean-cls")], ids=["model's", "same"])
def test_a_fusion_model_continues_on_the_new_stores_fused_rows(stores, tmp_path, extra):
    first = _learn(stores["A"], tmp_path / "fused", *FIRST, "--gamma", "0.5", "--fusion", "mean-cls")
    result = _continue(first, stores["B"], tmp_path / "more", *extra)
    assert result.exit_code == 0, result.output
    (before, _), (after, meta) = read_model(first), read_model(tmp_path / "more" / "model.safetensors")
    z = np.asarray(zarr.open_group(str(stores["B"]), mode="r")["train/blocks"][:])
    fused = (z.sum(axis=1, dtype=np.float32) / np.float32(BLOCKS)).astype(np.float64)  # mean-cls, identity norm
    H = 1.0 / (1.0 + np.exp(-fused @ before["projection"]))
    np.testing.assert_allclose(after["G"] - before["G"], H.T @ H, rtol=1e-6, atol=1e-6)
    assert meta["n_samples_seen"] == 80 and meta["encoder"]["fusion"] == "mean-cls"


def test_a_gamma_auto_model_keeps_choosing_over_its_grid_after_each_continuation(stores, tmp_path):
    first = _learn(stores["A"], tmp_path / "a", *FIRST, "--gamma", "auto", "--select", "gcv")
    grid = read_model(first)[1]["gamma_grid"]
    assert _continue(first, stores["B"], tmp_path / "ab").exit_code == 0
    assert read_model(tmp_path / "ab" / "model.safetensors")[1]["gamma_grid"] == grid
    result = _continue(tmp_path / "ab" / "model.safetensors", stores["C"], tmp_path / "abc", "--gamma", "auto")
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "abc" / "metrics.json").read_text())
    assert metrics["gamma"] == "auto" and metrics["selected_by"] == "gcv"
    assert all(min(grid) <= g <= max(grid) for g in metrics["gammas_selected"])


@pytest.mark.parametrize("head", ["ridge", "ncm"])
def test_rows_that_cannot_be_shown_new_are_refused(tmp_path, stores, head):
    old = build_store(tmp_path / "v1.zarr", n_train=48, n_test=24, chunk=16)  # format 1: no generation id
    model = _learn(old, tmp_path / "first", *RUN, "--head", head)
    out = tmp_path / "out"
    # named by its content: the same store refused, another format-1 store of new rows continued
    assert_clean_error(_continue(model, old, out), "has already learned the training rows of", out)
    other = build_store(tmp_path / "w1.zarr", n_train=48, n_test=24, chunk=16, seed=5)
    assert _continue(model, other, tmp_path / "new").exit_code == 0
    tensors, meta = read_model(_learn(stores["A"], tmp_path / "a", *RUN, "--head", head))
    write_model(tmp_path / "unrecorded.safetensors", tensors, {k: v for k, v in meta.items() if k != "learned_from"})
    result = _continue(tmp_path / "unrecorded.safetensors", stores["B"], out)
    assert_clean_error(result, "records no store it learned", out)
    assert "learn the model again with this foal-pipe" in " ".join(result.output.split())  # not "extract again"


@pytest.mark.parametrize("grid", [None, "0.1,1", [], [-1, 0], [1.0, 10.0]], ids=["null", "text", "empty", "negative",
                                                                                "gamma-outside"])
def test_a_model_files_gamma_grid_is_checked_when_read(stores, tmp_path, monkeypatch, grid):
    tensors, meta = read_model(_learn(stores["A"], tmp_path / "a", *FIRST, "--gamma", "0.5"))
    with monkeypatch.context() as patch:  # a file another writer made: write_model would refuse it
        patch.setattr(modelfile, "validate_model", lambda *args, **kwargs: None)
        write_model(tmp_path / "bad.safetensors", tensors, {**meta, "gamma_grid": grid})
    with pytest.raises(FoalPipeError, match="metadata 'gamma_grid'"):
        read_model(tmp_path / "bad.safetensors")
    out = tmp_path / "out"
    assert_clean_error(_continue(tmp_path / "bad.safetensors", stores["B"], out), "metadata 'gamma_grid'", out)


def test_eval_features_are_checked_before_any_work(stores, tmp_path, monkeypatch):
    from foal_pipe.protocol import continuation
    from foal_pipe.protocol.entry import LearnSettings, learn

    model = _learn(stores["A"], tmp_path / "a", *FIRST, "--gamma", "0.5")
    narrow = _store(tmp_path / "narrow.zarr", ["n0", "n1"], 7, dim=4)

    def walked(*args, **kwargs):
        raise AssertionError("the walk started before --eval-features was checked")

    monkeypatch.setattr(continuation, "walk", walked)
    for path, message in ((tmp_path / "missing.zarr", "missing.zarr does not exist"),
                          (narrow, "expects 6-dimensional features but")):
        settings = LearnSettings(stream=StreamConfig(tasks=2), execution=ExecutionConfig(backend="numpy"),
                                 init_model=model, eval_features=(path,))
        with pytest.raises(FoalPipeError, match=message):
            learn(stores["B"], tmp_path / "out", settings, log=lambda _: None)


def test_messages_name_the_option_at_fault(stores, tmp_path):
    model = _learn(stores["A"], tmp_path / "a", *FIRST, "--gamma", "0.5")
    out = tmp_path / "out"
    assert_clean_error(_continue(model, stores["B"], out, "--eval-features", tmp_path / "a"),
                       "point --eval-features at a directory", out)
    assert_clean_error(_continue(stores["C"], stores["B"], out), "C.zarr is a feature store, not a model file", out)
    assert_clean_error(_continue(tmp_path / "a", stores["B"], out), f"pass {model}", out)


def test_a_heads_model_refuses_ridges_engine(stores, tmp_path):
    head, out = _learn(stores["A"], tmp_path / "ncm", *RUN, "--head", "ncm"), tmp_path / "out"
    assert_clean_error(_continue(head, stores["B"], out, "--engine", "rls"),
                       "--engine rls conflicts with the model's ncm head", out)


@pytest.mark.parametrize("head", ["ridge", "ncm"])
def test_a_float32_models_projection_stays_float32(stores, tmp_path, head):
    first = _learn(stores["A"], tmp_path / "a", *FIRST, "--dtype", "float32", "--head", head)
    assert _continue(first, stores["B"], tmp_path / "ab").exit_code == 0
    before, after = load_file(str(first)), load_file(str(tmp_path / "ab" / "model.safetensors"))
    assert after["projection"].dtype == np.float32
    assert after["projection"].tobytes() == before["projection"].tobytes()


def test_an_eval_store_of_no_known_class_adds_no_part_and_the_write_is_timed(stores, tmp_path):
    model = _learn(stores["A"], tmp_path / "a", *FIRST, "--gamma", "0.5")
    result = _continue(model, stores["B"], tmp_path / "ab", "--eval-features", stores["C"], "--eval-features",
                       stores["A"])
    assert result.exit_code == 0, result.output
    continued = json.loads((tmp_path / "ab" / "metrics.json").read_text())["continuation"]
    assert [s["n_test"] for s in continued["eval_features"]] == [12, 12]
    parts = continued["all_classes"]["tasks"]
    assert [(p["task"], Path(p["features"]).name) for p in parts] == [("T1", "B.zarr"), ("T2", "B.zarr"),
                                                                      ("eval", "A.zarr")]
    assert "eval 0.00" not in result.output
    assert "write" in json.loads((tmp_path / "ab" / "timings.json").read_text())


@pytest.mark.parametrize("again", ["absolute path", "copied folder"])
def test_the_same_images_extracted_from_another_path_are_refused(tmp_path, monkeypatch, again):
    """The data identity hashed the source path as typed: the same folder extracted as ``img`` and as its absolute
    path (or a copy of it) gave two identities, and continuing counted every row twice, exit 0. The train images'
    SHA-256 in the store's split manifest identify them now."""
    import shutil

    monkeypatch.chdir(tmp_path)
    make_image_tree(tmp_path / "img", {"ant": 6, "bee": 6, "cat": 6, "dog": 6}, test_per_class=3)
    if again == "copied folder":
        shutil.copytree(tmp_path / "img", tmp_path / "copy")
    source = {"absolute path": str(tmp_path / "img"), "copied folder": "copy"}[again]
    for out, data in (("a.zarr", "img"), ("b.zarr", source)):
        result = invoke("extract", "--dataset", "imagefolder", "--data-dir", data, "--model", "pixels", "--image-size", 8,
                        "--out", out, "--workers", 0)
        assert result.exit_code == 0, result.output
    assert invoke("learn", "--features", "a.zarr", "--out", "A", "--tasks", 2, "--projection-dim", 20).exit_code == 0
    result = invoke("learn", "--features", "b.zarr", "--init-model", "A/model.safetensors", "--out", "AB", "--tasks", 2)
    assert_clean_error(result, "has already learned the training rows of b.zarr (the same rows extracted again", tmp_path / "AB")


@pytest.mark.parametrize("engine", ["gram", "rls"])
def test_a_heads_model_refuses_engine_typed_at_any_value(stores, tmp_path, engine):
    """ridge's solver: a head's model refuses it as ``learn --head`` does, the default typed too (was accepted)."""
    model = _learn(stores["A"], tmp_path / "a", *RUN, "--head", "slda")
    result = _continue(model, stores["B"], tmp_path / "b", "--engine", engine)
    assert_clean_error(result, f"--engine {engine} conflicts with the model's slda head (which does not take it)",
                       tmp_path / "b")


def test_a_gram_model_continued_with_engine_rls_says_drop_it(stores, tmp_path):
    model = _learn(stores["A"], tmp_path / "a", *FIRST)
    result = _continue(model, stores["B"], tmp_path / "b", "--engine", "rls")
    assert_clean_error(result, "--engine rls: --init-model adds to the model's gram sums; drop --engine", tmp_path / "b")
    assert "use a model learned with" not in result.output
