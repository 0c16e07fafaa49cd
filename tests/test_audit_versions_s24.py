"""Audit s24: files written by older foal-pipe versions, read by this one.

Method (scratch, not kept here): source trees of commits 9e0de4c (2026-11-25), 213192f and 91428c1 (2026-11-26),
4fafdad (2026-11-28) and 334f6c0 (2026-11-30) run with today's venv wrote digits/image-folder stores (formats 1, 3,
4, 5), learn/sweep runs (ridge, rls, --gamma auto, every head, --order-seeds, Si-Blurry, --fusion), continued runs,
tables and killed tables/extractions; this tree then read them. Everything below agreed with a fresh run of this tree
(numbers equal, W within 1e-12) or refused in one line: learn/sweep/table on old stores, predict (store and --images)
with old models, evaluate and summary of old runs and sweeps, continuation of models that record their stores, old
kept table runs (redone: the code hash differs), a killed format-5 extraction resumed to identical bytes. The models
rewritten here are the old files' exact form: stripping the image identities from this tree's model gives
byte-for-byte the file foal-pipe 4fafdad wrote for the same store.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from helpers import assert_one_line_error, invoke, make_image_tree

from foal_pipe.model.modelfile import read_model, write_model

KEPT_BY_WRITER = ("format", "format_version", "checksum")


def _extract(images: Path, out: Path) -> Path:
    result = invoke("extract", "--dataset", "imagefolder", "--data-dir", images, "--model", "pixels", "--image-size", 8,
                    "--out", out, "--workers", 0, "--device", "cpu")
    assert result.exit_code == 0, result.output
    return out


def _learn(store: Path, out: Path, *extra) -> Path:
    result = invoke("learn", "--features", store, "--out", out, "--gamma", 1, "--projection-dim", 32, *extra)
    assert result.exit_code == 0, result.output
    return out


def _rewrite_model(path: Path, edit) -> None:
    """The model file at ``path`` with its metadata edited by ``edit`` and written again (a valid checksum)."""
    tensors, metadata = read_model(path)
    write_model(path, tensors, edit({k: v for k, v in metadata.items() if k not in KEPT_BY_WRITER}))


def _without_image_identities(metadata: dict) -> dict:
    """What a model written before 2026-11-29 (2f85b0e) records: learned_data without the ``images:`` identity."""
    return {**metadata, "learned_data": [i for i in metadata["learned_data"] if not i.startswith("images:")]}


def test_model_from_before_image_identities_does_not_silently_learn_the_same_images_twice(tmp_path):
    """Fault: a model of foal-pipe 2026-11-27..28 (learned_data without ``images:``) continued on the SAME images
    extracted from a copied/moved folder is accepted, every row counted twice (n_samples_seen_total 2x), no word said.
    This tree's own model is refused there (docs/deploy.md: "from a copy of the folder, known by the images' SHA-256").
    Nothing in the old file shows the new store's images new: refuse, or at least warn as for rows_outside_stores."""
    images = make_image_tree(tmp_path / "imgs", {"ant": 6, "bee": 6, "cat": 6}, test_per_class=2, seed=3)
    run = _learn(_extract(images, tmp_path / "a.zarr"), tmp_path / "run", "--tasks", 3)
    copied = _extract(shutil.copytree(images, tmp_path / "moved"), tmp_path / "moved.zarr")
    model = run / "model.safetensors"
    now = invoke("learn", "--init-model", model, "--features", copied, "--out", tmp_path / "c0", "--tasks", 3)
    assert_one_line_error(now, "already learned the training rows")  # the premise: this tree's file is refused
    _rewrite_model(model, _without_image_identities)
    result = invoke("learn", "--init-model", model, "--features", copied, "--out", tmp_path / "c1", "--tasks", 3)
    if result.exit_code != 0:
        assert_one_line_error(result, str(model))
        assert not (tmp_path / "c1").exists()
        return
    said = " ".join(result.output.split()).lower()
    assert "warning" in said and str(copied).lower() in said, (
        "18 training rows learned twice without a refusal or a warning: " + result.output)


