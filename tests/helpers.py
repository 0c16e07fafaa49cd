"""Helpers shared by the test modules (they import from here, never from each other); fixtures live in conftest.py."""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import numpy as np
import pytest
import zarr
from safetensors.numpy import load_file
from sklearn.covariance import OAS
from typer.testing import CliRunner

from foal_pipe.cli import app
from foal_pipe.extract import ExtractSpec, run_extract
from foal_pipe.model.modelfile import write_model
from foal_pipe.report.paper import PAPER_BACKBONE
from foal_pipe.store import open_store
from foal_pipe.store.integrity import compute_generation

STAGES = Path(__file__).resolve().parent.parent / "stages"


def digits_pixels_spec(out: Path, chunk_rows: int = 128) -> ExtractSpec:
    """`extract --dataset digits --model pixels` into ``out`` on the CPU, in the main process (digits: train 1,442
    rows, test 355)."""
    return ExtractSpec(dataset="digits", model="pixels", out=str(out), chunk_rows=chunk_rows, batch_size=50, workers=0,
                       device="cpu")


def die_after_kept_runs(monkeypatch, n: int) -> None:
    """Make a table die (KeyboardInterrupt, as Ctrl-C does) once it has kept ``n`` finished runs."""
    from foal_pipe.protocol import table

    put, calls = table._Kept.put, []

    def dying(self, key, record, *said):
        put(self, key, record, *said)
        calls.append(key)
        if len(calls) == n:
            raise KeyboardInterrupt

    monkeypatch.setattr(table._Kept, "put", dying)


def params_with(**sections: dict) -> dict:
    """The repository's params.yaml with ``sections``' keys updated."""
    import yaml

    params = yaml.safe_load((STAGES.parent / "params.yaml").read_text())
    for section, values in sections.items():
        params[section].update(values)
    return params
runner = CliRunner()

# --- timm ViTs and image trees ---------------------------------------------------------------------------------

TINY_VIT = "vit_tiny_patch16_224"
TINY_VIT_KWARGS = (("img_size", 32), ("patch_size", 8), ("depth", 2), ("num_heads", 2), ("embed_dim", 32))
"""A 2-block, 32-dim ViT on 32-pixel images: the architecture behind ``tiny_vit_checkpoint``."""


