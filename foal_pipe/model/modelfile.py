"""The model file (``model.safetensors``): the one module that writes, reads and checks its bytes.

A model file is a `safetensors <https://github.com/huggingface/safetensors#format>`_ file (nothing is
unpickled) that :func:`write_model` lays out byte for byte, so the same model gives the same bytes in any
process (the safetensors library keeps its metadata in a hash map with a per-process random order):

* 8 bytes: the header length N, unsigned little-endian;
* N bytes: the JSON header with sorted keys and no spaces, padded with spaces to a multiple of 8 bytes;
* the tensors' little-endian, C-order bytes, largest element size first, then by name, with no holes (so
  every tensor starts aligned to its element size, as the safetensors library does).

Tensors (D activations, C classes, d features): :data:`TENSORS`; metadata, JSON text each (safetensors keeps strings):
the format's keys, :data:`METADATA` and any other key (later versions add provenance so); docs/model-file.md has all.

Integrity: one flipped bit in ``W``, or an edited ``gamma``, ``activation`` or ``class_names``, would otherwise
predict wrongly with exit status 0. The ``checksum`` covers every tensor and every other metadata value and is
verified on every read (whatever version the file declares: one declaring version 1 with a checksum is
refused, its version was edited down); and wherever ``G`` and ``Q`` are stored, ``W`` must solve ``(G + gamma I) W = Q``
(:func:`check_solution`, a product of D x D by D x C: version-1 files, which have no checksum, get it too; one
holding :data:`LATER_KEYS`, or of the rls engine, which has nothing to check, is refused).
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from foal_pipe.core.activations import ACTIVATIONS
from foal_pipe.core.backend import DTYPES
from foal_pipe.core.engines import ENGINES
from foal_pipe.errors import FoalPipeError, InputTypeError, clipped, param
from foal_pipe.io import METRICS_FILE, atomic_path
from foal_pipe.io.outpaths import enclosing_store, is_feature_store
from foal_pipe.model.checksum import CHECKSUM_PREFIX, content_checksum, file_checksum, is_checksum
from foal_pipe.model.solutioncheck import GAMMA_TOLERANCE, unsolved

MODEL_FILE = "model.safetensors"
FORMAT = "foal-pipe/model"
FORMAT_VERSION = 2
#: The version of a file holding a head other than ridge (:func:`foal_pipe.heads.state.file_heads`); ridge's stay 2.
HEAD_FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
#: The first version with a ``checksum``; a file declaring an older one while carrying it is refused.
CHECKSUM_FROM = 2
ALIGNMENT = 8

#: safetensors' dtype codes for the dtypes a model file may hold.
CODES: dict[np.dtype, str] = {
    np.dtype("float64"): "F64", np.dtype("float32"): "F32",
    np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("int16"): "I16", np.dtype("int8"): "I8",
    np.dtype("uint32"): "U32", np.dtype("uint16"): "U16", np.dtype("uint8"): "U8",
}
DTYPE_OF_CODE = {code: dtype for dtype, code in CODES.items()}

#: Each tensor's shape in named dimensions and its kind of dtype; every name must agree across tensors.
TENSORS: dict[str, tuple[tuple[str, ...], str]] = {
    "W": (("D", "C"), "f"), "classes": (("C",), "iu"), "projection": (("d", "D"), "f"), "G": (("D", "D"), "f"),
    "Q": (("D", "C"), "f"), "R": (("D", "D"), "f"), "counts": (("C",), "iu"), "drift": (("D", "C"), "f")}
REQUIRED_TENSORS = ("W", "classes")
#: Metadata written from version 2 on only: a version-1 file holding one had its version edited down and its checksum
#: removed (``gamma_grid`` and the rest were written before; ``save(**metadata)`` may add any key).
LATER_KEYS = ("learned_from", "learned_data", "head_options")

#: The dimensions of rows a model takes, none of which may be empty (C = 0: :func:`_check_classes_present`).
WIDTHS = {"d": "features", "D": "activations"}

_FIX = "pass a model.safetensors written by `foal-pipe learn` (or AnalyticClassifier.save), or train it again"


class TensorInfo(NamedTuple):
    """A tensor as the header describes it: enough to check shapes and dtypes before reading any values."""

    shape: tuple[int, ...]
    dtype: np.dtype


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    try:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    except OverflowError:  # an integer beyond float range
        return False


def _numbers(v: Any) -> bool:
    return isinstance(v, list) and all(map(_is_number, v))


def shown(value: Any) -> str:
    """A value's repr for a one-line message, cut at 60 characters with an ellipsis (not mid-quote, unmarked)."""
    return clipped(repr(value))