def _as_pre_versioned_continuation(run: Path) -> dict:
    """A continued run's metrics.json as foal-pipe 213192f (2026-11-26, before 90f8182) wrote it: no format keys, no
    model_checksum, the continuation's keys at the top level and no ``task_names`` (nor all_classes). Checked against
    a file that tree wrote: the same keys and values but for paths."""
    metrics = json.loads((run / "metrics.json").read_text())
    for key in ("format", "format_version", "model_checksum", "drop_remainder"):
        metrics.pop(key, None)
    continuation = metrics.pop("continuation")
    continuation.pop("task_names")
    continuation.pop("all_classes", None)
    metrics.update(continuation, projection_init="uniform", seed=0)
    (run / "metrics.json").write_text(json.dumps(metrics, sort_keys=True))
    return metrics


def test_pre_versioned_continued_run_is_evaluated_with_its_own_classes(tmp_path):
    """Fault: for a continued run written before ``task_names``, evaluate reads ``tasks`` (the new store's label ids)
    as the model's label ids: weight_norms.csv and summary.md give this run's tasks to the model's first classes (ant,
    bee instead of dog, eel), and a false note says the store "changed since `foal-pipe learn`" and drops
    class_accuracy.csv and the confusion matrix, exit 0. ``label_ids`` (by name) and the store's class list say which
    classes the tasks hold; or refuse in one line."""
    first = make_image_tree(tmp_path / "first", {"ant": 6, "bee": 6, "cat": 6}, test_per_class=2, seed=3)
    second = make_image_tree(tmp_path / "second", {"dog": 6, "eel": 6}, test_per_class=2, seed=4)
    old = _learn(_extract(first, tmp_path / "first.zarr"), tmp_path / "old", "--tasks", 3)
    store = _extract(second, tmp_path / "second.zarr")
    run = tmp_path / "cont"
    result = invoke("learn", "--init-model", old / "model.safetensors", "--features", store, "--out", run, "--tasks", 2)
    assert result.exit_code == 0, result.output
    metrics = _as_pre_versioned_continuation(run)
    classes = ["dog", "eel"]  # the second store's classes, in label-id order
    expected = {classes[c]: t + 1 for t, task in enumerate(metrics["tasks"]) for c in task}
    result = invoke("evaluate", "--run", run)
    if result.exit_code != 0:
        assert_one_line_error(result, "metrics.json", after_notes=True)
        return
    said = " ".join(result.output.split())
    assert "store changed" not in said, said
    rows = list(csv.DictReader((run / "eval" / "weight_norms.csv").open()))
    tasks = {row["name"]: row["task"] for row in rows}
    assert tasks == {"ant": "", "bee": "", "cat": "", **{k: str(v) for k, v in expected.items()}}, tasks
    assert (run / "eval" / "class_accuracy.csv").exists()


def test_model_from_before_learned_records_is_named_as_such(tmp_path):
    """Unclear error: a version-2 model written before models recorded their stores (foal-pipe before 1b6c9b3,
    2026-11-26, e.g. 91428c1: checksum, no learned_from/learned_data), learned from a store WITH a generation id, is
    refused as "(a version-1 file, or a model of stores without a generation id)": neither is true. Name the real cause
    (a model file from an older foal-pipe, before models recorded the stores they learned)."""
    images = make_image_tree(tmp_path / "imgs", {"ant": 6, "bee": 6}, test_per_class=2, seed=3)
    run = _learn(_extract(images, tmp_path / "a.zarr"), tmp_path / "run", "--tasks", 2)
    model = run / "model.safetensors"
    _rewrite_model(model, lambda m: {k: v for k, v in m.items() if k not in ("learned_from", "learned_data")})
    assert read_model(model, names=())[1]["format_version"] == 2
    other = _extract(make_image_tree(tmp_path / "new", {"cat": 6}, test_per_class=2, seed=5), tmp_path / "b.zarr")
    result = invoke("learn", "--init-model", model, "--features", other, "--out", tmp_path / "c", "--tasks", 1)
    assert_one_line_error(result, "records no store it learned")
    text = " ".join(result.output.split())
    assert "(a version-1 file, or a model of stores without a generation id)" not in text, text


