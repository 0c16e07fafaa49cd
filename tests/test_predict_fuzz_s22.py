"""`foal-pipe predict` over random small stores and models: the routes that must agree do.

1. `predict --features` on a split gives, row for row, the Python API's label ids, names and scores (the CSV's text
   exactly), and on the test split the per-task accuracy of `learn`'s last accuracy-matrix row (every head, class
   orders, fusions, `--gamma auto`, continued models).
2. `predict --images` on the image files of a pixels store equals `predict --features` on that store, row for row
   (matched through the store's split manifest).
3. The CSV to a file and to stdout are the same bytes, twice; class names with commas, quotes, newlines, carriage
   returns, formula-leading characters and non-ASCII letters read back as the class names; `--out` onto an existing
   file replaces it (keeping its mode), a folder, the model or a path in the store is refused before any work.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, blocks_store, invoke, make_image_tree

import foal_pipe
from foal_pipe.model.deploy import open_model_store
from foal_pipe.store import write_store

HEADS = ("ridge", "ncm", "slda", "fecam", "balanced", "dual", "cosine")
PROJECTED = ("ridge", "balanced", "dual")  # heads that always work on the projection
LETTERS = [chr(97 + i) for i in range(26)]


def cluster_store(path: Path, names: list[str], seed: int, dim: int, n_train: int, n_test: int, chunk: int) -> Path:
    """Gaussian clusters, one fixed mean per class NAME (so stores sharing a name share its distribution)."""
    rng = np.random.default_rng(seed)
    means = np.random.default_rng(99).normal(size=(len(LETTERS), dim)) * 2
    splits = []
    for n in (n_train, n_test):
        y = rng.integers(0, len(names), size=n)
        X = means[[LETTERS.index(name) for name in np.asarray(names)[y]]] + rng.normal(size=(n, dim))
        splits.append((X.astype(np.float32), y))
    return write_store(path, *splits, names, chunk_rows=chunk)


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text, newline="")))


def split_rows(model: Path, store: Path, split: str) -> tuple[list[np.ndarray], np.ndarray, list[str]]:
    """The split's feature chunks as `predict` reads them (a fused store fused as the model's), labels, class names."""
    api = foal_pipe.load_model(model)
    data = open_model_store(store, api.encoder_spec).split(split)
    chunks = [X for _, X in data.iter_chunks()]
    return chunks, np.asarray(data.labels, dtype=np.int64), list(open_model_store(store, api.encoder_spec).classes)


def check_predict_against_api(model: Path, store: Path, split: str) -> np.ndarray:
    """`predict --features` equals the Python API's outputs on the same rows, as text; returns the predicted ids."""
    result = invoke("predict", "--model", str(model), "--features", str(store), "--split", split)
    assert result.exit_code == 0, result.output
    rows = csv_rows(result.stdout)
    api = foal_pipe.load_model(model)
    chunks, labels, classes = split_rows(model, store, split)
    X = np.concatenate(chunks)
    predicted, names = api.predict(X), api.predict_names(X)
    scores = np.concatenate([api.scores(chunk) for chunk in chunks])  # `predict` scores chunk by chunk
    assert len(rows) == labels.size
    assert list(rows[0]) == ["row", "predicted_class", "predicted_name", "score", "true_class", "true_name"]
    for i, row in enumerate(rows):
        best = int(np.argmax(scores[i]))
        assert api.classifier.classes_[best] == predicted[i]
        assert row == {"row": str(i), "predicted_class": str(predicted[i]), "predicted_name": names[i],
                       "score": repr(float(scores[i, best])), "true_class": str(labels[i]),
                       "true_name": classes[labels[i]]}, (i, row)
    _, by_store = api.store_predictions(store, split)
    np.testing.assert_array_equal(by_store, predicted)
    return predicted


def check_last_row(metrics: dict, predicted: np.ndarray, labels: np.ndarray) -> None:
    """Each task's accuracy of `predict`'s ids equals `learn`'s last accuracy-matrix row (the first order's)."""
    walk = metrics["orders"][0] if "orders" in metrics else metrics
    got = [float((predicted[np.isin(labels, t)] == labels[np.isin(labels, t)]).mean()) for t in walk["tasks"]]
    np.testing.assert_allclose(got, walk["accuracy_matrix"][-1], rtol=0, atol=1e-12)


