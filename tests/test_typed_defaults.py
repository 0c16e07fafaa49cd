"""An option typed at its stated default gives the same bytes as leaving it out: ``foal-pipe table``'s files and the
fingerprints its kept runs are found under (a resumed table must neither redo nor mix runs)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from helpers import build_store, invoke

from foal_pipe.cli.options import MAX_MEMORY_TEXT, STREAM
from foal_pipe.protocol import table as engine
from foal_pipe.protocol.capabilities import Settings
from foal_pipe.protocol.config import EvaluationConfig, ExecutionConfig, ModelConfig, StreamConfig
from foal_pipe.protocol.tablekept import fingerprint

FILES = ("table.json", "table.md", "table.csv", "table.tex", "table.png")
#: Every option of the audit typed at its stated default (``foal-pipe table --help``).
AUDIT_DEFAULTS = ("--heads", "ridge", "--order-seeds", "0,1,2", "--tasks", "10", "--gamma", "auto", "--select",
                  "loo_accuracy", "--loo-sample", "4096", "--seed", "0", "--batch-size", str(STREAM.batch_size),
                  "--activation", "sigmoid")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_store(tmp_path_factory.mktemp("typed") / "a.zarr", n_train=240, n_test=96)


def _table(store, out, monkeypatch, *args):
    """table.py's files (bytes) and the fingerprints of its kept runs, in the order computed."""
    keys: list[str | None] = []
    monkeypatch.setattr(engine, "fingerprint", lambda *a, **k: keys.append(fingerprint(*a, **k)) or keys[-1])
    result = invoke("table", "--features", store, "--out", out, "--backend", "numpy", *args)
    assert result.exit_code == 0, result.output
    return {name: (out / name).read_bytes() for name in FILES}, keys


def _same_both_ways(store, tmp_path, monkeypatch, common, typed):
    left, left_keys = _table(store, tmp_path / "untyped", monkeypatch, *common)
    right, right_keys = _table(store, tmp_path / "typed", monkeypatch, *common, *typed)
    assert left_keys and left_keys == right_keys
    for name in FILES:
        assert left[name] == right[name], name
    return json.loads(left["table.json"])


def test_every_table_default_typed_gives_the_same_bytes_and_kept_runs(store, tmp_path, monkeypatch):
    doc = _same_both_ways(store, tmp_path, monkeypatch, ("--projection-dim", "24"),
                          (*AUDIT_DEFAULTS, "--max-memory", MAX_MEMORY_TEXT, "--stream", "disjoint"))
    assert doc["settings"]["model"]["activation"] is None  # as an untyped table has always recorded it
    assert doc["tasks"] == [10] and doc["order_seeds"] == [0, 1, 2]


@pytest.mark.parametrize(("heads", "typed"), [
    ("ridge,balanced,dual", ("--activation", "sigmoid", "--compensation", "1")),
    ("ridge,dual", ("--head-option", "compensation=1.0")),
    ("ridge,slda", ("--shrinkage", "1e-4")),
    ("fecam", ("--shrinkage", "1", "--head-option", "shrinkage_offdiag=0")),
])
def test_head_defaults_typed_give_the_same_bytes_and_kept_runs(store, tmp_path, monkeypatch, heads, typed):
    common = ("--heads", heads, "--order-seeds", "0", "--tasks", "3",
              *(("--projection-dim", "24") if heads != "fecam" else ()))
    doc = _same_both_ways(store, tmp_path, monkeypatch, common, typed)
    model = doc["settings"]["model"]
    assert (model["activation"], model["shrinkage"], model["shrinkage_offdiag"], model["compensation"]) == (None,) * 4


def test_identity_without_a_projection_is_its_default(store, tmp_path, monkeypatch):
    common = ("--order-seeds", "0", "--tasks", "3", "--projection-dim", "0", "--gamma", "1")
    doc = _same_both_ways(store, tmp_path, monkeypatch, common, ("--activation", "identity"))
    assert doc["settings"]["model"]["activation"] is None


def test_a_value_other_than_the_default_is_still_recorded():
    """sigmoid without a projection is not its default (identity); a shrinkage shared by slda (default 1e-4) and fecam
    (default 1) is fecam's non-default, so kept; dual's compensation 2 is kept."""
    from foal_pipe.protocol.tablekept import recorded_settings

    settings = Settings(StreamConfig(), ModelConfig(projection_dim=0, activation="sigmoid",
                                                    head_options={"shrinkage": 1e-4, "compensation": 2.0}),
                        EvaluationConfig(), ExecutionConfig())
    model = recorded_settings(settings, ("slda", "fecam", "dual")).model
    assert model.activation == "sigmoid"
    assert dict(model.head_options) == {"shrinkage": 1e-4, "compensation": 2.0}
    model = recorded_settings(settings, ("slda", "dual")).model
    assert dict(model.head_options) == {"compensation": 2.0}
    relu = replace(settings, model=replace(settings.model, activation="relu", projection_dim=24, head_options={}))
    assert recorded_settings(relu, ("ridge",)).model.activation == "relu"


def test_learn_head_rows_typed_at_the_heads_own_rows_records_the_same(store, tmp_path):
    """``--head-rows features`` on a head on the store's features is its default: the same metrics.json bytes."""
    outs = []
    for name, extra in (("plain", []), ("typed", ["--head-rows", "features"])):
        out = tmp_path / name
        result = invoke("learn", "--features", store, "--out", out, "--head", "slda", "--tasks", "2", *extra)
        assert result.exit_code == 0, result.output
        outs.append(out)
    assert "head_rows" not in json.loads((outs[0] / "metrics.json").read_text())  # None: not written
    assert (outs[0] / "metrics.json").read_bytes() == (outs[1] / "metrics.json").read_bytes()
    assert (outs[0] / "model.safetensors").read_bytes() == (outs[1] / "model.safetensors").read_bytes()