def names_problem(values: Any, n_columns: int) -> str | None:
    """What is wrong with ``class_names`` for ``n_columns`` classes (strings, one per class, none twice), or None."""
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return "must be a list of strings"
    if len(values) != n_columns:
        return f"has {len(values)} names but W has {n_columns} columns"
    if len(set(values)) != len(values):
        return f"names {next(v for i, v in enumerate(values) if v in values[:i])!r} twice"
    return None


#: Metadata checks besides the format's: key -> (required, check(value, n_columns) -> problem or None).
METADATA: dict[str, tuple[bool, Callable[[Any, int], str | None]]] = {
    "gamma": (True, lambda v, _: None if _is_number(v) and v > 0 else "must be a positive number"),
    "engine": (True, lambda v, _: None if v in ENGINES else f"must be one of {', '.join(map(repr, ENGINES))}"),
    "dtype": (True, lambda v, _: None if v in DTYPES else f"must be one of {', '.join(map(repr, DTYPES))}"),
    "n_samples_seen": (True, lambda v, _: None if _is_int(v) and v >= 0 else "must be a non-negative integer"),
    "class_names": (False, names_problem),
    "dataset": (False, lambda v, _: None if isinstance(v, str) else "must be a string"),
    "encoder": (False, lambda v, _: None if isinstance(v, dict) else "must be a mapping"),
    "activation": (False, lambda v, _: None if v in ACTIVATIONS else f"must be one of {', '.join(map(repr, ACTIVATIONS))}"),
    "checksum": (False, lambda v, _: None if is_checksum(v) else f"must be {CHECKSUM_PREFIX!r} and 64 hex digits"),
    "learned_from": (False, lambda v, _: None if isinstance(v, list) and all(isinstance(g, str) for g in v)
                     else "must be a list of store generation ids (strings)"),
    "learned_data": (False, lambda v, _: None if isinstance(v, list) and all(isinstance(g, str) for g in v)
                     else "must be a list of data identities (strings)"),
    "gamma_grid": (False, lambda v, _: None if isinstance(v, list) and v and all(_is_number(g) and g > 0 for g in v)
                   else "must be a non-empty list of positive numbers (the grid of a gamma='auto' model)"),
    "per_decade": (False, lambda v, _: None if _is_int(v) and v >= 0 else "must be an integer >= 0 (a gamma='auto' search's)"),
    "rows_outside_stores": (False, lambda v, _: None if _is_int(v) and v >= 0 else "must be an integer >= 0 (rows counted)"),
    "sums_rounding": (False, lambda v, _: None if _is_number(v) and v >= 0 else "must be a number >= 0 (the sums' rounding)"),
    "sums_rounding_errors": (False, lambda v, _: None if _numbers(v) else "must be numbers"),
    "sums_rounding_diagonal": (False, lambda v, _: None if _numbers(v) else "must be numbers, one per row of G"),
}


