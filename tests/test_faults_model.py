"""Issue 24's outside fault test, model family: an altered model file is refused wherever it is read, and the
deployed model refuses inputs it would otherwise truncate, with FoalPipeError as the docs promise.

Before: one flipped bit in `W` gave 10% accuracy with exit 0; an edited `activation`, two swapped
`class_names` or an edited `gamma` were accepted (and `learn --init-model` continued the wrong sums);
`DeployedModel.partial_fit` truncated float labels, took booleans and a dict, dropped imaginary parts, and
raised scikit-learn's ValueError or TypeError for bad inputs.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import foal_pipe
from foal_pipe.cli import app
from foal_pipe.errors import FoalPipeError
from foal_pipe.model.checksum import content_checksum
from foal_pipe.model.classifier import AnalyticClassifier
from foal_pipe.model.modelfile import read_model
from foal_pipe.store import write_store

runner = CliRunner()
NAMES = ["ant", "bee", "cow", "dog"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("faults_model")
    rng = np.random.default_rng(0)
    means = rng.normal(size=(4, 8)) * 2

    def split(n):
        y = np.arange(n) % 4
        return (means[y] + rng.normal(size=(n, 8))).astype(np.float32), y

    store = write_store(root / "s.zarr", split(240), split(80), NAMES, chunk_rows=64)
    result = runner.invoke(app, ["learn", "--features", str(store), "--out", str(root / "run"), "--tasks", "2",
                                 "--projection-dim", "32", "--gamma", "1"])
    assert result.exit_code == 0, result.output
    return store, root / "run" / "model.safetensors"


def _parts(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _join(header: dict, buffer: bytes) -> bytes:
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + buffer


def _flip_w(data: bytes) -> bytes:
    """W[0, 0] with one bit of its exponent flipped, in place."""
    header, buffer = _parts(data)
    at = len(data) - len(buffer) + header["W"]["data_offsets"][0] + 7  # the high byte of the first float64
    return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :]


def _edit_meta(**changes):
    def edit(data: bytes) -> bytes:
        header, buffer = _parts(data)
        for key, value in changes.items():
            if value is None:
                header["__metadata__"].pop(key)
            else:
                header["__metadata__"][key] = json.dumps(value(json.loads(header["__metadata__"][key])))
        return _join(header, buffer)
    return edit


EDITS = {
    "W bit": _flip_w,
    "activation": _edit_meta(activation=lambda _: "relu"),
    "class names": _edit_meta(class_names=lambda names: [names[1], names[0], *names[2:]]),
    "gamma": _edit_meta(gamma=lambda g: g * 2),
}


def _altered(tmp_path: Path, good: Path, edit) -> Path:
    bad = tmp_path / "run" / "model.safetensors"
    bad.parent.mkdir()
    bad.write_bytes(edit(good.read_bytes()))
    return bad


def _refused(fn) -> str:
    with pytest.raises(FoalPipeError) as info:
        fn()
    text = str(info.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_altered_model_file_is_refused_by_every_reader(tmp_path, trained, edit):
    store, good = trained
    bad = _altered(tmp_path, good, EDITS[edit])
    checksum = "its content does not match its checksum"
    # with G and Q read, an edit that breaks (G + gamma I) W = Q is named as such first; the checksum catches all
    reason = checksum if edit in ("activation", "class names") else "W does not solve (G + gamma I) W = Q"
    for read in (lambda: read_model(bad), lambda: AnalyticClassifier.load(bad)):
        assert reason in _refused(read)
    # a reader of W, classes and projection only: the checksum still covers every byte
    assert checksum in _refused(lambda: read_model(bad, names=("W", "classes", "projection")))
    assert reason in _refused(lambda: foal_pipe.load_model(bad))  # reads the file once, every tensor
    result = runner.invoke(app, ["predict", "--model", str(bad), "--features", str(store)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "Error: " in result.output and reason in " ".join(result.output.split())
    out = tmp_path / "continued"
    result = runner.invoke(app, ["learn", "--init-model", str(bad), "--features", str(store), "--out", str(out)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert {reason, checksum} & {r for r in (reason, checksum) if r in " ".join(result.output.split())}
    assert not out.exists()


def test_a_removed_checksum_is_refused(tmp_path, trained):
    bad = _altered(tmp_path, trained[1], _edit_meta(checksum=None))
    assert "version-2 file without the metadata 'checksum'" in _refused(lambda: read_model(bad))


def _version_1(data: bytes, edit=None) -> bytes:
    """The file as foal-pipe wrote it before checksums: format_version 1, no checksum (nor learned_from, which came later)."""
    data = _edit_meta(checksum=None, learned_from=None, format_version=lambda _: 1)(data)
    return edit(data) if edit else data


def test_version_1_files_still_load_with_the_consistency_check(tmp_path, trained):
    store, good = trained
    old = tmp_path / "old.safetensors"
    old.write_bytes(_version_1(good.read_bytes()))
    tensors, meta = read_model(old, names=("W", "classes"))
    assert meta["format_version"] == 1 and sorted(tensors) == ["W", "classes"]
    np.testing.assert_array_equal(tensors["W"], read_model(good)[0]["W"])
    result = runner.invoke(app, ["predict", "--model", str(old), "--features", str(store)])
    assert result.exit_code == 0, result.output
    for edit, reason in ((_flip_w, "relative residual"), (_edit_meta(gamma=lambda g: g * 2), "W implies gamma 1")):
        old.write_bytes(_version_1(good.read_bytes(), edit))
        for names in (None, ("W", "classes", "projection")):  # G and Q are read for the check either way
            text = _refused(lambda names=names: read_model(old, names))
            assert "W does not solve (G + gamma I) W = Q for the stored gamma" in text and reason in text


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_model_relabelled_version_1_is_still_checksum_verified(tmp_path, trained, edit):
    """Issue 34: a version-2 file relabelled version 1 (its checksum kept) skipped the checksum, so an edited
    activation (81.69% instead of 94.93%) or swapped class names predicted with exit 0. Refused now, as edited
    down (the declared version) or altered (the checksum, which covers the version too)."""
    store, good = trained
    bad = _altered(tmp_path, good, lambda data: _edit_meta(format_version=lambda _: 1)(EDITS[edit](data)))
    for read in (lambda: read_model(bad), lambda: read_model(bad, names=("W", "classes", "projection")),
                 lambda: foal_pipe.load_model(bad), lambda: AnalyticClassifier.load(bad)):
        text = _refused(read)
        assert "its content does not match its checksum" in text or "W does not solve" in text, text
    result = runner.invoke(app, ["predict", "--model", str(bad), "--features", str(store)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    relabelled = tmp_path / "relabelled.safetensors"  # the version alone: the checksum covers it
    relabelled.write_bytes(_edit_meta(format_version=lambda _: 1)(good.read_bytes()))
    assert "its content does not match its checksum" in _refused(lambda: read_model(relabelled))
    header, buffer = _parts(relabelled.read_bytes())  # its checksum recomputed: named as a version edited down
    entries = [(name, info["dtype"], info["shape"], [buffer[slice(*info["data_offsets"])]])
               for name, info in header.items() if name != "__metadata__"]
    header["__metadata__"]["checksum"] = json.dumps(content_checksum(header["__metadata__"], entries))
    relabelled.write_bytes(_join(header, buffer))
    assert "declares format_version 1 but carries a checksum" in _refused(lambda: read_model(relabelled))


def test_a_saved_model_carries_a_checksum_over_its_content(tmp_path, trained):
    _, good = trained
    _, meta = read_model(good)
    assert meta["format_version"] == 2 and meta["checksum"].startswith("sha256:") and len(meta["checksum"]) == 71
    model = foal_pipe.load_model(good)
    again = model.save(tmp_path / "again.safetensors")
    assert again.read_bytes() == good.read_bytes()  # the checksum read in is not carried over, but recomputed


# -- DeployedModel and AnalyticClassifier inputs -----------------------------------------------------------------
X4 = np.random.default_rng(3).normal(size=(4, 8))

LABELS = {
    "float ids": ([0.0, 1.7, 2.2, 1.0], "but they hold 0.0 (float)"),
    "booleans": ([True, False, True, True], "but they hold True (bool)"),
    "a dict": ({"ant": 1}, "not dict"),
    "complex": (np.array([1 + 2j, 0, 1, 2]), "but they hold (1+2j) (complex)"),
    "names and ids": ([0, "bee", 1, "cow"], "a mix of names and ids"),
    "bytes": ([b"ant", b"bee", b"cow", b"ant"], "but they hold b'ant' (bytes)"),
    "None": (None, "not NoneType"),
    "2-D": ([[0, 1], [2, 1]], "not an array of shape (2, 2)"),
    "too few": ([0, 1, 2], "3 labels for 4 rows of features"),
}


@pytest.mark.parametrize("case", sorted(LABELS))
def test_partial_fit_refuses_labels_it_would_truncate_or_misread(trained, case):
    model = foal_pipe.load_model(trained[1])
    before = model.classifier.n_samples_seen_
    labels, message = LABELS[case]
    assert message in _refused(lambda: model.partial_fit(X4, labels))
    assert model.classifier.n_samples_seen_ == before and model.class_names == NAMES


FEATURES = {
    "complex": (X4 + 1j, "they hold complex numbers"),
    "1-D": (X4[0], "features have shape (8,) but the model expects (n, 8)"),
    "3-D": (X4[None], "features have shape (1, 4, 8)"),
    "other d": (X4[:, :5], "features have shape (4, 5)"),
    "NaN": (np.where(X4 > 1, np.nan, X4), "features hold NaN or inf (first at row"),
    "no rows": (X4[:0], "features have shape (0, 8)"),
    "strings": (np.full((4, 8), "a"), "they hold <U1 values"),
    "objects": (np.full((4, 8), None), "they hold object values"),
    "ragged": ([[1.0, 2.0], [3.0]], "they hold rows of unequal length"),
}


@pytest.mark.parametrize("case", sorted(FEATURES))
def test_deployed_model_inputs_are_foal_pipe_errors(trained, case):
    model = foal_pipe.load_model(trained[1])
    features, message = FEATURES[case]
    assert message in _refused(lambda: model.predict(features))
    assert message in _refused(lambda: model.partial_fit(features, [0, 1, 2, 3]))  # features are checked first


@pytest.mark.parametrize("X,y,error", [
    (np.ones(5), [0] * 5, ValueError),
    (np.ones((5, 2)), [0, 1, 0], ValueError),
    (np.ones((5, 2)) + 1j, [0, 1, 0, 1, 0], ValueError),
    (np.ones((5, 2)), np.arange(5) + 0.5, ValueError),
    (np.ones((5, 2)), np.array([1 + 1j] * 5), ValueError),
    (np.ones((0, 2)), [], ValueError),
    ("abc", [0], ValueError),
])
def test_the_classifier_raises_foal_pipe_errors_that_are_scikit_learns_types_too(X, y, error):
    with pytest.raises(FoalPipeError) as info:
        AnalyticClassifier().partial_fit(X, y)
    assert isinstance(info.value, error) and "\n" not in str(info.value)
