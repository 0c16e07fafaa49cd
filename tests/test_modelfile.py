"""The model file: byte layout against the safetensors spec, byte-stable writes, and every kind of bad file refused."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from foal_pipe.errors import FoalPipeError
from foal_pipe.model.classifier import AnalyticClassifier
from foal_pipe.model.modelfile import read_model, validate_model, write_model

ROOT = Path(__file__).resolve().parents[1]


def model(engine: str = "gram", dtype: str = "float64") -> tuple[dict[str, np.ndarray], dict]:
    """A small consistent model: D = 4 activations, C = 3 classes (ids 0, 2, 5), d = 2 features."""
    rng = np.random.default_rng(0)
    H = rng.random((10, 4))
    G = (H.T @ H).astype(dtype)
    Q = rng.normal(size=(4, 3)).astype(dtype)
    W = np.linalg.solve(G.astype(np.float64) + 0.5 * np.eye(4), Q.astype(np.float64))  # W solves (G + gamma I) W = Q
    tensors = {"W": W, "classes": np.array([0, 2, 5]), "projection": rng.normal(size=(2, 4))}
    tensors |= {"G": G, "Q": Q} if engine == "gram" else {"R": G}
    meta = {"gamma": 0.5, "engine": engine, "dtype": dtype, "n_samples_seen": 10, "class_names": ["a", "b", "c"],
            "dataset": "toy", "encoder": {"name": "pixels", "image_size": 8}}
    return tensors, meta


def parse(data: bytes) -> tuple[dict, bytes, int]:
    """The safetensors layout read by hand (the spec, not the library): header, byte buffer, header length."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :], n


@pytest.mark.parametrize(("engine", "dtype"), [("gram", "float64"), ("gram", "float32"), ("rls", "float32")])
def test_round_trip_through_the_safetensors_library(tmp_path, engine, dtype):
    tensors, meta = model(engine, dtype)
    path = write_model(tmp_path / "m.safetensors", tensors, meta)
    loaded = load_file(str(path))  # the library's own reader
    assert sorted(loaded) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value)
        assert loaded[name].dtype == value.dtype
    with safe_open(str(path), framework="numpy") as f:
        stored = {key: json.loads(value) for key, value in f.metadata().items()}
    assert stored.pop("checksum").startswith("sha256:")
    assert stored == meta | {"format": "foal-pipe/model", "format_version": 2}
    got, got_meta = read_model(path)
    got_meta.pop("checksum")
    assert got_meta == stored
    for name, value in tensors.items():
        np.testing.assert_array_equal(got[name], value)


def test_layout_follows_the_spec(tmp_path):
    tensors, meta = model("gram", "float32")
    data = write_model(tmp_path / "m.safetensors", tensors, meta).read_bytes()
    header, buffer, n = parse(data)
    assert n % 8 == 0 and data[8 : 8 + n].rstrip(b" ").endswith(b"}")
    text = data[8 : 8 + n].rstrip(b" ").decode()
    assert text == json.dumps(header, sort_keys=True, separators=(",", ":"))  # sorted keys, no spaces
    entries = sorted((v["data_offsets"], k) for k, v in header.items() if k != "__metadata__")
    # no holes: each tensor starts where the previous ends, the last ends at the file's end
    assert [e[0][0] for e in entries] == [0] + [e[0][1] for e in entries[:-1]] and entries[-1][0][1] == len(buffer)
    order = [k for _, k in entries]
    sizes = {k: tensors[k].dtype.itemsize for k in order}
    assert order == sorted(order, key=lambda k: (-sizes[k], k))  # largest element first, then by name
    for offsets, name in entries:
        assert (8 + n + offsets[0]) % sizes[name] == 0  # every tensor aligned to its element size
        value = np.frombuffer(buffer[offsets[0] : offsets[1]], dtype=tensors[name].dtype.newbyteorder("<"))
        np.testing.assert_array_equal(value.reshape(tensors[name].shape), tensors[name])


def test_same_model_gives_the_same_bytes_in_any_process(tmp_path):
    tensors, meta = model()
    a = write_model(tmp_path / "a.safetensors", tensors, meta).read_bytes()
    b = write_model(tmp_path / "b.safetensors", dict(reversed(tensors.items())), dict(reversed(meta.items())))
    assert a == b.read_bytes()
    script = (
        "import sys; sys.path.insert(0, sys.argv[2]); from tests.test_modelfile import model; "
        "from foal_pipe.model.modelfile import write_model; write_model(sys.argv[1], *model())"
    )
    for seed in ("1", "2", "3"):
        out = tmp_path / f"p{seed}.safetensors"
        env = os.environ | {"PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", script, str(out), str(ROOT)], check=True, env=env, cwd=ROOT)
        assert out.read_bytes() == a