def model_path(path: Any, writing: bool = False) -> Path:
    """``path`` as a model file's path, or one line saying why it cannot be one (the Python API's callers get a
    :class:`FoalPipeError` -- for a wrong type an ``InputTypeError``, also a ``TypeError`` -- not a bare
    ``TypeError`` from deep inside): a ``str`` or ``os.PathLike``, naming a file when ``writing``."""
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
        raise InputTypeError(f"a model path must be a str or a pathlib.Path, got {type(path).__name__} {shown(path)}")
    text = os.fspath(path)
    if not text and not writing:  # Path('') is '.': "model file . is not a file" would point elsewhere
        raise FoalPipeError(f"the model path is empty; pass a {MODEL_FILE} file (written by `foal-pipe learn`)")
    path = Path(text)
    if text.endswith(("/", os.sep)) and not path.is_dir():  # Path drops the slash: 'model.safetensors/' would open
        raise FoalPipeError(f"model path {text!r} ends with '/', which names a directory, but {path} is none; pass "
                            f"{path} without the '/'")
    if writing and (path.name in ("", ".", "..") or path.is_dir()):
        raise FoalPipeError(f"cannot save a model as {path}: it names a directory; pass a file path, e.g. "
                            f"{path / MODEL_FILE}")
    return path


def refuse(where: str, problem: str) -> FoalPipeError:
    return FoalPipeError(f"{where}: {problem}; {_FIX}")


def validate_model(tensors: Mapping[str, Any], metadata: Mapping[str, Any], where: str = "model") -> None:
    """Refuse anything but a consistent foal-pipe model, with one :class:`FoalPipeError` naming the problem.

    ``tensors`` maps names to arrays, or to :class:`TensorInfo` (read from the header) to check shapes and
    dtypes before any value is read; values (finite floats, class ids) are checked for arrays only; ``metadata``: JSON's.
    """
    if metadata.get("format") != FORMAT:
        found = f"metadata 'format' is {shown(str(metadata['format']))}" if "format" in metadata else "no 'format'"
        raise FoalPipeError(f"{where} holds no foal-pipe metadata ({found}: a safetensors file from another tool or an "
                            f"older foal-pipe); {_FIX}")
    version = metadata.get("format_version")
    if isinstance(version, str):
        raise refuse(where, f"metadata 'format_version' ({shown(version)}) is a string, but foal-pipe writes it as a "
                            "number: the file was edited")
    if not _is_int(version) or version not in READABLE_VERSIONS:
        raise FoalPipeError(f"{where} has model format_version {shown(version)} but this foal-pipe reads versions "
                            f"{', '.join(map(str, READABLE_VERSIONS[:-1]))} and {READABLE_VERSIONS[-1]}; upgrade "
                            "foal-pipe or train the model again")
    for key, value in metadata.items():
        if isinstance(value, NotJSON):
            raise refuse(where, f"metadata {key!r} ({shown(str(value))}) is not JSON")
    if version == HEAD_FORMAT_VERSION or "head" in metadata:
        _validate_head(tensors, metadata, where)
        return
    missing = [name for name in REQUIRED_TENSORS if name not in tensors]
    unknown = sorted(set(tensors) - set(TENSORS))
    if missing or unknown:
        raise refuse(where, f"tensor {missing[0]!r} is missing" if missing else f"unexpected tensor {unknown[0]!r}")
    _check_shapes(tensors, where)
    _check_classes_present(tensors, where)
    unverified = version < CHECKSUM_FROM and "checksum" not in metadata  # with one: read_model verifies it, named
    later = [key for key in LATER_KEYS if key in metadata] if unverified else []
    if later:
        raise refuse(where, f"it declares format_version {version} but holds metadata {later[0]!r}, which files have "
                            f"from version {CHECKSUM_FROM} (with a checksum): its version was edited down")
    if metadata.get("activation") == "cos":
        raise refuse(where, "metadata 'activation' is 'cos', whose projection bias a ridge model file does not hold")
    for key, (required, check) in METADATA.items():
        if key not in metadata:
            if required:
                raise refuse(where, f"metadata {key!r} is missing")
            continue
        problem = check(metadata[key], int(tensors["W"].shape[1]))
        if problem:
            raise refuse(where, f"metadata {key!r} ({shown(metadata[key])}) {problem}")
    state = ENGINES[metadata["engine"]].state_names
    if absent := [name for name in state if name not in tensors]:
        raise refuse(where, f"the {metadata['engine']} engine's state tensor {absent[0]!r} is missing")
    kept = (*state, "drift", "G", "Q") if (rls := metadata["engine"] == "rls") else state  # its drift and checking sums
    if stray := sorted(name for name in set(tensors) & {"G", "Q", "R", "drift"} if name not in kept):
        raise refuse(where, f"tensor {stray[0]!r} does not belong to the {metadata['engine']} engine")
    if rls and len(half := {"G", "Q"} & set(tensors)) == 1:  # both (W - drift solves them), or neither (a file before)
        raise refuse(where, f"the rls engine keeps its checking sums G and Q together, but only {half.pop()!r} is here")
    for name in ("G", "Q", "R"):  # Q, and rls's checking sums, in float64 whatever the dtype (a gram file before: Q too)
        wanted = {"float64"} if rls and name != "R" else {metadata["dtype"], "float64" if name == "Q" else ""}
        if name in tensors and tensors[name].dtype.name not in wanted:
            raise refuse(where, f"{name} is {tensors[name].dtype} but metadata 'dtype' says {metadata['dtype']}")
    if unverified and rls:
        raise refuse(where, "a version-1 rls model carries no checksum, and its R and W hold no relation to check it "
                            "by (a gram model's W solves its G and Q), so an altered file could not be told apart")
    _check_values(tensors, where)
    if isinstance(counts := tensors.get("counts"), np.ndarray) and int(counts.sum()) > metadata["n_samples_seen"]:  # fewer: ok
        raise refuse(where, f"the class row counts sum to {int(counts.sum())}, more than 'n_samples_seen' "
                            f"({metadata['n_samples_seen']})")
    grid = metadata.get("gamma_grid")
    if grid is not None and (metadata["engine"] != "gram" or not min(grid) * (1 - GAMMA_TOLERANCE) <= metadata["gamma"]
                             <= max(grid) * (1 + GAMMA_TOLERANCE)):
        raise refuse(where, f"metadata 'gamma_grid' records a gamma='auto' model, which the gram engine chooses within "
                            f"its grid, but the model is {metadata['engine']} with gamma {metadata['gamma']:g}")
    if all(isinstance(tensors.get(name), np.ndarray) for name in ("W", "G", "Q", *("drift",) * rls)):
        check_solution(tensors["W"] - tensors.get("drift", 0), tensors["G"], tensors["Q"], metadata["gamma"], where)


