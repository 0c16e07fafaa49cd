"""Randomized corruption audit: a damaged feature store or model file is refused in one line, or changes nothing.

Each trial copies a pristine input, applies one seeded random corruption (a flipped byte, a truncation, a deleted or
duplicated file, a metadata field edited to another valid-looking value, a stray file) and runs every reader on it:
`info --verify`, `learn` (stored and fused features), `sweep`, `predict` on both splits, `learn --init-model` and
`evaluate` for stores; `predict` and `learn --init-model` for model files. A command must either end with exit 1 and
one `Error:` line (no traceback, no output left behind) or give exactly what it gives on the pristine input (the
accuracy matrix, the model's tensors and metadata, the CSV bytes); only provenance (the store's path, its generation
or content id, the checksum over them) may differ. The default part runs a few trials per input; the bulk is slow.

Two faults it found are mended and tested below: consolidated metadata in a store's root zarr.json overrode the
arrays' own metadata unseen by the generation id, and `extract` over a store whose features zarr.json is corrupt was a
traceback.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
import struct
from pathlib import Path
from typing import Any

import helpers
import numpy as np
import pytest
import zarr
from helpers import invoke

from foal_pipe.store import write_store

#: What may differ between runs on a pristine and a harmlessly altered input: where and which store it was.
PROVENANCE = ("features", "model_checksum", "learned_from", "learned_data", "checksum")
LEARN = ("--tasks", "2", "--projection-dim", "16", "--backend", "numpy")
#: Continuing a model: its projection comes from the model file.
INIT = ("--tasks", "2", "--backend", "numpy")


# -- inputs -----------------------------------------------------------------------------------------------------
def _format_3(path: Path) -> Path:
    return helpers.unseal_to_format_3(helpers.fault_store(path))


def _pixels(path: Path) -> Path:
    helpers.run_extract(helpers.digits_pixels_spec(path, chunk_rows=512))
    return path


BUILDERS = {"blocks5": helpers.blocks_store, "format3": _format_3, "pixels5": _pixels}


def _other_rows(pristine: Path, path: Path) -> Path:
    """Other rows of the pristine store's classes, dataset and encoder: a model learned there continues on it."""
    group = zarr.open_group(str(pristine), mode="r")
    x, y = np.asarray(group["train/features"][:]), np.asarray(group["train/labels"][:])
    test = np.asarray(group["test/features"][:]), np.asarray(group["test/labels"][:])
    return write_store(path, (x[::-1] * 0.9, y[::-1]), test, list(group.attrs["classes"]), dataset=group.attrs["dataset"],
                       encoder=dict(group.attrs["encoder"]), chunk_rows=64)


