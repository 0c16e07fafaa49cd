"""The model-file audit: files that could not have been written as they claim, or that readers took with a guessed
default, are refused in one line naming the file; a FIFO as a model is refused without opening it.

Before: a run's metrics.json recording a checksum was paired with a checksum-less file; a file relabelled version 1
(checksum removed) switched off integrity; D = 0 predicted class 0 for every row; a FIFO blocked for good; head
options of other types and missing activations were taken; int32 class ids accepted; messages pointed elsewhere.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, invoke

import foal_pipe
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.classifier import AnalyticClassifier
from foal_pipe.model.modelfile import read_model, write_model
from foal_pipe.store import open_store, write_store

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["ant", "bee", "cow", "dog"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A small store and the model files of ridge (two seeds, gram and rls) and of three heads, learned on it."""
    root = tmp_path_factory.mktemp("model_audit")
    rng = np.random.default_rng(0)
    means = rng.normal(size=(4, 8)) * 0.7  # classes overlap: predictions depend on the activation

    def split(n):
        y = np.arange(n) % 4
        return (means[y] + rng.normal(size=(n, 8))).astype(np.float32), y

    paths = {"store": write_store(root / "s.zarr", split(160), split(40), NAMES, chunk_rows=64)}
    ridge = ("--projection-dim", "16", "--gamma", "1")
    for name, extra in {"ridge": ridge, "seed7": (*ridge, "--seed", "7"), "rls": (*ridge, "--engine", "rls"),
                        "slda": ("--head", "slda"), "dual": ("--head", "dual", "--projection-dim", "16"),
                        "balanced": ("--head", "balanced", "--projection-dim", "16")}.items():
        result = invoke("learn", "--features", paths["store"], "--out", root / name, "--tasks", "2", *extra)
        assert result.exit_code == 0, result.output
        paths[name] = root / name
    return paths