def _validate_head(tensors: Mapping[str, Any], metadata: Mapping[str, Any], where: str) -> None:
    """:func:`validate_model` for a head: its tensors (all float64 but ``classes``, ``counts``), options, row counts."""
    from foal_pipe.heads import HEADS
    from foal_pipe.heads.state import file_heads, file_options, file_schema, options_problem

    name = metadata.get("head")
    if metadata["format_version"] != HEAD_FORMAT_VERSION or name is None:
        reason = "names no 'head'" if name is None else f"cannot hold a head (version {HEAD_FORMAT_VERSION} does)"
        raise refuse(where, f"a version-{metadata['format_version']} file {reason}")
    if not isinstance(name, str) or name not in file_heads():
        raise refuse(where, f"metadata 'head' ({shown(name)}) is not a head this foal-pipe stores; it stores "
                            f"{', '.join(file_heads())} (and ridge, without 'head')")
    schema = file_schema(name, HEADS[name].space == "features" and "projection" in tensors)  # moved: --head-rows
    missing = [key for key in schema if key not in tensors and key != "projection_bias"]
    unknown = sorted(set(tensors) - set(schema))
    if missing or unknown:
        raise refuse(where, f"the {name} head's tensor {missing[0]!r} is missing" if missing
                      else f"tensor {unknown[0]!r} does not belong to the {name} head")
    _check_shapes(tensors, where, schema)
    _check_classes_present(tensors, where)
    for key, value in tensors.items():
        wanted = np.dtype("int64" if schema[key][1] == "iu" else "float64")
        if not key.startswith("projection") and np.dtype(value.dtype) != wanted:  # the projection: in the run's dtype
            raise refuse(where, f"tensor {key!r} is {np.dtype(value.dtype)} but the {name} head keeps {wanted}")
    n_classes = int(tensors["classes"].shape[0])
    for key in ("class_names", "dataset", "encoder", "activation", "checksum", "n_samples_seen", "dtype"):
        if key in metadata:
            problem = METADATA[key][1](metadata[key], n_classes)
            if problem:
                raise refuse(where, f"metadata {key!r} ({shown(metadata[key])}) {problem}")
    if "n_samples_seen" not in metadata:
        raise refuse(where, "metadata 'n_samples_seen' is missing")
    options = metadata.get("head_options")
    if not isinstance(options, dict) or set(options) != set(file_options(name)):
        raise refuse(where, f"metadata 'head_options' ({shown(options)}) must map the {name} head's options "
                            f"({', '.join(file_options(name)) or 'none'}) to their values")
    problem = options_problem(name, options)
    if problem:
        raise refuse(where, f"metadata 'head_options' {problem}")
    _check_values(tensors, where)
    counts = tensors.get("counts")
    if isinstance(counts, np.ndarray):
        if counts.size and counts.min() < 1:
            raise refuse(where, f"a class has {int(counts.min())} rows; every class stored has at least one")
        if int(counts.sum()) != metadata["n_samples_seen"]:
            raise refuse(where, f"the class row counts sum to {int(counts.sum())} but 'n_samples_seen' is "
                                f"{metadata['n_samples_seen']}")