def learn_args(rng: random.Random, head: str, tasks: int) -> list[str]:
    args = ["--tasks", str(tasks)]
    if head != "ridge":
        args += ["--head", head]
    if head in PROJECTED or rng.random() < 0.3:
        args += ["--projection-dim", str(rng.choice([8, 20, 50]))]
    if head == "ridge" and rng.random() < 0.4:
        args += ["--gamma", "auto"]
    if rng.random() < 0.3:
        args += ["--order-seeds", "3,1"]
    elif rng.random() < 0.5:
        args += ["--order-seed", str(rng.randint(0, 9))]
    return args


def store_route(tmp: Path, seed: int) -> None:
    """Route 1 on one random store and model."""
    rng = random.Random(seed)
    head = rng.choice(HEADS + ("ridge",) * 3)
    fusion: list[str] = []
    if rng.random() < 0.25:
        store, n_classes = blocks_store(tmp / "s.zarr"), 4
        fusion = ["--fusion", rng.choice(["last", "mean:1-2", "mean-cls"])]
    else:
        n_classes = rng.randint(3, 7)
        store = cluster_store(tmp / "s.zarr", LETTERS[:n_classes], seed, rng.randint(4, 12), rng.randint(60, 200),
                              rng.randint(20, 60), rng.choice([7, 16, 64]))
    run = tmp / "run"
    result = invoke("learn", "--features", str(store), "--out", str(run),
                    *learn_args(rng, head, rng.randint(1, min(3, n_classes))), *fusion)
    assert result.exit_code == 0, result.output
    metrics = json.loads((run / "metrics.json").read_text())
    predicted = check_predict_against_api(run / "model.safetensors", store, "test")
    check_last_row(metrics, predicted, split_rows(run / "model.safetensors", store, "test")[1])
    check_predict_against_api(run / "model.safetensors", store, "train")


def continued_route(tmp: Path, seed: int) -> None:
    """Route 1 on a continued model: its new store (whose ids agree) and its first store."""
    rng = random.Random(seed)
    head, dim = rng.choice(HEADS), rng.randint(4, 10)
    first = cluster_store(tmp / "a.zarr", ["a", "b", "c"], seed, dim, 80, 30, 16)
    new = cluster_store(tmp / "b.zarr", ["a", "b", "c", "d", "e"], seed + 1000, dim, 80, 30, rng.choice([5, 16]))
    one = ["--tasks", str(rng.randint(1, 3))] + (["--head", head] if head != "ridge" else [])
    if head in PROJECTED:
        one += ["--projection-dim", str(rng.choice([10, 30]))]
    if head == "ridge" and rng.random() < 0.5:
        one += ["--gamma", "auto"]
    assert invoke("learn", "--features", str(first), "--out", str(tmp / "r1"), *one).exit_code == 0
    result = invoke("learn", "--init-model", str(tmp / "r1" / "model.safetensors"), "--features", str(new),
                    "--out", str(tmp / "r2"), "--tasks", str(rng.randint(1, 3)))
    assert result.exit_code == 0, result.output
    model = tmp / "r2" / "model.safetensors"
    predicted = check_predict_against_api(model, new, "test")
    check_last_row(json.loads((tmp / "r2" / "metrics.json").read_text()), predicted, split_rows(model, new, "test")[1])
    check_predict_against_api(model, first, "test")


