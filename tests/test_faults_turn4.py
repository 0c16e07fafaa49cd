"""Issue 34's outside faults, each wrong on main (7ced068) and refused or handled here.

Before: a symlinked `--out` was replaced by a real folder that took the target's files (data loss), and with the
target on another filesystem the run failed on EXDEV and left temporaries that failed every later run (torn);
`learn --projection-dim 10000000` drew the projection before the memory check (hang, or a MemoryError
traceback); `learn --init-model` on the same data re-extracted with another `--chunk-rows` or `--dtype` learned
every row twice; a store or model file whose declared version was edited down skipped its integrity records;
`write_store` deleted a look-alike store folder holding a user's file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from functools import partial
from pathlib import Path

import helpers
import numpy as np
import pytest

from foal_pipe.errors import FoalPipeError
from foal_pipe.extract import ExtractSpec, run_extract
from foal_pipe.store import open_store, write_store
from foal_pipe.store.blockfusion import FinalNorm

CLASSES = helpers.FAULT_CLASSES
assert_one_line_error = partial(helpers.assert_one_line_error, after_notes=True)
_data = helpers.fault_rows
_invoke = helpers.invoke


@pytest.fixture
def store(tmp_path) -> Path:
    return helpers.fault_store(tmp_path / "s.zarr")


def _learn(store: Path, out: Path, *extra: object):
    return _invoke("learn", "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 16, *extra)


def _leftovers(*folders: Path) -> list[str]:
    return sorted(p.name for folder in folders for p in folder.iterdir() if p.name.startswith("."))


# -- 1. a symlinked --out: written at the target, the link kept, nothing of the target's moved ---------------------
def _other_filesystem(tmp_path: Path) -> Path:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem (/dev/shm) to put the link's target on")
    return Path(tempfile.mkdtemp(prefix="foal-faults-", dir=shm))


@pytest.fixture(params=["same", "other"])
def target_root(request, tmp_path):
    """Where a link's target lives: beside the link, or on another filesystem (a rename across is EXDEV)."""
    if request.param == "same":
        yield tmp_path / "there"
        return
    root = _other_filesystem(tmp_path)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _link(tmp_path: Path, target_root: Path, name: str) -> tuple[Path, Path]:
    """``tmp_path/name`` -> ``target_root/name`` holding a user's file."""
    target = target_root / name
    target.mkdir(parents=True)
    (target / "mine.txt").write_text("the user's")
    link = tmp_path / name
    link.symlink_to(target, target_is_directory=True)
    return link, target


def _assert_followed(link: Path, target: Path, *written: str) -> None:
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert (target / "mine.txt").read_text() == "the user's"
    for name in written:
        assert (target / name).is_file(), sorted(p.name for p in target.iterdir())
    assert _leftovers(link.parent, target.parent) == []


@pytest.mark.parametrize("extra", [(), ("--head", "balanced"), ("--order-seeds", "0,1")], ids=["ridge", "head", "orders"])
def test_learn_writes_a_symlinked_out_at_its_target(store, tmp_path, target_root, extra):
    link, target = _link(tmp_path, target_root, "run")
    for _ in range(2):  # the second run replaces the first one's outputs at the target
        result = _learn(store, link, *extra)
        assert result.exit_code == 0, result.output
        _assert_followed(link, target, "metrics.json")


def test_init_model_sweep_evaluate_and_predict_follow_a_symlinked_out(store, tmp_path, target_root):
    assert _learn(store, tmp_path / "first").exit_code == 0
    model = tmp_path / "first" / "model.safetensors"
    other = write_store(tmp_path / "t.zarr", _data(64, 7), _data(32, 8), CLASSES, chunk_rows=32)
    link, target = _link(tmp_path, target_root, "cont")
    result = _invoke("learn", "--init-model", model, "--features", other, "--out", link)
    assert result.exit_code == 0, result.output
    _assert_followed(link, target, "metrics.json", "model.safetensors")

    link, target = _link(tmp_path, target_root, "sweep")
    result = _invoke("sweep", "--features", store, "--out", link, "--tasks", 2, "--projection-dim", 16)
    assert result.exit_code == 0, result.output
    _assert_followed(link, target, "sweep.json")

    link, target = _link(tmp_path, target_root, "eval")
    result = _invoke("evaluate", "--run", tmp_path / "first", "--out", link)
    assert result.exit_code == 0, result.output
    _assert_followed(link, target, "summary.md")

    csv = target_root / "pred.csv"
    csv.write_text("the user's csv\n")
    (tmp_path / "pred.csv").symlink_to(csv)
    result = _invoke("predict", "--model", model, "--features", store, "--out", tmp_path / "pred.csv")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "pred.csv").is_symlink() and csv.read_text().startswith("row,")
    assert _leftovers(tmp_path, target_root) == []