def _continued_pair(tmp_path: Path, head: str | None = None) -> tuple[Path, Path]:
    """A model of ant, bee, cat (3 tasks) continued on a store of dog and eel (2 tasks): the old run and the continued."""
    first = make_image_tree(tmp_path / "first", {"ant": 6, "bee": 6, "cat": 6}, test_per_class=2, seed=3)
    second = make_image_tree(tmp_path / "second", {"dog": 6, "eel": 6}, test_per_class=2, seed=4)
    store, old = _extract(first, tmp_path / "first.zarr"), tmp_path / "old"
    if head is None:
        _learn(store, old, "--tasks", 3)
    else:
        learned = invoke("learn", "--features", store, "--out", old, "--head", head, "--projection-dim", 32, "--tasks", 3)
        assert learned.exit_code == 0, learned.output
    run = tmp_path / "cont"
    result = invoke("learn", "--init-model", old / "model.safetensors", "--features",
                    _extract(second, tmp_path / "second.zarr"), "--out", run, "--tasks", 2)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output.lower(), result.output  # a model that records its images: nothing unshown
    return old, run


def test_continued_head_without_weight_norms_is_evaluated_with_its_own_classes(tmp_path):
    """Fault (this tree's files): ncm keeps no W, so no weight norms named the model's classes, and evaluate took the
    store's label ids (0, 1) as the model's (dog, eel are 3, 4): "the store changed" and no per-class table, exit 0."""
    _, run = _continued_pair(tmp_path, "ncm")
    result = invoke("evaluate", "--run", run)
    assert result.exit_code == 0, result.output
    assert "store changed" not in " ".join(result.output.split()), result.output
    rows = list(csv.DictReader((run / "eval" / "class_accuracy.csv").open()))
    assert {row["name"]: row["task"] for row in rows} == {"ant": "", "bee": "", "cat": "", "dog": "1", "eel": "2"}
    assert sum(int(row["test_rows"]) for row in rows) == 4  # the second store's test rows, 2 a class


def test_pre_versioned_continued_run_with_its_store_gone_gives_no_class_a_wrong_task(tmp_path):
    """Without ``task_names`` and without the store that names ``tasks`` (its label ids), no class is given a task
    and summary.md lists no classes per task: the store's ids 0, 1 are the model's ant and bee."""
    _, run = _continued_pair(tmp_path)
    _as_pre_versioned_continuation(run)
    shutil.rmtree(tmp_path / "second.zarr")
    result = invoke("evaluate", "--run", run)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((run / "eval" / "weight_norms.csv").open()))
    assert [row["name"] for row in rows] == ["ant", "bee", "cat", "dog", "eel"]
    assert all(row["task"] == "" for row in rows), rows
    assert "Classes per task" not in (run / "eval" / "summary.md").read_text()


def test_refused_gamma_is_not_said_to_be_in_the_sums(tmp_path):
    """G and Q do not depend on gamma: a refused ``--gamma`` gives the reason that holds (the stream goes on at the
    model's gamma, or its search), where ``--projection-dim`` is refused because the sums were computed with it."""
    old, _ = _continued_pair(tmp_path)
    for option, reason in ((("--gamma", "auto"), "one run over the old stream and the new one at its gamma"),
                           (("--projection-dim", 16), "its sums were computed with it")):
        result = invoke("learn", "--init-model", old / "model.safetensors", "--features", tmp_path / "second.zarr",
                        "--out", tmp_path / "c", "--tasks", 2, *option)
        assert_one_line_error(result, "conflicts with the model's", reason)
    auto = _learn(tmp_path / "first.zarr", tmp_path / "auto", "--tasks", 3, "--gamma", "auto")
    result = invoke("learn", "--init-model", auto / "model.safetensors", "--features", tmp_path / "second.zarr",
                    "--out", tmp_path / "c", "--tasks", 2, "--gamma", 2)
    assert_one_line_error(result, "--gamma 2.0 conflicts with the model's auto", "keeps choosing by GCV over its grid")
    assert "sums were computed" not in result.output
