"""``learn --init-model`` as the session-21 audit left it: a Python caller's settings are checked against the model
without naming them in ``given`` (they were replaced by the model's in silence), and a continued run's
``metrics.json`` records what it ran on: the head's rows, and no seed or projection init that did not draw its
projection."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from helpers import invoke

from foal_pipe.core.expansion import Expansion
from foal_pipe.core.statistics import DEFAULT_GAMMA_GRID
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.modelfile import read_model
from foal_pipe.protocol.config import ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.protocol.entry import LearnSettings, learn
from foal_pipe.store import write_store

D_IN, D = 6, 20


def _store(path: Path, names: list[str], seed: int) -> Path:
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(len(names)), 10)
    x = rng.normal(size=(y.size, D_IN)) + 2.0 * np.eye(len(names), D_IN)[y]
    return write_store(path, (x, y), (x[::3], y[::3]), names, chunk_rows=7, dtype="float64")


@pytest.fixture
def stores(tmp_path: Path) -> tuple[Path, Path]:
    return _store(tmp_path / "a.zarr", ["cat", "dog", "emu", "fox"], 0), _store(tmp_path / "b.zarr", ["gnu", "dog", "owl"], 1)


def _first(store: Path, out: Path, *extra: object) -> Path:
    result = invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", D, "--backend", "numpy",
                    *extra)
    assert result.exit_code == 0, result.output
    return out / "model.safetensors"


def _continue(model: Path, store: Path, out: Path, stream: StreamConfig | None = None,
              config: ModelConfig | None = None):
    settings = LearnSettings(stream=stream or StreamConfig(tasks=2), model=config or ModelConfig(),
                             execution=ExecutionConfig(backend="numpy"), init_model=model)
    return learn(store, out, settings, log=lambda _: None)


@pytest.mark.parametrize("first, stream, config, message", [
    (("--gamma", 0.5), None, ModelConfig(gamma=2.0), "gamma=2.0 conflicts with the model's 0.5"),
    (("--gamma", 0.5), None, ModelConfig(projection_dim=40), "projection_dim=40 conflicts with the model's 20"),
    (("--gamma", 0.5), None, ModelConfig(dtype="float32"), "dtype='float32' conflicts with the model's float64"),
    (("--gamma", 0.5), None, ModelConfig(activation="relu"), "activation='relu' conflicts with the model's sigmoid"),
    (("--gamma", 0.5), StreamConfig(tasks=2, seed=3), None, "seed draws the projection, which comes from init_model"),
    (("--gamma", 0.5), None, ModelConfig(projection_init="normal"), "projection_init draws the projection"),
    (("--gamma", "auto", "--select", "gcv"), None, ModelConfig(select="loo"), "select='loo': a continued model chooses"),
    (("--head", "slda"), None, ModelConfig(head="ncm"), "head='ncm' conflicts with the model's slda head"),
    (("--head", "slda"), None, ModelConfig(head="slda", projection_dim=40), "projection_dim=40 conflicts with the model's slda"),
], ids=["gamma", "projection_dim", "dtype", "activation", "seed", "projection_init", "select", "head", "head-projection"])
def test_a_python_callers_setting_is_checked_without_given(stores, tmp_path, first, stream, config, message):
    """Without ``given`` these ran on the model's settings in silence (``head="ncm"`` continued an slda model)."""
    model = _first(stores[0], tmp_path / "first", *first)
    out = tmp_path / "next"
    with pytest.raises(FoalPipeError, match=message):
        _continue(model, stores[1], out, stream, config)
    assert not out.exists()


def test_settings_a_python_caller_gives_as_the_model_has_them_continue(stores, tmp_path):
    """The model's own values, and the default grid given as a list, are no conflict: the weights are the ridge
    solution over both stores' rows."""
    model = _first(stores[0], tmp_path / "first", "--gamma", 0.5)
    config = ModelConfig(gamma=0.5, projection_dim=D, activation="sigmoid", gamma_grid=list(DEFAULT_GAMMA_GRID))
    _continue(model, stores[1], tmp_path / "next", config=config)
    P = read_model(model)[0]["projection"]
    x, y = [], []
    for store, ids in ((stores[0], np.array([0, 1, 2, 3])), (stores[1], np.array([4, 1, 5]))):  # gnu, dog, owl by name
        group = zarr.open_group(str(store), mode="r")
        x.append(np.asarray(group["train/features"][:]))
        y.append(ids[np.asarray(group["train/labels"][:])])
    H = 1.0 / (1.0 + np.exp(-np.vstack(x) @ P))
    W = np.linalg.solve(H.T @ H + 0.5 * np.eye(D), H.T @ np.eye(6)[np.concatenate(y)])
    tensors = read_model(tmp_path / "next" / "model.safetensors")[0]
    np.testing.assert_allclose(tensors["W"], W, atol=1e-10)


@pytest.mark.parametrize("head, rows", [("ridge", None), ("ncm", "activations"), ("slda", "activations"),
                                        ("balanced", None)])
def test_a_continued_runs_metrics_record_its_head_rows_and_no_seed_it_did_not_draw(stores, tmp_path, head, rows):
    """A continued ncm on the activations recorded no ``head_rows`` (as if on the store's features), and every
    continued run recorded ``seed`` 0 and ``projection_init`` uniform though its projection was the model's (here
    drawn by seed 3, normal)."""
    extra = ("--head-rows", "activations") if rows else ()
    model = _first(stores[0], tmp_path / "first", "--head", head, "--seed", 3, "--projection-init", "normal",
                   "--activation", "relu", *extra)
    first = json.loads((tmp_path / "first" / "metrics.json").read_text())
    result = invoke("learn", "--init-model", model, "--features", stores[1], "--out", tmp_path / "next", "--tasks", 2)
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "next" / "metrics.json").read_text())
    assert metrics.get("head_rows") == first.get("head_rows") == rows
    projection = read_model(tmp_path / "next" / "model.safetensors")[0]["projection"]
    assert projection.tobytes() == read_model(model)[0]["projection"].tobytes()
    default = Expansion.draw(D_IN, D, "uniform", "identity", 0, "float64").components_
    assert not np.array_equal(projection, default)  # what seed 0, uniform would have drawn
    assert "seed" not in metrics and "projection_init" not in metrics
    assert metrics["order_seed"] == 0 and metrics["activation"] == "relu" and metrics["projection_dim"] == D
    assert metrics["continuation"]["init_model"] == str(model)