class _Inputs(dict):
    """Per kind: the pristine store and a model learned on other rows of its classes, built on first use."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, kind: str) -> tuple[Path, Path]:
        store = BUILDERS[kind](self.root / kind / "s.zarr")
        other = _other_rows(store, self.root / kind / "other.zarr")
        result = invoke("learn", "--features", other, "--out", self.root / kind / "run", "--seed", "5", *LEARN)
        assert result.exit_code == 0, result.output
        self[kind] = (store, self.root / kind / "run" / "model.safetensors")
        return self[kind]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> _Inputs:
    return _Inputs(tmp_path_factory.mktemp("corruption"))


# -- corruptions --------------------------------------------------------------------------------------------------
def _nodes(doc: Any, at: tuple = ()):
    yield at, doc
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _nodes(value, at + (key,))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _nodes(value, at + (i,))


def _altered(rng: random.Random, value: Any, strings: list[str]) -> Any:
    """Another value of a plausible kind: a number off by one or doubled, a string of the document, a list reordered,
    shortened or lengthened, a mapping with a key dropped or added."""
    if isinstance(value, bool):
        return rng.choice([not value, int(value), str(value).lower()])
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, 0, value * 2, -value, float(value), str(value), value + 1024])
    if isinstance(value, float):
        return rng.choice([value * 2, value + 1e-6, int(value), -value, 0.0, str(value)])
    if isinstance(value, str):
        others = [s for s in strings if s != value] or [value + "y"]
        return rng.choice([value + "x", value.upper(), "", rng.choice(others), value[::-1]])
    if isinstance(value, list):
        if len(value) < 2:
            return value + value if value else [0]
        i, j = rng.sample(range(len(value)), 2)
        swapped = list(value)
        swapped[i], swapped[j] = swapped[j], swapped[i]
        return rng.choice([swapped, value[:-1], value + [value[-1]], value[::-1]])
    if isinstance(value, dict):
        if value and rng.random() < 0.6:
            return {k: v for k, v in value.items() if k != rng.choice(sorted(value))}
        return {**value, "extra": 1}
    return rng.choice([0, "", []])


def _edit_json(rng: random.Random, doc: Any) -> tuple[Any, str]:
    """``doc`` with one node, drawn at random, :func:`_altered`; and what changed."""
    strings = sorted({v for _, v in _nodes(doc) if isinstance(v, str)})
    at, old = rng.choice([(at, node) for at, node in _nodes(doc) if at])
    new = _altered(rng, copy.deepcopy(old), strings)
    cur = doc
    for key in at[:-1]:
        cur = cur[key]
    cur[at[-1]] = new
    return doc, f"{list(at)}: {json.dumps(old)[:40]} -> {json.dumps(new)[:40]}"


def corrupt_store(rng: random.Random, store: Path, spare: frozenset[str] = frozenset()) -> str:
    """One random corruption of the store's files (none of those named in ``spare``); what it was."""
    files = [p for p in sorted(store.rglob("*")) if p.is_file() and p.relative_to(store).as_posix() not in spare]
    op = rng.choice(["flip", "flip", "truncate", "delete", "duplicate", "json", "json", "json", "json", "stray"])
    target = rng.choice(files)
    name, data = target.relative_to(store).as_posix(), target.read_bytes()
    if op == "flip" and data:
        i = rng.randrange(len(data))
        target.write_bytes(data[:i] + bytes([data[i] ^ rng.randrange(1, 256)]) + data[i + 1 :])
        return f"flip {name} byte {i}"
    if op == "truncate" and data:
        size = rng.randrange(len(data))
        target.write_bytes(data[:size])
        return f"truncate {name} to {size}"
    if op == "duplicate":
        same_kind = [p for p in files if (p.name == "zarr.json") == (target.name == "zarr.json") and p != target]
        source = rng.choice(same_kind or files)
        shutil.copyfile(source, target)
        return f"copy {source.relative_to(store).as_posix()} over {name}"
    if op == "json":
        target = rng.choice([p for p in files if p.name == "zarr.json"])
        doc, what = _edit_json(rng, json.loads(target.read_text()))
        target.write_text(json.dumps(doc, indent=2))
        return f"edit {target.relative_to(store).as_posix()} {what}"
    if op == "stray":
        folder = rng.choice(sorted({p.parent for p in files}))
        stray = folder / rng.choice([".zarray", ".zattrs", ".zgroup", "zarr.json.partial", "9", "extra"])
        stray.write_bytes(rng.choice([b"{}", b"", data[:64], b'{"zarr_format": 2}']))
        return f"stray {stray.relative_to(store).as_posix()}"
    target.unlink()
    return f"delete {name}"