def _parts(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _rewrite(src: Path, dst: Path, drop=(), tensors=None, **meta) -> Path:
    """``src`` with metadata keys dropped or set (values as JSON) and tensors replaced, written by hand (no checks,
    no new checksum)."""
    header, buffer = _parts(src.read_bytes())
    arrays = {k: np.frombuffer(buffer[slice(*v["data_offsets"])], dtype={"F64": np.float64, "I64": np.int64,
                                                                           "F32": np.float32}[v["dtype"]])
              .reshape(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    arrays |= tensors or {}
    strings = {k: v for k, v in header.pop("__metadata__").items() if k not in drop}
    strings |= {k: json.dumps(v) for k, v in meta.items()}
    out, offset, blobs = {"__metadata__": strings}, 0, []
    codes = {np.dtype(np.float64): "F64", np.dtype(np.int64): "I64", np.dtype(np.float32): "F32",
             np.dtype(np.int32): "I32"}
    for k in sorted(arrays, key=lambda k: (-arrays[k].dtype.itemsize, k)):
        blob = np.ascontiguousarray(arrays[k]).tobytes()
        out[k] = {"dtype": codes[arrays[k].dtype], "shape": list(arrays[k].shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(out, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    dst.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return dst


def _version_1(src: Path, dst: Path, drop=(), **changes) -> Path:
    """``src`` as a version-1 writer would have written it: no checksum and none of the later provenance."""
    return _rewrite(src, dst, drop=("checksum", "learned_from", "learned_data", *drop), format_version=1, **changes)


def _refused(fn) -> str:
    with pytest.raises(FoalPipeError) as info:
        fn()
    assert "\n" not in str(info.value)
    return str(info.value)


def _sigmoid_predictions(model: Path, X: np.ndarray) -> np.ndarray:
    """Predictions computed from the file's own tensors, independently of foal-pipe's reader."""
    tensors, _ = read_model(model)
    scores = (1 / (1 + np.exp(-(X.astype(np.float64) @ tensors["projection"])))) @ tensors["W"]
    return tensors["classes"][np.argmax(scores, axis=1)]


# --- 1. evaluate: a checksum-less file is not the model of a run that records a checksum -----------------------

def test_evaluate_refuses_a_file_without_the_checksum_its_run_records(runs, tmp_path):
    other = _version_1(runs["seed7"] / "model.safetensors", tmp_path / "v1.safetensors")
    read_model(other)  # a well-formed version-1 file in itself
    result = invoke("evaluate", "--run", runs["ridge"], "--model", other, "--out", tmp_path / "ev", "--no-plots")
    assert_one_line_error(result, "is not the model run", "it carries no checksum, unlike the sha256:")
    assert not (tmp_path / "ev").exists()
    copy = tmp_path / "run"  # the run's own file replaced by it
    copy.mkdir()
    (copy / "metrics.json").write_bytes((runs["ridge"] / "metrics.json").read_bytes())
    (copy / "model.safetensors").write_bytes(other.read_bytes())
    result = invoke("evaluate", "--run", copy, "--out", tmp_path / "ev2", "--no-plots")
    assert_one_line_error(result, "it carries no checksum", "the file was replaced after the run")


# --- 2. version 1: no later metadata; rls files cannot be checked -----------------------------------------------

def test_a_file_relabelled_version_1_with_later_metadata_is_refused_everywhere(runs, tmp_path):
    good = runs["ridge"] / "model.safetensors"
    bad = _rewrite(good, tmp_path / "relu.safetensors", drop=("checksum",), format_version=1, activation="relu")
    reason = "declares format_version 1 but holds metadata 'learned_from'"
    for read in (lambda: read_model(bad), lambda: foal_pipe.load_model(bad), lambda: AnalyticClassifier.load(bad)):
        assert reason in _refused(read)
    assert_one_line_error(invoke("predict", "--model", bad, "--features", runs["store"]), reason)
    out = tmp_path / "continued"
    result = invoke("learn", "--init-model", bad, "--features", runs["store"], "--out", out, "--tasks", "2")
    assert_one_line_error(result, reason)
    assert not out.exists()


def test_a_genuine_version_1_gram_file_still_predicts_as_the_sigmoid_gives(runs, tmp_path):
    old = _version_1(runs["ridge"] / "model.safetensors", tmp_path / "old.safetensors", drop=("activation",))
    X = np.concatenate([X for _, X in open_store(runs["store"]).split("test").iter_chunks()])
    np.testing.assert_array_equal(foal_pipe.load_model(old).predict(X), _sigmoid_predictions(old, X))


def test_a_version_1_rls_file_is_refused_as_uncheckable(runs, tmp_path):
    good = runs["rls"] / "model.safetensors"
    W = read_model(good)[0]["W"] * np.array([1, 1, 1, 100.0])
    bad = _version_1(good, tmp_path / "rls.safetensors", tensors={"W": W})
    for read in (lambda: read_model(bad), lambda: foal_pipe.load_model(bad)):
        assert "a version-1 rls model carries no checksum" in _refused(read)
    assert_one_line_error(invoke("predict", "--model", bad, "--features", runs["store"]), "version-1 rls")


# --- 3. zero-width dimensions -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", ["D", "d"])
def test_a_model_of_zero_width_is_refused_on_write_and_read(runs, tmp_path, dim):
    tensors, meta = read_model(runs["ridge"] / "model.safetensors")
    C, (d, D) = tensors["W"].shape[1], tensors["projection"].shape
    D, d = (0, d) if dim == "D" else (D, 0)
    tensors |= {"W": np.zeros((D, C)), "G": np.zeros((D, D)), "Q": np.zeros((D, C)), "projection": np.zeros((d, D))}
    meta = {k: v for k, v in meta.items() if k not in ("checksum", "format", "format_version")}
    assert f"{dim} = 0" in _refused(lambda: write_model(tmp_path / "w.safetensors", tensors, meta))
    bad = _rewrite(runs["ridge"] / "model.safetensors", tmp_path / "r.safetensors", drop=("checksum",),
                   format_version=1, tensors=tensors)
    assert f"{dim} = 0" in _refused(lambda: read_model(bad))


# --- 4. a FIFO is refused before any open -----------------------------------------------------------------------

def test_a_fifo_as_model_is_refused_without_blocking(runs, tmp_path):
    fifo = tmp_path / "model.fifo"
    os.mkfifo(fifo)
    script = (
        "import sys, foal_pipe\n"
        "from foal_pipe.errors import FoalPipeError\n"
        "from foal_pipe.model.modelfile import stored_header\n"
        "from foal_pipe.report.discovery import load_run\n"
        "print(stored_header(sys.argv[1]))\n"
        "for call in (lambda: foal_pipe.load_model(sys.argv[1]), lambda: load_run(sys.argv[2], model=sys.argv[1])):\n"
        "    try:\n        call()\n    except FoalPipeError as exc:\n        print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script, str(fifo), str(runs["ridge"])], capture_output=True, text=True,
                          timeout=30, env=env)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[0] == "({}, {})", done.stdout + done.stderr
    assert lines[1:] == [f"model file {fifo} is not a file; pass a model.safetensors written by `foal-pipe learn`"] * 2


# --- 5. head options as the head holds them ---------------------------------------------------------------------

@pytest.mark.parametrize(("head", "key", "value", "said"), [
    # a flag or text is no number to the heads since the twentieth stop: the head refuses it outright
    ("slda", "shrinkage", True, "holds a value the slda head refuses (slda's shrinkage must be a number in [0, 1] or "
                                "'oas', got True"),
    ("slda", "shrinkage", "0.5", "holds a value the slda head refuses (slda's shrinkage must be a number in [0, 1] or "
                                 "'oas', got '0.5'"),
    ("dual", "batch_size", 10.0, "holds batch_size=10.0 (float)"), ("dual", "gamma", 1, "holds gamma=1 (int)")])
def test_head_options_of_another_type_are_refused(runs, tmp_path, head, key, value, said):
    tensors, meta = read_model(runs[head] / "model.safetensors")
    meta = {k: v for k, v in meta.items() if k not in ("checksum", "format", "format_version")}
    write_model(tmp_path / "same.safetensors", tensors, meta)  # as written: accepted
    meta["head_options"] = {**meta["head_options"], key: value}
    text = _refused(lambda: write_model(tmp_path / "w.safetensors", tensors, meta))
    assert f"metadata 'head_options' {said}" in text


# --- 6. a missing activation is not guessed ---------------------------------------------------------------------

def test_a_missing_activation_is_refused_where_the_format_records_it(runs, tmp_path):
    tensors, meta = read_model(runs["ridge"] / "model.safetensors")
    meta = {k: v for k, v in meta.items() if k not in ("checksum", "format", "format_version", "activation")}
    bare = write_model(tmp_path / "ridge.safetensors", tensors, meta)
    assert "metadata 'activation' is missing" in _refused(lambda: foal_pipe.load_model(bare))
    assert_one_line_error(invoke("predict", "--model", bare, "--features", runs["store"]), "'activation' is missing")
    tensors, meta = read_model(runs["balanced"] / "model.safetensors")
    meta = {k: v for k, v in meta.items() if k not in ("checksum", "format", "format_version", "activation")}
    bare = write_model(tmp_path / "balanced.safetensors", tensors, meta)
    assert "metadata 'activation' is missing" in _refused(lambda: foal_pipe.load_model(bare))


# --- 7. dtypes as the docs give them ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["classes", "counts"])
def test_class_ids_and_counts_must_be_int64(runs, tmp_path, name):
    tensors, meta = read_model(runs["ridge"] / "model.safetensors")
    meta = {k: v for k, v in meta.items() if k not in ("checksum", "format", "format_version")}
    tensors[name] = tensors[name].astype(np.int32)
    text = _refused(lambda: write_model(tmp_path / "w.safetensors", tensors, meta))
    assert f"tensor {name!r} has dtype int32 but must be an integer of dtype int64" in text


# --- 8. messages ------------------------------------------------------------------------------------------------

def test_messages_name_the_file_and_the_problem(runs, tmp_path):
    good = runs["ridge"] / "model.safetensors"
    cos = _version_1(good, tmp_path / "cos.safetensors", activation="cos")
    text = _refused(lambda: foal_pipe.load_model(cos))
    assert text.startswith(f"{cos}: metadata 'activation' is 'cos', whose projection bias a ridge model file does not")
    tensors, meta = read_model(runs["balanced"] / "model.safetensors")
    meta = {k: v for k, v in meta.items() if k not in ("checksum", "format", "format_version")} | {"activation": "cos"}
    bad = write_model(tmp_path / "b.safetensors", tensors, meta)
    text = _refused(lambda: foal_pipe.load_model(bad))
    assert text.startswith(f"{bad}: activation 'cos' needs the projection's bias, but the file holds no tensor")
    assert "the model path is empty" in _refused(lambda: foal_pipe.load_model(""))
    assert "ends with '/'" in _refused(lambda: read_model(f"{good}/"))
    text = _refused(lambda: read_model(_rewrite(good, tmp_path / "v.safetensors", format_version="2")))
    assert "metadata 'format_version' ('2') is a string" in text
    long = _rewrite(runs["slda"] / "model.safetensors", tmp_path / "h.safetensors", head="k" * 80)
    assert f"metadata 'head' ('{'k' * 56}...) is not a head" in _refused(lambda: read_model(long))