def check_solution(W: np.ndarray, G: np.ndarray, Q: np.ndarray, gamma: float, where: str = "model") -> None:
    """Refuse a ``W`` that does not solve ``(G + gamma I) W = Q`` (:func:`~foal_pipe.model.solutioncheck.unsolved`)."""
    if (problem := unsolved(W, G, Q, gamma)) is not None:
        raise refuse(where, problem)


def _check_shapes(tensors: Mapping[str, Any], where: str,
                  schema: Mapping[str, tuple[tuple[str, ...], str]] = TENSORS) -> None:
    sizes: dict[str, tuple[str, int]] = {}  # dimension -> (the tensor that fixed it, its size)
    for name, (dims, kinds) in schema.items():
        if name not in tensors:
            continue
        shape, dtype = tuple(int(n) for n in tensors[name].shape), np.dtype(tensors[name].dtype)
        if dtype.kind not in kinds or dtype not in CODES or (kinds == "iu" and dtype != np.int64):
            kind = "a float (float32 or float64)" if kinds == "f" else "an integer of dtype int64"
            raise refuse(where, f"tensor {name!r} has dtype {dtype} but must be {kind}")
        if len(shape) != len(dims):
            raise refuse(where, f"tensor {name!r} has shape {shape} but must have {len(dims)} dimensions {dims}")
        for dim, size in zip(dims, shape, strict=True):
            if dim in WIDTHS and size == 0:
                raise refuse(where, f"tensor {name!r} has shape {shape}: {dim} = 0 {WIDTHS[dim]}, but a model needs at "
                                    "least one")
            first, known = sizes.setdefault(dim, (name, size))
            if known != size:
                raise refuse(where, f"tensor {name!r} has shape {shape} but {first!r} has {dim} = {known}: the shapes "
                                    "disagree")


def _check_classes_present(tensors: Mapping[str, Any], where: str) -> None:
    """Refuse a model of no class: it could predict nothing (an argmax over no column)."""
    if int(tensors["classes"].shape[0]) == 0:
        raise refuse(where, "it holds no class ('classes' is empty); a model needs at least one class with rows")