def test_extract_writes_a_symlinked_out_at_its_target(tmp_path, target_root):
    target = target_root / "px.zarr"
    target.mkdir(parents=True)
    link = tmp_path / "px.zarr"
    link.symlink_to(target, target_is_directory=True)
    spec = dict(dataset="imagefolder", data_dir=str(helpers.make_image_tree(tmp_path / "tree", {"a": 4, "b": 4})),
                model="pixels", image_size=8, out=str(link), device="cpu", workers=0, batch_size=4, chunk_rows=4)
    run_extract(ExtractSpec(**spec))
    first = helpers.store_files(target)
    run_extract(ExtractSpec(**{**spec, "chunk_rows": 2}), overwrite=True)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert helpers.store_files(target) != first and (target / "zarr.json").is_file()
    assert _leftovers(tmp_path, target_root) == []


def test_a_symlink_loop_as_out_is_refused(store, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert_one_line_error(_learn(store, loop), f"output {loop} is a symlink that never reaches", "choose another --out")
    assert loop.is_symlink()


# -- 2. a huge --projection-dim: refused by the memory estimate before the projection is drawn ----------------------
@pytest.mark.parametrize("command", [
    ("learn",), ("sweep",), ("learn", "--head", "balanced"), ("learn", "--head", "dual"),
    ("learn", "--order-seeds", "0,1"), ("sweep", "--order-seeds", "0,1"),
], ids=" ".join)
def test_a_huge_projection_dim_is_refused_before_it_is_drawn(store, tmp_path, monkeypatch, command):
    from foal_pipe.core.expansion import Expansion

    def drawn(*args, **kwargs):
        raise AssertionError(f"the projection was drawn: {args}")

    monkeypatch.setattr(Expansion, "draw", drawn)
    out = tmp_path / "run"
    result = _invoke(*command, "--features", store, "--out", out, "--tasks", 2, "--projection-dim", 10_000_000)
    assert_one_line_error(result, f"{command[0]} needs about", "the projection (6 x 10,000,000)",
                          "is available;", "--projection-dim")
    assert not out.exists() and _leftovers(tmp_path) == []


# -- 3. learn --init-model on the same images re-extracted with another --chunk-rows or --dtype --------------------
@pytest.fixture(scope="module")
def extractions(tmp_path_factory) -> dict[str, Path]:
    """The same image tree extracted three times (4-row chunks, 2-row chunks, float16), and another tree of the
    same shape (same labels and row indices, other images)."""
    root = tmp_path_factory.mktemp("reextracted")
    trees = {name: helpers.make_image_tree(root / name, {"a": 6, "b": 6, "c": 6}, seed=seed)
             for name, seed in (("tree", 0), ("other_tree", 1))}
    stores = {}
    for name, tree, extra in (("a", "tree", {}), ("rechunked", "tree", {"chunk_rows": 2}),
                              ("float16", "tree", {"dtype": "float16"}), ("other", "other_tree", {})):
        spec = dict(dataset="imagefolder", data_dir=str(trees[tree]), model="pixels", image_size=4,
                    out=str(root / f"{name}.zarr"), device="cpu", workers=0, batch_size=4, chunk_rows=4)
        run_extract(ExtractSpec(**{**spec, **extra}))
        stores[name] = root / f"{name}.zarr"
    return stores


@pytest.mark.parametrize("head", ["ridge", "ncm", "slda", "fecam", "balanced", "dual"])
def test_init_model_refuses_the_same_rows_re_extracted(extractions, tmp_path, head):
    projected = ("--projection-dim", 8) if head in ("ridge", "balanced", "dual") else ()
    first = _invoke("learn", "--features", extractions["a"], "--out", tmp_path / "first", "--head", head,
                    "--tasks", 1, *projected)
    assert first.exit_code == 0, first.output
    model = tmp_path / "first" / "model.safetensors"
    for again in ("a", "rechunked", "float16"):
        result = _invoke("learn", "--init-model", model, "--features", extractions[again], "--out", tmp_path / "x")
        assert_one_line_error(result, f"has already learned the training rows of {extractions[again]}",
                              "would count every row twice")
        assert not (tmp_path / "x").exists()
    result = _invoke("learn", "--init-model", model, "--features", extractions["other"], "--out", tmp_path / "next")
    assert result.exit_code == 0, result.output
    result = _invoke("learn", "--init-model", tmp_path / "next" / "model.safetensors", "--features",
                     extractions["rechunked"], "--out", tmp_path / "x")
    assert_one_line_error(result, "the same rows extracted again: data identity", "would count every row twice")


# -- 4. a declared version edited down: every integrity record present is still checked ---------------------------
def _edit_attrs(store: Path, **attrs) -> None:
    """Edit the store's attributes by hand (as a user would, in zarr.json): a value None removes the key."""
    meta = store / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"].update(attrs)
    doc["attributes"] = {k: v for k, v in doc["attributes"].items() if v is not None}
    meta.write_text(json.dumps(doc))


def _strip_records(store: Path) -> None:
    for meta in store.rglob("zarr.json"):
        doc = json.loads(meta.read_text())
        if doc.get("node_type") == "array":
            doc["attributes"].pop("chunk_files", None)
            meta.write_text(json.dumps(doc))


def _swap_chunks(store: Path) -> None:
    """Exchange the first two chunk files of train/features (same size: a CRC-32C alone passes them)."""
    first, second = store / "train/features/c/0/0", store / "train/features/c/1/0"
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)