def assert_one_line_error(result, *fragments: str, after_notes: bool = False) -> None:
    """A CLI result that failed with exit 1 and one ``Error: ...`` message holding every fragment, no traceback and
    no exception escaping; ``after_notes``: the command may print notes before the error line."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    text = " ".join(result.output.split())
    assert text.startswith("Error: ") or (after_notes and "\nError: " in result.output), result.output
    for fragment in fragments:
        assert fragment in text, text


def make_image_tree(root: Path, classes: dict[str, int], test_per_class: int = 2, seed: int = 0,
                    split: bool = True) -> Path:
    """``root/train/<class>/*.png`` and ``root/test/<class>/*.png`` with random images of mixed sizes and
    modes (RGB, grayscale, RGBA, palette); ``split=False``: ``root/<class>/*.png`` only, ``classes[c]`` each."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    modes = ["RGB", "L", "RGBA", "P"]
    splits = (("train", classes), ("test", {c: test_per_class for c in classes})) if split else (("", classes),)
    for split_name, counts in splits:
        for cls, count in counts.items():
            folder = root / split_name / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                h, w = int(rng.integers(12, 48)), int(rng.integers(12, 48))
                img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
                mode = modes[i % len(modes)]
                img = img.convert(mode) if mode != "P" else img.convert("P", palette=Image.Palette.ADAPTIVE)
                img.save(folder / f"img{i:03d}.png")
    return root


KWARGS_4 = tuple((k, 4 if k == "depth" else v) for k, v in TINY_VIT_KWARGS)
"""The tiny test ViT with 4 blocks, so that mean:A-B is neither every block nor one."""
CHUNK = 256  # digits: train 1,442 rows = 6 chunks (the last short), test 355 = 2


def vit4_spec(out: Path, checkpoint: Path, **kw) -> ExtractSpec:
    base = dict(dataset="digits", model=TINY_VIT, checkpoint=str(checkpoint), model_kwargs=KWARGS_4, out=str(out),
                chunk_rows=CHUNK, batch_size=100, workers=0, device="cpu")
    return ExtractSpec(**{**base, **kw})


def extract_one_thread(spec: ExtractSpec):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # module fixtures run before the one_torch_thread fixture
    try:
        return run_extract(spec)
    finally:
        torch.set_num_threads(threads)


def store_files(store: Path) -> dict[str, bytes]:
    """Every file of a store (chunks, array and group metadata), by relative path."""
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


def assert_identical_stores(a: Path, b: Path) -> None:
    fa, fb = store_files(a), store_files(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs"
    sa, sb = open_store(a), open_store(b)
    for split in ("train", "test"):
        np.testing.assert_array_equal(np.asarray(sa.split(split).features[:]), np.asarray(sb.split(split).features[:]))


# --- synthetic stores and the CLI -------------------------------------------------------------------------------

N_CLASSES, DIM = 12, 16


def build_store(path: Path, n_train=600, n_test=240, seed=0, attrs=None, train_dim=DIM, test_dim=DIM, chunk=64,
                noise=1.6, complete=True, n_classes=N_CLASSES) -> Path:
    """A store written directly with zarr, in dataset order; classes are Gaussian blobs that overlap."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, max(train_dim, test_dim)))
    group = zarr.open_group(str(path), mode="w")
    group.attrs.update(
        {"format": "foal-pipe/features", "format_version": 1, "classes": [f"c{i}" for i in range(n_classes)],
         "dataset": "blobs", "encoder": {"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False}}
        | (attrs or {})
    )
    for split, n, d in (("train", n_train, train_dim), ("test", n_test, test_dim)):
        y = rng.integers(0, n_classes, n)
        x = (means[y, :d] + noise * rng.normal(size=(n, d))).astype(np.float32)
        group.create_array(f"{split}/features", shape=x.shape, chunks=(chunk, d), dtype="float32")[:] = x
        group.create_array(f"{split}/labels", shape=(n,), chunks=(n,), dtype="int32")[:] = y
    if complete:
        group.attrs["complete"] = True
    return path


def cluster_store(path: Path, n_classes: int, dim: int, n_test: int, chunk_rows: int, seed: int,
                  n_train: int = 3000) -> Path:
    """Gaussian class clusters (centres N(0, 1), noise 1.5) through :func:`~foal_pipe.store.write_store`, float64."""
    from foal_pipe.store import write_store

    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_classes, dim))
    y_train, y_test = rng.integers(0, n_classes, n_train), rng.integers(0, n_classes, n_test)
    x_train = centres[y_train] + 1.5 * rng.normal(size=(n_train, dim))
    x_test = centres[y_test] + 1.5 * rng.normal(size=(n_test, dim))
    return write_store(path, (x_train, y_train), (x_test, y_test), [f"c{k}" for k in range(n_classes)],
                       chunk_rows=chunk_rows)


def written_copy(source: Path, path: Path, chunk: int = 64) -> Path:
    """:func:`build_store`'s rows as a store of the current format (:func:`~foal_pipe.store.write_store`): a generation
    id of its own, so a model may continue on it even with the same rows (continuing needs the rows shown new)."""
    from foal_pipe.store import write_store

    x, y, xt, yt = read(source)
    return write_store(path, (x, y), (xt, yt), [f"c{i}" for i in range(N_CLASSES)], dataset="blobs",
                       encoder={"name": "synthetic", "fusion": "none", "image_size": 0, "normalize": False},
                       chunk_rows=chunk)


def read(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    g = zarr.open_group(str(path), mode="r")
    return (np.asarray(g["train/features"][:]), np.asarray(g["train/labels"][:]),
            np.asarray(g["test/features"][:]), np.asarray(g["test/labels"][:]))


#: The fault tests' small store: four separable classes of six features (tests/test_faults_*.py).
FAULT_CLASSES = ["a", "b", "c", "d"]


def fault_rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of :data:`FAULT_CLASSES` in turn, each class's mean 3 apart (float32 features, labels)."""
    rng = np.random.default_rng(seed)
    y = np.tile(np.arange(4), n // 4)
    return (rng.normal(size=(n, 6)) + 3 * y[:, None]).astype(np.float32), y


def fault_store(path: Path) -> Path:
    """128 train and 64 test rows of :func:`fault_rows` in chunks of 32."""
    from foal_pipe.store import write_store

    return write_store(path, fault_rows(128, 0), fault_rows(64, 1), FAULT_CLASSES, chunk_rows=32)


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    return result


def learn(store: Path, out: Path, *extra: str, tasks=4, D=48, gamma=1.0, batch=10):
    result = invoke("learn", "--features", store, "--out", out, "--tasks", tasks, "--projection-dim", D,
                    "--gamma", gamma, "--batch-size", batch, "--seed", 3, "--backend", "numpy", *extra)
    assert result.exit_code == 0, result.output
    return json.loads((out / "metrics.json").read_text()), load_file(str(out / "model.safetensors"))


def assert_same_matrix(got: list[list[float]], expected: list[list[float]]) -> None:
    assert [len(row) for row in got] == [len(row) for row in expected]
    np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), rtol=0, atol=1e-12)


def assert_json_close(a, b, rel: float, abs_: float = 0.0, path: str = "") -> None:
    """Two JSON documents of equal structure and equal non-float values, their floats within ``rel`` / ``abs_``;
    the failing path in the message."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_json_close(a[key], b[key], rel, abs_, f"{path}/{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_json_close(x, y, rel, abs_, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=rel, abs=abs_), path
    else:
        assert a == b, path


def assert_clean_error(result, message: str, out: Path) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("Error: "), result.output
    assert message in " ".join(lines), result.output
    assert not out.exists(), "output written despite the error"


# --- hand-made runs for evaluate and summary --------------------------------------------------------------------

# A 3-task accuracy matrix and its metrics worked out by hand (paper Eq. 17-18).
MATRIX = [[0.90], [0.80, 0.95], [0.70, 0.85, 0.90]]
A_STEPS = [0.90, 0.875, 2.45 / 3]
A_AVG = (0.90 + 0.875 + 2.45 / 3) / 3
A_LAST = 2.45 / 3
F = ((0.90 - 0.70) + (0.95 - 0.85)) / 2  # best before the last task minus final, tasks 1..T-1
F_PUBLISHED = ((0.90 - 0.70) + (0.95 - 0.85) + 0.0) / 3  # best over all rows, all T tasks
TASKS = [[3, 7], [0, 5], [9, 1]]
PIXELS = {"name": "pixels", "fusion": "none", "token": "none", "image_size": 8, "normalize": False}
PAPER_ENCODER = {"name": PAPER_BACKBONE, "fusion": "mean-cls", "token": "cls", "image_size": 224, "normalize": True,
                 "dim": 768}


#: :data:`MATRIX` and its numbers, worked out by hand above.
HAND = {"accuracy_matrix": MATRIX, "A_avg": A_AVG, "A_last": A_LAST, "F": F, "F_published_code": F_PUBLISHED,
        "A_steps": A_STEPS}


def shifted(base: dict, k: int) -> dict:
    """``base``'s matrix with every entry raised by 0.01 k and the numbers that gives: A_i, A_avg and A_last 0.01 k
    higher, F and F_published_code unchanged (each a difference of two entries)."""
    up = 0.01 * k
    return {"accuracy_matrix": [[round(v + up, 12) for v in row] for row in base["accuracy_matrix"]],
            "A_avg": base["A_avg"] + up, "A_last": base["A_last"] + up, "F": base["F"],
            "F_published_code": base["F_published_code"], "A_steps": [a + up for a in base["A_steps"]]}


def make_metrics(**overrides) -> dict:
    metrics = {
        "A_avg": A_AVG, "A_last": A_LAST, "F": F, "F_published_code": F_PUBLISHED, "A_steps": A_STEPS,
        "accuracy_matrix": MATRIX, "tasks": TASKS, "n_tasks": 3, "gamma": 1.0, "projection_dim": 1000,
        "batch_size": 10, "seed": 0, "engine": "gram", "backend": "numpy", "dtype": "float64",
        "n_train_seen": 600, "n_test": 150, "dataset": "digits", "encoder": PIXELS, "drop_last": False,
        "mask_unseen": True, "projection_init": "uniform",
    }
    metrics.update(overrides)
    return metrics


def make_run(path: Path, metrics: dict | None = None, model: bool = True, sweep: dict | None = None) -> Path:
    """A run directory of ``metrics`` (default :func:`make_metrics`: written before files named their format, so
    before ``model_checksum``), and a ridge model file that fits them (``model``): D and the projection its seed
    draws (``feature_dim`` wide, else 2), gamma (``auto``: the last chosen), the rows learned, the tasks' classes, the
    dataset and encoder, as ``evaluate`` compares them for such a run."""
    from foal_pipe.core.expansion import Expansion

    metrics = metrics or make_metrics()
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.json").write_text(json.dumps(metrics))
    if model:
        # column k of W belongs to classes[k]; the norm of the column of label c is c + 1; (G + gamma I) W = Q
        classes = np.array(sorted({c for task in metrics["tasks"] for c in task}), dtype=np.int64)
        D, d = metrics["projection_dim"], metrics.get("feature_dim", 2)
        projection = Expansion.draw(d, D, metrics["projection_init"], "identity", metrics["seed"], "float64").components_
        W = np.zeros((projection.shape[1], classes.size))
        W[0] = classes + 1.0
        names = [f"class{c}" for c in classes]
        gamma = metrics["gammas_selected"][-1] if metrics["gamma"] == "auto" else metrics["gamma"]
        write_model(path / "model.safetensors",
                    {"W": W, "classes": classes, "projection": projection, "G": np.eye(W.shape[0]), "Q": (1 + gamma) * W},
                    {"gamma": gamma, "engine": "gram", "dtype": "float64", "n_samples_seen": metrics["n_train_seen"],
                     "dataset": metrics["dataset"], "encoder": metrics["encoder"], "class_names": names})
    if sweep is not None:
        (path / "sweep.json").write_text(json.dumps(sweep))
    return path


def as_old_run(run: Path) -> dict:
    """A learn run's metrics.json as written before ``model_checksum`` (format_version 2, the last one that may lack
    it: a later one without it is refused as damaged); the metrics written."""
    metrics = {k: v for k, v in json.loads((run / "metrics.json").read_text()).items() if k != "model_checksum"}
    metrics["format_version"] = 2
    (run / "metrics.json").write_text(json.dumps(metrics))
    return metrics


# --- the heads' definitions written plainly (float64, loops): what the heads are tested against ----------------

def unit(X):
    norms = np.sqrt((X**2).sum(axis=1, keepdims=True))
    return X / np.where(norms > 0, norms, 1.0)


def ref_ncm(X, y, T):
    classes = np.unique(y)
    means = np.array([unit(X)[y == c].mean(axis=0) for c in classes])
    Th = unit(T)
    return classes, -np.array([[((t - m) ** 2).sum() for m in means] for t in Th])


def ref_cosine(X, y, T):
    """SimpleCIL's prototypes: the mean raw row of each class; scores: the cosine of each test row to each."""
    classes = np.unique(y)
    prototypes = [X[y == c].mean(axis=0) for c in classes]
    return classes, np.array([[t @ p / (np.sqrt(t @ t) * np.sqrt(p @ p)) for p in prototypes] for t in T])


def slda_covariance(X, y, eps):
    classes = np.unique(y)
    means = np.array([X[y == c].mean(axis=0) for c in classes])
    R = X - means[np.searchsorted(classes, y)]
    if eps == "oas":
        return classes, means, OAS().fit(R).covariance_
    S = R.T @ R / len(y)
    return classes, means, (1 - eps) * S + eps * np.eye(X.shape[1])


def ref_slda(X, y, T, eps=1e-4):
    classes, means, S = slda_covariance(X, y, eps)
    Lam = np.linalg.pinv(S)
    return classes, np.array([[t @ Lam @ m - m @ Lam @ m / 2 for m in means] for t in T])


def ref_fecam(X, y, T, a1=1.0, a2=0.0):
    classes = np.unique(y)
    Xh, Th = unit(X), unit(T)
    out = np.empty((len(T), classes.size))
    for k, c in enumerate(classes):
        rows = Xh[y == c]
        mu = rows.mean(axis=0)
        S = np.cov(rows, rowvar=False)
        d = S.shape[0]
        off = ~np.eye(d, dtype=bool)
        S = S + a1 * np.mean(np.diag(S)) * np.eye(d) + a2 * S[off].mean() * off
        sd = np.sqrt(np.diag(S))
        P = np.linalg.pinv(S / np.outer(sd, sd))
        out[:, k] = [-(t - mu) @ P @ (t - mu) for t in Th]
    return classes, out


def ref_ncm_loo(X, y):
    """NCM's leave-one-out accuracy by refitting without each row (a class left empty predicts wrong)."""
    hits = 0
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        if not (y[keep] == y[i]).any():
            continue
        classes, scores = ref_ncm(X[keep], y[keep], X[i : i + 1])
        hits += int(classes[scores.argmax()] == y[i])
    return hits / len(y)


def unseal_to_format_3(store: Path) -> Path:
    """The store as format 3 wrote it: no chunk records, a generation id over every chunk."""
    group = zarr.open_group(str(store), mode="r+")
    for name in ("train/features", "train/labels", "test/features", "test/labels"):
        group[name].update_attributes({"chunk_files": None})
    attrs = {k: v for k, v in dict(group.attrs).items() if k != "generation"} | {"format_version": 3}
    group.attrs.put(attrs)
    group.attrs.put(attrs | {"generation": compute_generation(store)})
    return store


def scores_in_threads(monkeypatch, head: str, score, threads: int = 4) -> tuple[list, int]:
    """What ``score()`` gives (or raises) in ``threads`` threads that call it at once, and how many times the head's
    solve (``boundary``) ran (:func:`held_in_threads`)."""
    from foal_pipe.heads import HEADS

    return held_in_threads(monkeypatch, HEADS[head].head, "boundary", score, threads)


def held_in_threads(monkeypatch, owner, name: str, score, threads: int = 4) -> tuple[list, int]:
    """What ``score()`` gives (or raises) in ``threads`` threads released at once (a barrier before the call), and how
    many times ``owner.name`` (a method) ran meanwhile: under the estimator's lock one thread runs it while the others
    wait, so a solve shared by every reader runs once."""
    import threading

    barrier, original, entered = threading.Barrier(threads, timeout=10), getattr(owner, name), []

    def counted(self, *args, **kwargs):
        entered.append(threading.get_ident())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    out: list = [None] * threads

    def read(k):
        try:
            barrier.wait()
            out[k] = score()
        except BaseException as exc:  # noqa: BLE001 - what a thread raised is the result
            out[k] = exc

    started = [threading.Thread(target=read, args=(k,)) for k in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    return out, len(entered)


def blocks_store(path: Path) -> Path:
    """A blocks store (3 blocks of 6 dims, 4 classes, 120 train and 40 test rows) whose stored features are its
    mean-cls fusion."""
    from foal_pipe.store import write_store
    from foal_pipe.store.blockfusion import FinalNorm, fuse

    rng = np.random.default_rng(4)
    y = np.tile(np.arange(4), 40)
    blocks = (rng.normal(size=(160, 3, 6)) + np.linspace(0.3, 1, 3)[None, :, None] * rng.normal(size=(4, 1, 6))[y]
              * 0.9).astype(np.float16)
    norm = FinalNorm("layernorm", 1e-6, np.linspace(0.5, 2, 6, dtype=np.float32), np.zeros(6, np.float32))
    splits = [(fuse(b, "mean-cls", norm), t) for b, t in ((blocks[:120], y[:120]), (blocks[120:], y[120:]))]
    return write_store(path, *splits, [f"c{i}" for i in range(4)],
                       encoder={"name": "synthetic-vit-s", "fusion": "mean-cls", "image_size": 0, "normalize": False},
                       chunk_rows=64, blocks=(blocks[:120], blocks[120:]), norm=norm)


def edited_run(source: Path, run: Path, edit) -> Path:
    """A copy of run folder ``source`` at ``run`` with ``edit`` applied to its metrics.json (the model file as it was)."""
    shutil.copytree(source, run)
    metrics = json.loads((run / "metrics.json").read_text())
    edit(metrics)
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run


def three_class_store(path: Path) -> Path:
    """30 train and 30 test rows of 5 features, classes a, b, c: a run takes a fraction of a second."""
    from foal_pipe.store import write_store

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 10)
    return write_store(path, ((rng.normal(size=(30, 5)) + y[:, None]).astype(np.float32), y),
                       ((rng.normal(size=(30, 5)) + y[:, None]).astype(np.float32), y), ["a", "b", "c"])


def int32_store(path: Path) -> Path:
    """A format-2 store of int32 features (outside the spec: every reader refuses it, naming --dtype), 40 train and 12
    test rows of 3 features in chunks of 16 rows, 2 classes."""
    import zarr

    import foal_pipe.store as st

    group = zarr.open_group(str(path), mode="w")
    for split, n in (("train", 40), ("test", 12)):
        st.create_array(group, f"{split}/features", (n, 3), (16, 3), "int32")[:] = np.arange(n * 3).reshape(n, 3)
        st.create_array(group, f"{split}/labels", (n,), (n,), "int64")[:] = np.arange(n) % 2
    group.attrs.put({"format": "foal-pipe/features", "format_version": 2, "classes": ["x", "y"], "dataset": "d",
                     "encoder": {"name": "e", "fusion": "none", "image_size": 0, "normalize": False}, "complete": True})
    return path


def stage_module(name: str) -> types.ModuleType:
    """stages/NAME.py as a fresh module (its ``command``, its checks), with stages/ importable for its ``_params``, as
    DVC runs it."""
    import importlib.util
    import sys

    if str(STAGES) not in sys.path:
        sys.path.insert(0, str(STAGES))
    spec = importlib.util.spec_from_file_location(f"stage_{name}", STAGES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def blob_store(path: Path, rng: np.random.Generator, centres: np.ndarray, weights: np.ndarray, dtype: str,
               train_rows: tuple[int, int], test_rows: tuple[int, int], chunk_rows: tuple[int, int],
               blocks: bool = True, n_blocks: int = 3) -> Path:
    """The random fuzz tests' store: Gaussian blobs about ``centres`` (classes drawn by ``weights``, every class at
    least 3 train and 1 test rows), ``n_blocks`` per-block tokens and a layer norm where ``blocks`` (for
    ``--fusion``); row counts and chunk rows drawn from the half-open ranges given."""
    from foal_pipe.store import write_store
    from foal_pipe.store.blockfusion import FinalNorm

    n_classes, dim = centres.shape

    def split(n: int, least: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.permutation(np.concatenate([np.repeat(np.arange(n_classes), least), rng.choice(n_classes, n, p=weights)]))
        tokens = centres[y][:, None, :] + rng.normal(size=(y.size, n_blocks, dim)) * rng.uniform(0.8, 2.0, n_blocks)[:, None]
        return tokens.astype(dtype), y

    (train, y), (test, y_test) = split(int(rng.integers(*train_rows)), 3), split(int(rng.integers(*test_rows)), 1)
    norm = FinalNorm("layernorm", 1e-6, rng.uniform(0.5, 1.5, dim).astype(np.float32), rng.normal(size=dim).astype(np.float32))
    return write_store(path, (train.mean(axis=1), y), (test.mean(axis=1), y_test), [f"k{c}" for c in range(n_classes)],
                       chunk_rows=int(rng.integers(*chunk_rows)), dtype=dtype,
                       blocks=(train, test) if blocks else None, norm=norm if blocks else None)


def interrupt_after(monkeypatch, chunks: int, error: type[BaseException] = KeyboardInterrupt):
    """Make ``FeatureWriter.write`` stop the run by ``error`` (Ctrl-C by default) once ``chunks`` chunks are written
    (an extraction stopped partway, resumable); returns the real ``write``."""
    import foal_pipe.store as st

    real, calls = st.FeatureWriter.write, []

    def write(writer, lo, block):
        if len(calls) == chunks:
            raise error
        calls.append(lo)
        real(writer, lo, block)

    monkeypatch.setattr(st.FeatureWriter, "write", write)
    return real


def documented_stream(y: np.ndarray, n_classes: int, n_tasks: int, seed: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """docs/learn.md, The stream: default_rng(seed) permutes the classes, the first C mod T tasks one class larger, then
    each task's rows (in storage order) shuffled, task by task."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(n_classes)
    cuts = np.cumsum([0, *[n_classes // n_tasks + (t < n_classes % n_tasks) for t in range(n_tasks)]])
    tasks = [sorted(int(c) for c in order[cuts[t]:cuts[t + 1]]) for t in range(n_tasks)]
    rows = []
    for task in tasks:
        idx = np.flatnonzero(np.isin(y, task))
        rng.shuffle(idx)
        rows.append(idx)
    return tasks, rows


def memory_checks(monkeypatch) -> list[dict[str, int]]:
    """Every check_memory call's parts (``prepare``'s, ``table``'s, the orders'), on an unbounded machine."""
    import importlib

    import foal_pipe.memory as memory

    calls: list[dict[str, int]] = []

    def spy(command, parts, fix):
        calls.append(dict(parts))
        return memory.BASELINE_BYTES + sum(parts.values())

    for name in ("foal_pipe.protocol.run", "foal_pipe.protocol.table", "foal_pipe.protocol.orders"):
        monkeypatch.setattr(importlib.import_module(name), "check_memory", spy)
    monkeypatch.setattr(memory, "available_memory", lambda: 2**40)
    return calls


def write_nonfinite_store(*args, **kwargs) -> Path:
    """:func:`~foal_pipe.store.write_store` letting NaN and inf features and block tokens through (it refuses them),
    so that the readers' own refusals of such a store can be tested."""
    from foal_pipe.store import given
    from foal_pipe.store.write import write_store

    original = given.check_finite
    given.check_finite = lambda x, what: None
    try:
        return write_store(*args, **kwargs)
    finally:
        given.check_finite = original