# -- outcomes -----------------------------------------------------------------------------------------------------
def _outcome(result, out: Path | None = None, report: bool = False) -> str:
    """``ok`` or ``refused``, after checking a refusal's form: exit 1, one `Error:` line, last (``report``: anywhere,
    as info's report goes to stdout beside it), no traceback, no ``out`` left."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 1), result.output
    if result.exit_code == 0:
        return "ok"
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "Traceback" not in result.output and (report or lines[-1].startswith("Error: ")), result.output
    assert sum(line.startswith("Error: ") for line in lines) == 1, result.output
    if out is not None:
        assert not out.exists(), f"{out} left behind: {result.output}"
    return "refused"


def _run_signature(out: Path) -> str:
    """The run's results: metrics.json and the model file's tensors and metadata, provenance left out."""
    metrics = {k: v for k, v in json.loads((out / "metrics.json").read_text()).items() if k not in PROVENANCE}
    data = (out / "model.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    meta = {k: v for k, v in header.pop("__metadata__").items() if k not in PROVENANCE}
    text = json.dumps([metrics, meta, header], sort_keys=True).encode()
    return hashlib.sha256(text + data[8 + size :]).hexdigest()


def _files_signature(out: Path) -> str:
    files = sorted(p for p in out.rglob("*") if p.is_file() and "timing" not in p.name)
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.relative_to(out).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def _with_new(work: Path, command, out: Path, sign) -> str:
    before = set(os.listdir(work))
    outcome = _outcome(invoke(*command), out)
    assert set(os.listdir(work)) - before <= {out.name}, f"{command[0]} left {set(os.listdir(work)) - before}"
    return sign(out) if outcome == "ok" else outcome


def store_results(store: Path, model: Path, work: Path, fused: bool) -> dict[str, str]:
    """What every reader of the store gives (``refused`` or a signature of its results)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    results = {"verify": _outcome(invoke("info", store, "--verify"), report=True)}
    for name, extra in (("learn", ()), ("fused", ("--fusion", "mean:2-3"))):
        if name == "learn" or fused:
            results[name] = _with_new(work, ("learn", "--features", store, "--out", work / name, "--seed", "3", *LEARN,
                                             *extra), work / name, _run_signature)
    results["sweep"] = _with_new(work, ("sweep", "--features", store, "--out", work / "sweep", "--seed", "3", *LEARN,
                                        "--gammas", "0.1,1,10"), work / "sweep", _files_signature)
    for split in ("test", "train"):
        out = work / f"{split}.csv"
        results[split] = _with_new(work, ("predict", "--model", model, "--features", store, "--split", split, "--out",
                                          out), out, lambda p: hashlib.sha256(p.read_bytes()).hexdigest())
    results["init"] = _with_new(work, ("learn", "--features", store, "--out", work / "init", "--init-model", model,
                                       *INIT), work / "init", _run_signature)
    if results["learn"] != "refused":
        results["evaluate"] = _outcome(invoke("evaluate", "--run", work / "learn", "--no-plots"))
    return results


def _same_or_refused(got: dict[str, str], pristine: dict[str, str], what: str) -> None:
    changed = {k: v for k, v in got.items() if v not in ("refused", pristine.get(k))}
    assert not changed, f"{what}: silently changed {sorted(changed)} (refused elsewhere: {got})"


def _store_trials(inputs, tmp_path: Path, kind: str, seeds: range) -> None:
    pristine, model = inputs[kind]
    store, work = tmp_path / "trial" / "s.zarr", tmp_path / "work"
    shutil.copytree(pristine, store)
    baseline = store_results(store, model, work, kind == "blocks5")
    assert "refused" not in {baseline[k] for k in baseline if k != "init"}, baseline
    for seed in seeds:
        shutil.rmtree(store)
        shutil.copytree(pristine, store)
        what = corrupt_store(random.Random(f"{kind}-{seed}"), store)
        _same_or_refused(store_results(store, model, work, kind == "blocks5"), baseline, f"{kind} seed {seed}: {what}")


@pytest.mark.parametrize("kind", ["blocks5", "format3"])
def test_a_few_random_store_corruptions_are_refused_or_harmless(inputs, tmp_path, kind):
    _store_trials(inputs, tmp_path, kind, range(8))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["blocks5", "format3", "pixels5"])
def test_many_random_store_corruptions_are_refused_or_harmless(inputs, tmp_path, kind):
    _store_trials(inputs, tmp_path, kind, range(8, 48))