def image_route(tmp: Path, seed: int) -> None:
    """Route 2: `predict --images` on a split's files equals `predict --features` on the store extracted from them."""
    from foal_pipe.extract import ExtractSpec, run_extract
    from foal_pipe.store.manifest import parse_stored_manifest, stored_manifest

    rng = random.Random(seed)
    classes = rng.sample(["cat", "Dog", "émeu", "b,c", "x y", "Zeta", "ant"], rng.randint(2, 4))
    tree = make_image_tree(tmp / "img", {c: rng.randint(3, 6) for c in classes}, test_per_class=rng.randint(1, 3),
                           seed=seed)
    store = tmp / "px.zarr"
    run_extract(ExtractSpec(dataset="imagefolder", data_dir=str(tree), model="pixels", image_size=rng.choice([8, 12]),
                            out=str(store), device="cpu", workers=0, batch_size=rng.randint(1, 6),
                            chunk_rows=rng.choice([3, 8, 64])))
    head = rng.choice(HEADS + ("ridge",))
    args = ["--tasks", "1"] + (["--head", head] if head != "ridge" else [])
    if head in PROJECTED or rng.random() < 0.3:
        args += ["--projection-dim", str(rng.choice([10, 40]))]
    result = invoke("learn", "--features", str(store), "--out", str(tmp / "run"), *args)
    assert result.exit_code == 0, result.output
    model = str(tmp / "run" / "model.safetensors")
    _, entries = parse_stored_manifest(stored_manifest(store) or b"", store)
    for split in ("test", "train"):
        by_store = invoke("predict", "--model", model, "--features", str(store), "--split", split)
        by_images = invoke("predict", "--model", model, "--images", str(tree / split), "--batch-size",
                           str(rng.randint(1, 7)), "--top-k", str(rng.randint(1, 2)))
        assert by_store.exit_code == 0 and by_images.exit_code == 0, by_images.output
        image_rows = {str(Path(r["path"]).relative_to(tree / split)): r for r in csv_rows(by_images.stdout)}
        names = [entry[0] for entry in entries[split]]  # row i of the split is the manifest's entry i
        assert sorted(image_rows) == sorted(names)
        for row, name in zip(csv_rows(by_store.stdout), names, strict=True):
            image = image_rows[name]
            assert (row["predicted_class"], row["predicted_name"]) == (image["predicted_class"], image["predicted_name"])
            # one row against many may differ in the score's last digits (docs/deploy.md)
            assert float(row["score"]) == pytest.approx(float(image["score"]), rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("seed", [0, 10, 14, 19])
def test_store_predictions_equal_the_api_and_the_last_accuracy_row(tmp_path, seed):
    store_route(tmp_path, seed)


def test_a_continued_models_predictions_equal_the_api_and_its_run(tmp_path):
    continued_route(tmp_path, 3)


def test_images_equal_the_store_extracted_from_them(tmp_path):
    image_route(tmp_path, 0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 124))
def test_store_routes_fuzz(tmp_path, seed):
    store_route(tmp_path, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 110))
def test_continued_routes_fuzz(tmp_path, seed):
    continued_route(tmp_path, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 108))
def test_image_routes_fuzz(tmp_path, seed):
    image_route(tmp_path, seed)


# ---------------------------------------------------------------------------------------------------- the CSV's text

ODD_NAMES = ["a,b", 'say "hi"', "line\nbreak", "cr\rname", "=SUM(A1)", "+1", "-x", "@at", "\ttab", "café ☕", " sp "]


def rfc4180_line(fields: list[str]) -> str:
    """RFC 4180 written out: a field with a comma, quote or newline is quoted (its quotes doubled); a row with a
    carriage return in any field has every field quoted (docs: foal_pipe/io/csvrows.py)."""
    def quoted(field: str) -> str:
        return '"' + field.replace('"', '""') + '"'

    if any("\r" in f for f in fields):
        return ",".join(quoted(f) for f in fields) + "\n"
    return ",".join(quoted(f) if any(c in f for c in ',"\n') else f for f in fields) + "\n"