def _refused_everywhere(store: Path, tmp_path: Path, model: Path, *fragments: str) -> None:
    for args in (("learn", "--features", store, "--out", tmp_path / "r2", "--tasks", 2, "--projection-dim", 16),
                 ("sweep", "--features", store, "--out", tmp_path / "s2", "--tasks", 2, "--projection-dim", 16),
                 ("predict", "--model", model, "--features", store)):
        assert_one_line_error(_invoke(*args), f"feature store {store}", *fragments)
    assert not (tmp_path / "r2").exists() and not (tmp_path / "s2").exists()


@pytest.mark.parametrize("version", [3, 2, 1])
def test_a_store_whose_version_was_edited_down_is_refused(store, tmp_path, version):
    assert _learn(store, tmp_path / "run").exit_code == 0
    model = tmp_path / "run" / "model.safetensors"
    _swap_chunks(store)
    _edit_attrs(store, format_version=version)
    _refused_everywhere(store, tmp_path, model, f"declares format_version {version} but carries the chunk records "
                        "of format 4: its version was edited down")
    _strip_records(store)  # the records gone too: the generation id still holds the metadata and chunks
    _refused_everywhere(store, tmp_path, model, "is damaged", "generation id")


def test_a_downgraded_store_with_an_edited_norm_kind_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    x, y = _data(64, 0)
    blocks = rng.normal(size=(64, 2, 6)).astype(np.float32)
    store = write_store(tmp_path / "b.zarr", (x, y), (x[:32], y[:32]), CLASSES, chunk_rows=32,
                        blocks=(blocks, blocks[:32]), norm=FinalNorm("identity"))
    doc = json.loads((store / "zarr.json").read_text())
    doc["attributes"]["blocks"]["norm"]["kind"] = "identity"
    _edit_attrs(store, format_version=3, blocks=doc["attributes"]["blocks"])
    with pytest.raises(FoalPipeError, match="declares format_version 3 but carries the chunk records of format 4"):
        open_store(store)


def test_an_old_store_is_read_and_its_generation_checked(store, tmp_path):
    """A genuine format-3 store (no chunk records, a generation id over every chunk) still reads; swapped chunks
    in it, which no record binds, are now refused by its generation id instead of read."""
    from foal_pipe.store.integrity import compute_generation

    _strip_records(store)
    _edit_attrs(store, format_version=3, generation=None)
    _edit_attrs(store, generation=compute_generation(store))
    x = open_store(store).train.read(0, 64)
    np.testing.assert_array_equal(x, _data(128, 0)[0][:64])
    _swap_chunks(store)
    with pytest.raises(FoalPipeError, match=r"is damaged: its attributes or array metadata differ"):
        open_store(store)