def test_read_only_named_tensors(tmp_path):
    path = write_model(tmp_path / "m.safetensors", *model())
    tensors, _ = read_model(path, names=("W", "classes"))
    assert sorted(tensors) == ["W", "classes"]


class Text(str):
    """Metadata stored verbatim, not as JSON."""


def raw(path: Path, tensors: dict, meta: dict | None) -> Path:
    """A safetensors file written by the library, bypassing foal-pipe's checks (metadata values as JSON text)."""
    strings = None if meta is None else {k: v if isinstance(v, Text) else json.dumps(v) for k, v in meta.items()}
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path), metadata=strings)
    return path


FULL = {"format": "foal-pipe/model", "format_version": 1}


def _edit(tensors=None, meta=None, drop=(), engine="gram"):
    def make(tmp_path):
        t, m = model(engine)
        m = m | FULL
        t |= tensors(t) if tensors else {}
        m |= meta or {}
        for key in drop:
            t.pop(key, None)
            m.pop(key, None)
        return raw(tmp_path / "bad.safetensors", t, m)
    return make


BAD = {
    "another tool": (lambda p: raw(p / "x.safetensors", {"weight": np.ones((2, 2))}, None),
                     "holds no foal-pipe metadata"),
    "other metadata": (lambda p: raw(p / "x.safetensors", model()[0], {"format": Text("pt")}),
                       "metadata 'format' is 'pt'"),
    "format": (_edit(meta={"format": "foal-pipe/features"}), "metadata 'format' is 'foal-pipe/features'"),
    "version 4": (_edit(meta={"format_version": 4}), "this foal-pipe reads versions 1, 2 and 3"),
    "version 3 ridge": (_edit(meta={"format_version": 3}), "a version-3 file names no 'head'"),
    "version 1 head": (_edit(meta={"head": "ncm"}), "a version-1 file cannot hold a head (version 3 does)"),
    "version true": (_edit(meta={"format_version": True}), "format_version True but this foal-pipe reads versions 1, 2 and 3"),
    "version 1.0": (_edit(meta={"format_version": 1.0}), "format_version 1.0 but"),
    "no W": (_edit(drop=("W",)), "tensor 'W' is missing"),
    "no classes": (_edit(drop=("classes",)), "tensor 'classes' is missing"),
    "stray tensor": (_edit(tensors=lambda t: {"bias": np.ones(3)}), "unexpected tensor 'bias'"),
    "no gamma": (_edit(drop=("gamma",)), "metadata 'gamma' is missing"),
    "gamma 0": (_edit(meta={"gamma": 0}), "metadata 'gamma' (0) must be a positive number"),
    "gamma -1": (_edit(meta={"gamma": -1.0}), "must be a positive number"),
    "gamma string": (_edit(meta={"gamma": "1"}), "metadata 'gamma' ('1') must be a positive number"),
    "gamma true": (_edit(meta={"gamma": True}), "must be a positive number"),
    "gamma NaN": (_edit(meta={"gamma": float("nan")}), "must be a positive number"),
    "gamma inf": (_edit(meta={"gamma": float("inf")}), "must be a positive number"),
    "gamma 10**400": (_edit(meta={"gamma": 10**400}), "must be a positive number"),
    "no version": (_edit(drop=("format_version",)), "format_version None but"),
    "engine": (_edit(meta={"engine": "sgd"}), "metadata 'engine' ('sgd') must be one of 'gram', 'rls'"),
    "dtype": (_edit(meta={"dtype": "float16"}), "metadata 'dtype' ('float16') must be one of"),
    "n_samples -1": (_edit(meta={"n_samples_seen": -1}), "must be a non-negative integer"),
    "n_samples 1.5": (_edit(meta={"n_samples_seen": 1.5}), "must be a non-negative integer"),
    "not JSON": (_edit(meta={"dataset": Text("toy")}), "metadata 'dataset' ('toy') is not JSON"),
    "dataset number": (_edit(meta={"dataset": 3}), "metadata 'dataset' (3) must be a string"),
    "encoder list": (_edit(meta={"encoder": ["pixels"]}), "metadata 'encoder' (['pixels']) must be a mapping"),
    "names short": (_edit(meta={"class_names": ["a", "b"]}), "has 2 names but W has 3 columns"),
    "names numbers": (_edit(meta={"class_names": [1, 2, 3]}), "must be a list of strings"),
    "names string": (_edit(meta={"class_names": "abc"}), "must be a list of strings"),
    "names twice": (_edit(meta={"class_names": ["a", "b", "a"]}), "names 'a' twice"),
    "activation": (_edit(meta={"activation": "tanh"}), "metadata 'activation' ('tanh') must be one of 'sigmoid'"),
    "W 1-D": (_edit(tensors=lambda t: {"W": t["W"].ravel()}), "tensor 'W' has shape (12,) but must have 2 dimensions"),
    "W vs classes": (_edit(tensors=lambda t: {"classes": np.array([0, 2, 5, 7])}),
                     "tensor 'classes' has shape (4,) but 'W' has C = 3"),
    "Q columns": (_edit(tensors=lambda t: {"Q": t["Q"][:, :2]}), "tensor 'Q' has shape (4, 2) but 'W' has C = 3"),
    "G not square": (_edit(tensors=lambda t: {"G": t["G"][:, :3]}), "tensor 'G' has shape (4, 3) but 'W' has D = 4"),
    "projection": (_edit(tensors=lambda t: {"projection": np.ones((2, 5))}), "'projection' has shape (2, 5)"),
    "no G": (_edit(drop=("G",)), "the gram engine's state tensor 'G' is missing"),
    "no R": (_edit(engine="rls", drop=("R",)), "the rls engine's state tensor 'R' is missing"),
    "R in gram": (_edit(tensors=lambda t: {"R": t["G"]}), "tensor 'R' does not belong to the gram engine"),
    "state dtype": (_edit(tensors=lambda t: {"G": t["G"].astype(np.float32)}),
                    "G is float32 but metadata 'dtype' says"),
    "W ints": (_edit(tensors=lambda t: {"W": np.ones((4, 3), dtype=np.int64)}),
               "tensor 'W' has dtype int64 but must be a float"),
    "W float16": (_edit(tensors=lambda t: {"W": t["W"].astype(np.float16)}), "tensor 'W' has dtype F16"),
    "classes float": (_edit(tensors=lambda t: {"classes": np.array([0.0, 2.0, 5.0])}),
                      "tensor 'classes' has dtype float64 but must be an integer"),
    "classes bool": (_edit(tensors=lambda t: {"classes": np.array([True, False, True])}), "has dtype BOOL"),
    "classes negative": (_edit(tensors=lambda t: {"classes": np.array([-1, 2, 5])}), "class id -1 is negative"),
    "classes unsorted": (_edit(tensors=lambda t: {"classes": np.array([2, 0, 5])}), "not sorted and unique"),
    "classes twice": (_edit(tensors=lambda t: {"classes": np.array([0, 2, 2])}), "not sorted and unique"),
    "W NaN": (_edit(tensors=lambda t: {"W": np.where(np.eye(4, 3) > 0, np.nan, t["W"])}), "'W' holds NaN or inf"),
    "projection inf": (_edit(tensors=lambda t: {"projection": np.full((2, 4), np.inf)}),
                       "'projection' holds NaN or inf"),
    "G NaN": (_edit(tensors=lambda t: {"G": np.full((4, 4), np.nan)}), "'G' holds NaN or inf"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_model_files_are_refused_in_one_line(tmp_path, case):
    make, message = BAD[case]
    path = make(tmp_path)
    with pytest.raises(FoalPipeError) as info:
        read_model(path)
    text = str(info.value)
    assert message in text and "\n" not in text, text
    assert str(path) in text  # names the file
    with pytest.raises(FoalPipeError, match="^" + str(path).replace(".", r"\.")):
        AnalyticClassifier.load(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "header too small"),
        (b"garbage, not a model", "not a safetensors model file"),
        (struct.pack("<Q", 10**12) + b"{}", "header too large"),
        (struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc", "invalid UTF-8"),
    ],
)
def test_garbage_is_refused(tmp_path, content, message):
    path = tmp_path / "m.safetensors"
    path.write_bytes(content)
    with pytest.raises(FoalPipeError, match="not a safetensors model file") as info:
        read_model(path)
    assert message in str(info.value)


def test_truncated_and_altered_files_are_refused(tmp_path):
    good = write_model(tmp_path / "m.safetensors", *model()).read_bytes()
    path = tmp_path / "cut.safetensors"
    for cut in (7, 40, len(good) // 2, len(good) - 1):
        path.write_bytes(good[:cut])
        with pytest.raises(FoalPipeError, match="damaged, truncated or another format"):
            read_model(path)
    header, _, n = parse(good)
    header["__metadata__"]["gamma"] = "-0.5"  # a hand-edited header, same length
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    path.write_bytes(struct.pack("<Q", n) + text.ljust(n) + good[8 + n :])
    with pytest.raises(FoalPipeError, match="metadata 'gamma' .-0.5. must be a positive number"):
        read_model(path)


def test_missing_and_directory_paths(tmp_path):
    with pytest.raises(FoalPipeError, match="does not exist"):
        read_model(tmp_path / "none.safetensors")
    with pytest.raises(FoalPipeError, match="is not a file"):
        read_model(tmp_path)


def test_write_refuses_what_read_would_refuse_and_writes_nothing(tmp_path):
    tensors, meta = model()
    path = tmp_path / "m.safetensors"
    with pytest.raises(FoalPipeError, match="'W' holds NaN or inf"):
        write_model(path, tensors | {"W": np.full((4, 3), np.nan)}, meta)
    with pytest.raises(FoalPipeError, match="cannot be stored as JSON"):
        write_model(path, tensors, meta | {"note": {1, 2}})
    with pytest.raises(FoalPipeError, match="metadata 'engine' is missing"):
        write_model(path, tensors, {k: v for k, v in meta.items() if k != "engine"})
    assert list(tmp_path.iterdir()) == []


def test_validate_checks_header_shapes_without_values():
    from foal_pipe.model.modelfile import TensorInfo

    tensors, meta = model()
    header = {k: TensorInfo(v.shape, v.dtype) for k, v in tensors.items()}
    validate_model(header, meta | FULL)  # consistent: no error
    header["Q"] = TensorInfo((4, 2), np.dtype("float64"))
    with pytest.raises(FoalPipeError, match="'Q' has shape"):
        validate_model(header, meta | FULL)


def test_classifier_round_trip_keeps_names_and_state(tmp_path):
    rng = np.random.default_rng(1)
    H, y = rng.random((50, 6)), rng.integers(0, 4, 50) * 2
    clf = AnalyticClassifier(gamma=0.3).partial_fit(H, y)
    path = clf.save(tmp_path / "m.safetensors", class_names=["zero", "two", "four", "six"])
    _, meta = read_model(path)
    assert meta["class_names"] == ["zero", "two", "four", "six"] and meta["n_samples_seen"] == 50
    loaded = AnalyticClassifier.load(path)
    np.testing.assert_array_equal(loaded.weights_, clf.weights_)
    np.testing.assert_array_equal(loaded.classes_, [0, 2, 4, 6])
    with pytest.raises(FoalPipeError, match="has 3 names but W has 4 columns"):
        clf.save(tmp_path / "bad.safetensors", class_names=["a", "b", "c"])
    assert not (tmp_path / "bad.safetensors").exists()


@pytest.mark.parametrize("counts, seen, message", [
    ([4, -1], 3, "row count of a class is negative"),
    ([4, 2], 5, r"the class row counts sum to 6, more than 'n_samples_seen' \(5\)"),
])
def test_class_counts_that_cannot_be_are_refused(tmp_path, counts, seen, message):
    """The gram state's rows per class: none negative (GCV divides by their sum; 0 is a class declared by
    ``partial_fit(classes=...)`` before its rows), together at most the rows seen (fewer where classes were
    restricted away, ``RidgeStatistics.restrict``)."""
    tensors = {"W": np.zeros((3, 2)), "classes": np.array([0, 1]), "G": np.eye(3), "Q": np.zeros((3, 2)),
               "counts": np.array(counts)}
    meta = {"gamma": 1.0, "engine": "gram", "dtype": "float64", "n_samples_seen": seen}
    with pytest.raises(FoalPipeError, match=message):
        write_model(tmp_path / "m.safetensors", tensors, meta)


def test_a_class_declared_before_its_rows_saves_and_loads(tmp_path):
    """``partial_fit(classes=...)`` stores a class with 0 rows; its model file is valid (the counts check refuses
    only negative counts and a sum other than ``n_samples_seen``)."""
    X = np.random.default_rng(0).random((10, 3))
    clf = AnalyticClassifier().partial_fit(X, np.array([0, 1] * 5), classes=[0, 1, 2])
    clf.save(tmp_path / "m.safetensors")
    tensors, meta = read_model(tmp_path / "m.safetensors")
    assert tensors["counts"].tolist() == [5, 5, 0] and meta["n_samples_seen"] == 10
    np.testing.assert_array_equal(AnalyticClassifier.load(tmp_path / "m.safetensors").weights_, clf.weights_)


def test_a_model_of_restricted_statistics_saves_and_loads(tmp_path):
    """``restrict`` keeps ``n`` and drops the other classes' counts: its model's counts sum to less than
    ``n_samples_seen``, which is valid."""
    X = np.random.default_rng(1).random((30, 4))
    full = AnalyticClassifier().fit(X, np.arange(30) % 3)
    kept = AnalyticClassifier.from_statistics(full.statistics_.restrict([0, 1]))
    kept.save(tmp_path / "m.safetensors")
    tensors, meta = read_model(tmp_path / "m.safetensors")
    assert tensors["counts"].tolist() == [10, 10] and meta["n_samples_seen"] == 30
    np.testing.assert_array_equal(AnalyticClassifier.load(tmp_path / "m.safetensors").weights_, kept.weights_)