def test_the_harness_sees_a_silent_change(inputs, tmp_path):
    """The comparison is not blind: a format-1 store (no checksums) with one feature changed learns otherwise."""
    store = helpers.build_store(tmp_path / "b1.zarr", n_train=120, n_test=48, chunk=32, n_classes=4, train_dim=6,
                                test_dim=6)
    model = tmp_path / "run" / "model.safetensors"
    assert invoke("learn", "--features", _other_rows(store, tmp_path / "o.zarr"), "--out", model.parent,
                  *LEARN).exit_code == 0
    baseline = store_results(store, model, tmp_path / "work", False)
    features = zarr.open_array(str(store / "train/features"), mode="r+")
    features[0, 0] = float(features[0, 0]) + 50
    with pytest.raises(AssertionError, match="silently changed"):
        _same_or_refused(store_results(store, model, tmp_path / "work", False), baseline, "format 1")


# -- consolidated metadata ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["blocks5", "format3"])
def test_consolidated_metadata_cannot_change_what_is_read(inputs, tmp_path, kind):
    pristine, model = inputs[kind]
    store = shutil.copytree(pristine, tmp_path / "s.zarr")
    baseline = store_results(store, model, tmp_path / "work", False)
    root = json.loads((store / "zarr.json").read_text())
    metadata = {p.parent.relative_to(store).as_posix(): json.loads(p.read_text())
                for p in store.rglob("zarr.json") if p.parent != store}
    n, chunk = metadata["test/features"]["shape"][0], metadata["test/features"]["chunk_grid"]["configuration"]["chunk_shape"][0]
    for name in ("test/features", "test/labels", "test/blocks"):
        if name in metadata:  # half a chunk fewer test rows: as many chunks, so every chunk record still matches
            metadata[name]["shape"][0] = n - chunk // 2
    root["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": metadata}
    (store / "zarr.json").write_text(json.dumps(root, indent=2))
    _same_or_refused(store_results(store, model, tmp_path / "work", False), baseline, "consolidated test rows cut")


# -- extract over a damaged store ---------------------------------------------------------------------------------
def _extract(store: Path):
    return invoke("extract", "--dataset", "digits", "--model", "pixels", "--out", store, "--chunk-rows", "512",
                  "--batch-size", "50", "--workers", "0", "--device", "cpu")


def _extract_trials(inputs, tmp_path: Path, seeds: range) -> None:
    """`extract` again over a damaged complete store refuses in one line or leaves a store every reader takes."""
    pristine, _ = inputs["pixels5"]
    store = tmp_path / "s.zarr"
    features_meta = frozenset({"train/features/zarr.json", "test/features/zarr.json"})  # tested on their own below
    for seed in seeds:
        shutil.rmtree(store, ignore_errors=True)
        shutil.copytree(pristine, store)
        what = corrupt_store(random.Random(f"extract-{seed}"), store, spare=features_meta)
        if _outcome(_extract(store)) == "ok":
            assert invoke("info", store, "--verify").exit_code == 0, f"seed {seed}: {what}: extract left damage"


def test_extract_over_a_few_damaged_stores(inputs, tmp_path):
    _extract_trials(inputs, tmp_path, range(6))


@pytest.mark.slow
def test_extract_over_many_damaged_stores(inputs, tmp_path):
    _extract_trials(inputs, tmp_path, range(6, 26))


@pytest.mark.parametrize("damage", [b'{"broken', b"\xff\xfe"])
def test_extract_refuses_a_store_whose_features_metadata_is_unreadable(inputs, tmp_path, damage):
    store = shutil.copytree(inputs["pixels5"][0], tmp_path / "s.zarr")
    (store / "train/features/zarr.json").write_bytes(damage)
    helpers.assert_one_line_error(_extract(store), "s.zarr")


# -- model files --------------------------------------------------------------------------------------------------
def _parts(data: bytes) -> tuple[dict, bytes]:
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + size]), data[8 + size :]