# -- 6. write_store (and extract --overwrite) delete only a store's own files ---------------------------------------
def test_write_store_refuses_a_look_alike_folder_holding_a_users_file(tmp_path):
    look_alike = tmp_path / "s.zarr"
    look_alike.mkdir()
    (look_alike / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group",
                                                      "attributes": {"format": "foal-pipe/features"}}))
    (look_alike / "thesis.tex").write_text("the user's")
    with pytest.raises(FoalPipeError, match=r"s.zarr exists and is a feature store that also holds 'thesis.tex', "
                                            r"which a store does not write; refusing to replace it"):
        write_store(look_alike, _data(8, 0), _data(4, 1), CLASSES, chunk_rows=4)
    assert (look_alike / "thesis.tex").read_text() == "the user's"
    assert _leftovers(tmp_path) == []


def test_a_real_store_is_still_replaced_and_a_users_file_inside_one_is_kept(store, tmp_path):
    before = helpers.store_files(store)
    write_store(store, _data(128, 5), _data(64, 6), CLASSES, chunk_rows=16)  # store files only: replaced
    assert helpers.store_files(store) != before and "train/features/c/7/0" in helpers.store_files(store)
    (store / "train" / "notes.txt").write_text("the user's")
    with pytest.raises(FoalPipeError, match=r"also holds 'train/notes.txt'"):
        write_store(store, _data(8, 0), _data(4, 1), CLASSES, chunk_rows=4)
    assert (store / "train" / "notes.txt").read_text() == "the user's"


def test_extract_overwrite_refuses_a_store_holding_a_users_file(tmp_path):
    spec = ExtractSpec(dataset="imagefolder", data_dir=str(helpers.make_image_tree(tmp_path / "tree", {"a": 4})),
                       model="pixels", image_size=4, out=str(tmp_path / "px.zarr"), device="cpu", workers=0,
                       batch_size=4, chunk_rows=4)
    run_extract(spec)
    (tmp_path / "px.zarr" / "mine.txt").write_text("the user's")
    with pytest.raises(FoalPipeError, match=r"px.zarr also holds 'mine.txt', which a store does not write; "
                                            r"overwrite=True would delete it with the store"):
        run_extract(spec, overwrite=True)
    assert (tmp_path / "px.zarr" / "mine.txt").read_text() == "the user's"


# -- 8. the Python API's model paths: FoalPipeError, never a bare TypeError or ValueError ---------------------------
def test_model_paths_of_the_wrong_kind_raise_foal_pipe_errors(tmp_path, monkeypatch):
    import foal_pipe
    from foal_pipe import AnalyticClassifier
    from foal_pipe.errors import InputTypeError

    model = AnalyticClassifier().fit(*_data(16, 0))
    for call in (lambda: foal_pipe.load_model(123), lambda: foal_pipe.load_model(b"path"),
                 lambda: AnalyticClassifier.load(None), lambda: model.save(123)):
        with pytest.raises(InputTypeError, match=r"a model path must be a str or a pathlib.Path, got "):
            call()
    monkeypatch.chdir(tmp_path)
    for where in (".", "", tmp_path):
        with pytest.raises(FoalPipeError, match=r"it names a directory; pass a file path, e.g. .*model.safetensors"):
            model.save(where)
    assert list(tmp_path.iterdir()) == []


# -- 9. smaller ones: a metrics.json nested too deep, an empty image path, images with no pixels --------------------
def test_a_metrics_json_nested_too_deep_is_one_line(tmp_path):
    run = helpers.make_run(tmp_path / "run", model=False)
    (run / "metrics.json").write_text("[" * 100_000 + "]" * 100_000)
    for args in (("evaluate", "--run", run), ("summary", run)):
        assert_one_line_error(_invoke(*args), "metrics.json is nested too deep to read (a run's metrics)")