def _check_values(tensors: Mapping[str, Any], where: str) -> None:
    for name, value in tensors.items():
        if not isinstance(value, np.ndarray):
            continue
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise refuse(where, f"tensor {name!r} holds NaN or inf values")
    classes = tensors["classes"]
    if isinstance(classes, np.ndarray) and classes.size:
        if classes.min() < 0:
            raise refuse(where, f"class id {int(classes.min())} is negative")
        if np.any(classes[1:] <= classes[:-1]):
            raise refuse(where, "class ids are not sorted and unique")
    counts = tensors.get("counts")
    if isinstance(counts, np.ndarray) and counts.size and counts.min() < 0:
        raise refuse(where, f"the row count of a class is negative ({int(counts.min())})")


def _json(value: Any, key: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        raise FoalPipeError(f"metadata {key!r} ({shown(value)}) cannot be stored as JSON; pass strings, numbers, "
                            "lists or mappings") from None


def write_model(path: str | Path, tensors: Mapping[str, Any], metadata: Mapping[str, Any]) -> Path:
    """Write a model file atomically; the same tensors and metadata always give the same bytes.

    ``format``, ``format_version`` and ``checksum`` are added to ``metadata`` (a ``checksum`` passed in is
    replaced); the model is validated first, so nothing :func:`read_model` would refuse is ever written.
    """
    path = model_path(path, writing=True)
    outer = enclosing_store(path)
    if outer is not None:  # among its arrays it would be in the way of every later read of the store
        raise FoalPipeError(f"cannot save a model as {path}: it lies in the feature store {outer}; save it outside")
    arrays = {name: np.ascontiguousarray(value) for name, value in tensors.items()}
    arrays = {name: a.astype(a.dtype.newbyteorder("<"), copy=False) for name, a in arrays.items()}
    version = HEAD_FORMAT_VERSION if "head" in metadata else FORMAT_VERSION
    meta = {**{k: v for k, v in metadata.items() if k != "checksum"}, "format": FORMAT, "format_version": version}
    validate_model(arrays, meta, str(path))
    strings = {key: _json(value, key) for key, value in meta.items()}
    entries = [(name, CODES[a.dtype.newbyteorder("=")], a.shape, [a.data]) for name, a in arrays.items()]
    strings["checksum"] = _json(content_checksum(strings, entries), "checksum")
    header: dict[str, Any] = {"__metadata__": strings}
    order = sorted(arrays, key=lambda name: (-arrays[name].dtype.itemsize, name))
    offset = 0
    for name in order:
        a = arrays[name]
        header[name] = {"data_offsets": [offset, offset + a.nbytes], "dtype": CODES[a.dtype.newbyteorder("=")],
                        "shape": list(a.shape)}
        offset += a.nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % ALIGNMENT)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        for name in order:
            fh.write(arrays[name].data)
    return path


def _run_head(run: Path) -> str | None:
    """The head other than ridge that the run in ``run`` learned (its metrics.json's ``head``), if any."""
    try:
        head = json.loads((run / METRICS_FILE).read_text()).get("head")
    except (OSError, ValueError, AttributeError):
        return None
    return head if isinstance(head, str) else None


def stored_header(path: str | Path) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
    """A model file's metadata (decoded) and tensor shapes, unchecked (both empty: not a readable file): what to
    compare before :func:`read_model` validates everything, without reading a tensor."""
    from safetensors import SafetensorError, safe_open

    path = model_path(path)
    if not path.is_file():  # a FIFO would block safe_open for good; read_model names the problem
        return {}, {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            return ({key: _decode(value) for key, value in (f.metadata() or {}).items()},
                    {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()})  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError):
        return {}, {}


def _stored_text(path: str | Path, key: str) -> str | None:
    value = stored_header(path)[0].get(key)
    return value if isinstance(value, str) else None


def stored_checksum(path: str | Path) -> str | None:
    """The ``checksum`` a model file records, unchecked (:func:`read_model` verifies it): which model a run wrote."""
    return _stored_text(path, "checksum")