def _join(header: dict, buffer: bytes, indent: int | None = None) -> bytes:
    text = json.dumps(header, sort_keys=indent is None, indent=indent, separators=None if indent else (",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + buffer


def corrupt_model(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """One random corruption of a model file: a flipped bit, a truncation, bytes appended, a metadata value or a
    tensor's dtype, shape, offsets or name edited, or the header re-spaced (content unchanged); what it was."""
    header, buffer = _parts(data)
    op = rng.choice(["flip", "flip", "truncate", "append", "meta", "meta", "meta", "tensor", "tensor", "respace"])
    if op == "flip":
        i = rng.randrange(len(data))
        return data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :], f"flip byte {i}"
    if op == "truncate":
        size = rng.randrange(len(data))
        return data[:size], f"truncate to {size}"
    if op == "append":
        return data + rng.choice([b"\0" * 8, b"garbage", data[-16:]]), "append"
    if op == "respace":
        return _join(header, buffer, indent=1), "respace"
    if op == "meta":
        key = rng.choice(sorted(header["__metadata__"]))
        value, what = _edit_json(rng, [json.loads(header["__metadata__"][key])])
        header["__metadata__"][key] = json.dumps(value[0])
        return _join(header, buffer), f"metadata {key} {what}"
    name = rng.choice(sorted(k for k in header if k != "__metadata__"))
    others = sorted(k for k in header if k not in ("__metadata__", name))
    field = rng.choice(["dtype", "shape", "data_offsets", "name"])
    if field == "dtype":
        header[name]["dtype"] = rng.choice([c for c in ("F64", "F32", "I64", "I32", "U8", "F16") if c != header[name]["dtype"]])
    elif field == "shape":
        other = rng.choice(others)
        header[name]["shape"], header[other]["shape"] = header[other]["shape"], header[name]["shape"]
    elif field == "data_offsets":
        step = rng.choice([-8, 8])
        header[name]["data_offsets"] = [o + step for o in header[name]["data_offsets"]]
    else:
        other = rng.choice(others)
        header[other], header[name] = header[name], header[other]
    return _join(header, buffer), f"tensor {name} {field}"


def model_results(model: Path, store: Path, other: Path, work: Path) -> dict[str, str]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    return {"predict": _with_new(work, ("predict", "--model", model, "--features", store, "--out", work / "p.csv"),
                                 work / "p.csv", lambda p: hashlib.sha256(p.read_bytes()).hexdigest()),
            "init": _with_new(work, ("learn", "--features", other, "--out", work / "init", "--init-model", model,
                                     *INIT), work / "init", _run_signature)}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A model of each head on :func:`helpers.fault_store`, with the store and other rows to continue on."""
    root = tmp_path_factory.mktemp("models")
    store = helpers.fault_store(root / "s.zarr")
    write_store(root / "o.zarr", helpers.fault_rows(96, 7), helpers.fault_rows(32, 8), helpers.FAULT_CLASSES,
                chunk_rows=32)
    for head in ("ridge", "ncm", "slda"):
        result = invoke("learn", "--features", store, "--out", root / head, "--seed", "3", "--head", head, *LEARN[:2],
                        "--projection-dim", "8", "--backend", "numpy")
        assert result.exit_code == 0, result.output
    return {"root": root, "store": store, "other": root / "o.zarr"}


def _model_trials(models, tmp_path: Path, head: str, seeds: range) -> None:
    good = (models["root"] / head / "model.safetensors").read_bytes()
    model = tmp_path / "m" / "model.safetensors"
    model.parent.mkdir()
    model.write_bytes(good)
    baseline = model_results(model, models["store"], models["other"], tmp_path / "work")
    assert "refused" not in baseline.values(), baseline
    for seed in seeds:
        bad, what = corrupt_model(random.Random(f"{head}-{seed}"), good)
        model.write_bytes(bad)
        _same_or_refused(model_results(model, models["store"], models["other"], tmp_path / "work"), baseline,
                         f"{head} seed {seed}: {what}")


@pytest.mark.parametrize("head", ["ridge", "ncm"])
def test_a_few_random_model_corruptions_are_refused_or_harmless(models, tmp_path, head):
    _model_trials(models, tmp_path, head, range(15))


@pytest.mark.slow
@pytest.mark.parametrize("head", ["ridge", "ncm", "slda"])
def test_many_random_model_corruptions_are_refused_or_harmless(models, tmp_path, head):
    _model_trials(models, tmp_path, head, range(15, 75))