def test_predict_refuses_an_empty_image_path(model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # '' was '.': every image below the working directory was predicted
    helpers.make_image_tree(tmp_path / "photos", {"a": 2})
    result = _invoke("predict", "--model", model_dir / "model.safetensors", "--images", "")
    assert_one_line_error(result, "an image path is empty; pass --images with files, folders or glob patterns")


def test_predict_images_refuses_arrays_without_pixels(model_dir):
    import foal_pipe

    model = foal_pipe.load_model(model_dir / "model.safetensors")
    for shape in ((0, 3, 4, 4), (1, 3, 0, 4), (2, 3, 4, 0)):
        with pytest.raises(FoalPipeError, match="hold no pixels; pass at least one image of at least 1 x 1 pixels"):
            model.predict_images(np.zeros(shape, dtype=np.uint8))


@pytest.fixture
def model_dir(tmp_path) -> Path:
    """A pixels model (4 x 4 images) learned from a tiny image tree."""
    tree = helpers.make_image_tree(tmp_path / "tree", {"a": 4, "b": 4})
    run_extract(ExtractSpec(dataset="imagefolder", data_dir=str(tree), model="pixels", image_size=4,
                            out=str(tmp_path / "px.zarr"), device="cpu", workers=0, batch_size=4, chunk_rows=4))
    assert _learn(tmp_path / "px.zarr", tmp_path / "pixels-run").exit_code == 0
    return tmp_path / "pixels-run"


# -- 7. an old run (no model_checksum): its recorded settings must fit the model file --------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_evaluate_of_an_old_run_refuses_another_seeds_model(store, tmp_path, dtype):
    for seed in (0, 1):
        assert _learn(store, tmp_path / f"seed{seed}", "--seed", seed, "--dtype", dtype).exit_code == 0
        helpers.as_old_run(tmp_path / f"seed{seed}")  # as written before model_checksum
    result = _invoke("evaluate", "--run", tmp_path / "seed0")
    assert result.exit_code == 0, result.output  # its own model: the settings fit
    shutil.copy(tmp_path / "seed1" / "model.safetensors", tmp_path / "seed0" / "model.safetensors")
    assert_one_line_error(_invoke("evaluate", "--run", tmp_path / "seed0"), "is not the model run",
                          "its projection is not the one the run's seed 0 draws")
    result = _invoke("evaluate", "--run", tmp_path / "seed0", "--model", tmp_path / "seed1" / "model.safetensors")
    assert_one_line_error(result, "its projection is not the one the run's seed 0 draws")


# -- 10. the heaviest tests are marked slow, so -m "not slow" is a fast subset ---------------------------------------
def test_the_heaviest_tests_are_marked_slow():
    import subprocess
    import sys

    heavy = {"test_outputs.py": ["test_sigkill_at_random_moments", "test_kill_at_each_step_of_the_swap"],
             "test_pipeline.py": ["test_dvc_repro_runs_every_stage", "test_dvc_repro_twice_reruns_nothing",
                                  "test_committed_dvc_lock_matches_code_and_params"],
             "test_store_concurrency.py": ["test_two_extract_processes_one_store",
                                           "test_readers_see_the_old_or_the_new_store_never_a_mix"]}
    here = Path(__file__).parent
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow",
                           *(str(here / name) for name in heavy)], capture_output=True, text=True, timeout=300,
                          cwd=here.parent)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    fast = {line.split("::")[1].split("[")[0] for line in proc.stdout.splitlines() if "::" in line}
    assert fast, proc.stdout[-2000:]
    assert not {name for names in heavy.values() for name in names} & fast


def _png(rows: bytes, width: int, height: int) -> bytes:
    """An RGB PNG whose (well-formed) compressed data holds ``rows``, filter bytes included."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_a_png_whose_pixel_data_stops_early_is_refused(model_dir, tmp_path):
    from PIL import Image

    row = b"\x00" + bytes(range(12))  # one row of 4 RGB pixels
    whole, short = tmp_path / "whole.png", tmp_path / "short.png"
    whole.write_bytes(_png(row * 3, 4, 3))
    short.write_bytes(_png(row, 4, 3))  # Pillow decodes it, rows 2 and 3 zeros
    with Image.open(short) as img:
        img.load()
        assert np.asarray(img)[1:].max() == 0
    model = model_dir / "model.safetensors"
    assert _invoke("predict", "--model", model, "--images", whole).exit_code == 0
    result = _invoke("predict", "--model", model, "--images", short)
    assert_one_line_error(result, f"cannot read image {short} (its pixel data ends after 13 of 39 bytes: the file is "
                          "truncated)")
    result = _invoke("predict", "--model", model, "--images", short, whole, "--skip-bad")
    assert result.exit_code == 0 and "skipped" in result.output and "1 image predicted" in result.output, result.output