@pytest.fixture(scope="module")
def odd_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("odd")
    rng = np.random.default_rng(0)
    means = rng.normal(size=(len(ODD_NAMES), 6)) * 3

    def rows(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.arange(n) % len(ODD_NAMES)
        return (means[y] + rng.normal(size=(n, 6))).astype(np.float32), y

    store = write_store(tmp / "s.zarr", rows(110), rows(33), ODD_NAMES, chunk_rows=10)
    result = invoke("learn", "--features", str(store), "--out", str(tmp / "run"), "--tasks", "1", "--projection-dim", "30")
    assert result.exit_code == 0, result.output
    return tmp, store, tmp / "run" / "model.safetensors"


def test_odd_class_names_are_written_as_rfc4180_says_and_read_back(odd_run):
    tmp, store, model = odd_run
    result = invoke("predict", "--model", str(model), "--features", str(store))
    assert result.exit_code == 0, result.output
    api = foal_pipe.load_model(model)
    chunks, labels, _ = split_rows(model, store, "test")
    scores = np.concatenate([api.scores(chunk) for chunk in chunks])
    expected = rfc4180_line(["row", "predicted_class", "predicted_name", "score", "true_class", "true_name"])
    for i, (row_scores, label) in enumerate(zip(scores, labels)):
        k = int(np.argmax(row_scores))
        expected += rfc4180_line([str(i), str(k), ODD_NAMES[k], repr(float(row_scores[k])), str(label), ODD_NAMES[label]])
    assert result.stdout_bytes.decode("utf-8") == expected
    assert {row["true_name"] for row in csv_rows(result.stdout)} == set(ODD_NAMES)


def test_file_and_stdout_give_the_same_bytes_twice(odd_run, tmp_path):
    _, store, model = odd_run
    entry = Path(sys.executable).parent / "foal-pipe"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LC_ALL": "C", "PYTHONIOENCODING": "ascii"}  # bytes whatever the locale
    cmd = [str(entry), "predict", "--model", str(model), "--features", str(store)]
    stdout = subprocess.run(cmd, capture_output=True, env=env, check=True).stdout
    subprocess.run([*cmd, "--out", str(tmp_path / "p.csv")], capture_output=True, env=env, check=True)
    first = (tmp_path / "p.csv").read_bytes()
    subprocess.run([*cmd, "--out", str(tmp_path / "p.csv")], capture_output=True, env=env, check=True)
    assert stdout == first == (tmp_path / "p.csv").read_bytes()
    assert "café ☕".encode() in stdout


def test_images_csv_quotes_odd_folder_names_and_repeats_its_bytes(tmp_path):
    from foal_pipe.extract import ExtractSpec, run_extract

    tree = make_image_tree(tmp_path / "img", {"a\nb": 4, "c\rd": 4, "=e": 4, 'q"u': 4}, test_per_class=2)
    store = tmp_path / "px.zarr"
    run_extract(ExtractSpec(dataset="imagefolder", data_dir=str(tree), model="pixels", image_size=8, out=str(store),
                            device="cpu", workers=0, batch_size=4, chunk_rows=8))
    assert invoke("learn", "--features", str(store), "--out", str(tmp_path / "run"), "--tasks", "1",
                  "--projection-dim", "20").exit_code == 0
    model = str(tmp_path / "run" / "model.safetensors")
    args = ["predict", "--model", model, "--images", str(tree / "test"), "--top-k", "3"]
    to_stdout = invoke(*args)
    assert invoke(*args, "--out", str(tmp_path / "p.csv")).exit_code == 0 and to_stdout.exit_code == 0
    assert to_stdout.stdout_bytes == (tmp_path / "p.csv").read_bytes() == invoke(*args).stdout_bytes
    rows = list(csv.reader(io.StringIO(to_stdout.stdout, newline="")))
    assert rows[0] == ["path", "predicted_class", "predicted_name", "score", "top2_name", "top2_score", "top3_name",
                       "top3_score"]
    api = foal_pipe.load_model(model)
    paths = [Path(row[0]) for row in rows[1:]]
    assert sorted(p.parent.name for p in paths) == sorted(["a\nb", "c\rd", "=e", 'q"u'] * 2)
    assert [row[2] for row in rows[1:]] == api.predict_image_names(paths)
    for line, row in zip(to_stdout.stdout.splitlines(keepends=True)[1:], rows[1:]):
        if "\r" not in "".join(row) and "\n" not in "".join(row):
            assert line == rfc4180_line(row)


# ------------------------------------------------------------------------------------------------------- --out

def test_out_onto_an_existing_file_replaces_it_keeping_its_mode(odd_run, tmp_path):
    _, store, model = odd_run
    out = tmp_path / "p.csv"
    out.write_text("old\n")
    out.chmod(0o640)
    assert invoke("predict", "--model", str(model), "--features", str(store), "--out", str(out)).exit_code == 0
    assert out.stat().st_mode & 0o777 == 0o640
    assert out.read_bytes() == invoke("predict", "--model", str(model), "--features", str(store)).stdout_bytes


@pytest.mark.parametrize("where", ["folder", "model", "store", "in-store"])
def test_out_onto_a_folder_the_model_or_the_store_is_refused_in_one_line(odd_run, tmp_path, where):
    tmp, store, model = odd_run
    target = {"folder": tmp_path, "model": model, "store": store, "in-store": store / "zarr.json"}[where]
    before = {p: p.read_bytes() for p in [model, *store.rglob("*")] if p.is_file()}
    result = invoke("predict", "--model", str(model), "--features", str(store), "--out", str(target))
    assert_one_line_error(result, "--out" if where != "folder" else "directory")
    assert {p: p.read_bytes() for p in before} == before
    assert list(tmp_path.iterdir()) == []