def stored_head(path: str | Path) -> str | None:
    """The ``head`` a model file names, unchecked: which reader to use, before :func:`read_model` validates it."""
    return _stored_text(path, "head")


def read_model(path: str | Path, names: Collection[str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(tensors, metadata)`` of a validated model file; metadata values are decoded from JSON.

    ``names`` reads only those tensors (say ``W``, ``classes`` and ``projection`` to predict, leaving the
    D x D state on disk); shapes and dtypes of all tensors are checked from the header either way, the
    checksum (version 2) over every tensor's bytes, streamed. A version-1 file (no checksum) has ``W``, ``G``
    and ``Q`` read for :func:`check_solution` whatever ``names`` says.
    """
    from safetensors import SafetensorError, safe_open

    path = model_path(path)
    if not path.exists():
        head = _run_head(path.parent)
        if head is not None:
            raise FoalPipeError(f"model file {path} does not exist: its run learned {param('head', head)} with a "
                                "foal-pipe that wrote metrics.json only for heads; run that `foal-pipe learn` again")
        raise FoalPipeError(f"model file {path} does not exist; train one with `foal-pipe learn`")
    if not path.is_file():
        if is_feature_store(path):
            raise FoalPipeError(f"{path} is a feature store, not a model file; pass the {MODEL_FILE} that `foal-pipe "
                                f"learn` wrote into its {param('out')} directory")
        inside = path / MODEL_FILE
        fix = f"pass {inside}" if inside.is_file() else f"pass a {MODEL_FILE} written by `foal-pipe learn`"
        raise FoalPipeError(f"model file {path} is not a file; {fix}")
    try:
        with safe_open(str(path), framework="numpy") as f:
            raw = f.metadata() or {}
            header = {}
            for key in f.keys():  # noqa: SIM118  (a safetensors handle, not a dict)
                part = f.get_slice(key)
                code = part.get_dtype()
                if code not in DTYPE_OF_CODE:
                    raise refuse(str(path), f"tensor {key!r} has dtype {code}, which a model file does not hold")
                header[key] = TensorInfo(tuple(part.get_shape()), DTYPE_OF_CODE[code])
            metadata = {key: _decode(value) for key, value in raw.items()}
            validate_model(header, metadata, str(path))
            wanted = set(header) if names is None else set(names)
            if metadata["format_version"] < 2:
                wanted |= {"W", "G", "Q"}
            tensors = {key: f.get_tensor(key) for key in header if key in wanted}
        validate_model({**header, **tensors}, metadata, str(path))  # the values first: a precise reason
        if metadata["format_version"] >= 2 or "checksum" in metadata:  # every checksum present is verified
            _verify_checksum(path, raw, metadata)
    except (SafetensorError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FoalPipeError(f"{path} is not a safetensors model file (damaged, truncated or another format: {reason}); "
                            f"{_FIX}") from None
    return {key: value for key, value in tensors.items() if names is None or key in names}, metadata


def _verify_checksum(path: Path, raw: Mapping[str, str], metadata: Mapping[str, Any]) -> None:
    if "checksum" not in metadata:
        raise refuse(str(path), f"it is a version-{metadata['format_version']} file without the metadata 'checksum' "
                                "that covers its content (removed?)")
    if file_checksum(path, raw) != metadata["checksum"]:
        raise refuse(str(path), "its content does not match its checksum: a tensor or a metadata value was altered "
                                "after it was written (a flipped bit, an edited gamma, activation or class name)")
    if metadata["format_version"] < CHECKSUM_FROM:
        raise refuse(str(path), f"it declares format_version {metadata['format_version']} but carries a checksum, "
                                f"which files have from version {CHECKSUM_FROM}: its version was edited down")


class NotJSON(str):
    """A metadata value that does not decode as JSON, kept for :func:`validate_model` to name."""


def _decode(value: str) -> Any:
    try:
        return json.loads(value)
    except (json.JSONDecodeError, RecursionError):  # RecursionError: JSON nested too deep to parse
        return NotJSON(value)
