"""Audit s25, class orders and task splits: `--class-order` files and `pilot`, `--tasks`, `--order-seed(s)` through
`learn`, `sweep` and the Python API (protocol.learn / protocol.sweep with LearnSettings / SweepSettings).

Checked and sound (not repeated here): seeded splits for every --tasks 1..C (first C mod T tasks one larger),
--tasks 0 / negative / above C / huge, pilot and pilot:SEED against np.random.seed(S); np.random.permutation(C),
--order-seeds' recorded `tasks` against default_rng(seed).permutation, --drop-last / --drop-remainder row counts
and emptied classes recomputed by hand, table runs equal to separate learns, untrained / rowless classes in files.

What these tests hold (each was a fault the audit found):
- a class-order file holding an integer of more than 4,300 digits (json's int limit) is a one-line refusal;
- a directory given as the class-order file is called a directory, a pipe not a regular file, not missing files;
- the note on pilot's uneven split does not suggest --drop-remainder, which the same run refuses with pilot;
- `--stream si-blurry` with `--class-order` (or `--drop-remainder`) is refused for the combination, before --tasks;
- a task with no training rows from a --class-order FILE suggests fixing the file, not "fewer --tasks";
- API: class_order="" is refused, not silently replaced by the seeded order;
- API: order_seeds=() and order_seeds=(0, 0) are refused in one line, as --order-seeds refuses them; the API's
  messages on order_seeds name order_seeds;
- API: NumPy integer seeds (seed, order_seed, order_seeds) are recorded as JSON integers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_clean_error, invoke

from foal_pipe.errors import FoalPipeError
from foal_pipe.protocol import learn, sweep
from foal_pipe.protocol.config import ModelConfig, StreamConfig
from foal_pipe.protocol.entry import LearnSettings, SweepSettings
from foal_pipe.store import write_store

C = 7


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """7 classes of 6 features, 23 train and 6 test rows each: a run takes a fraction of a second."""
    def rows(n: int, seed: int):
        rng = np.random.default_rng(seed)
        y = np.tile(np.arange(C), n)
        return (rng.normal(size=(y.size, 6)) + 3 * np.eye(C, 6)[y]).astype(np.float32), y

    path = tmp_path_factory.mktemp("orders") / "s7.zarr"
    return write_store(path, rows(23, 0), rows(6, 1), [f"k{i}" for i in range(C)], chunk_rows=32)


def _run(command: str, store: Path, out: Path, *extra):
    return invoke(command, "--features", store, "--out", out, "--projection-dim", 16, *extra)


# --- class-order files ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_a_label_id_too_long_to_parse_is_a_one_line_error(store, tmp_path, command):
    """`[[0, 1000...0]]` (5,001 digits): json.loads raises ValueError ("Exceeds the limit (4300 digits) for integer
    string conversion"), not JSONDecodeError; read_class_order refuses it in one line, a number too long for a label."""
    order = tmp_path / "order.json"
    order.write_text("[[0, 1" + "0" * 5000 + "]]")
    assert_clean_error(_run(command, store, tmp_path / "out", "--class-order", order), "class order file", tmp_path / "out")


def test_a_directory_as_class_order_is_not_called_missing(store, tmp_path):
    """The path exists (a directory): the refusal says so rather than "does not exist", which would send the user
    looking for a typo instead of the file."""
    folder = tmp_path / "orders"
    folder.mkdir()
    result = _run("learn", store, tmp_path / "out", "--class-order", folder)
    assert_clean_error(result, "class order file", tmp_path / "out")
    assert "does not exist" not in result.output, result.output


@pytest.mark.parametrize("command", ["learn", "sweep"])
def test_pilots_uneven_split_note_suggests_no_refused_option(store, tmp_path, command):
    """docs/orders.md: with pilot "the first C mod T tasks get one class more ... (`--drop-remainder` is refused with
    it)". The note printed for pilot's 7 classes in 3 tasks gives the sizes and suggests --drop-remainder only where
    following it runs (it is refused with pilot: "--class-order pilot streams every class")."""
    result = _run(command, store, tmp_path / "out", "--class-order", "pilot", "--tasks", 3)
    assert result.exit_code == 0, result.output
    note = " ".join(line for line in result.output.splitlines() if line.startswith("note:"))
    assert "7 classes do not split evenly into 3 tasks" in note, result.output
    followed = _run(command, store, tmp_path / "again", "--class-order", "pilot", "--tasks", 3, "--drop-remainder")
    assert "--drop-remainder" not in note or followed.exit_code == 0, (note, followed.output)


@pytest.mark.parametrize("order,tasks", [("pilot", 8), ("file", 3)])
def test_si_blurry_with_a_class_order_is_refused_for_the_combination(store, tmp_path, order, tasks):
    """--stream si-blurry takes --tasks up to the training rows (8 of 7 classes runs without --class-order), and
    refuses --class-order. With both, the combination is refused first (StreamConfig), not the class order's --tasks
    ("--tasks 8 is larger than the number of classes" / "--tasks 3 conflicts with --class-order ...; drop --tasks"),
    whose fix would only lead to the next refusal."""
    path = tmp_path / "order.json"
    path.write_text("[[0, 1], [2, 3, 4, 5, 6]]")
    value = "pilot" if order == "pilot" else path
    result = _run("learn", store, tmp_path / "out", "--stream", "si-blurry", "--class-order", value, "--tasks", tasks)
    assert_clean_error(result, "--stream si-blurry", tmp_path / "out")


def test_a_rowless_task_of_a_class_order_file_does_not_suggest_fewer_tasks(tmp_path):
    """A task of the file whose classes have no training row: the refusal does not suggest "use fewer --tasks (each
    task then holds more classes)", which does not apply to a file, whose --tasks must equal its task count."""
    rng = np.random.default_rng(0)
    y, yt = np.repeat([0, 1, 2], 10), np.repeat([0, 1, 2, 3], 3)
    store = write_store(tmp_path / "s.zarr", (rng.normal(size=(30, 4)).astype(np.float32), y),
                        (rng.normal(size=(12, 4)).astype(np.float32), yt), list("abcd"))
    order = tmp_path / "order.json"
    order.write_text("[[0, 1], [3], [2]]")
    result = _run("learn", store, tmp_path / "out", "--class-order", order)
    assert_clean_error(result, "task 2 (classes 3) has no training rows", tmp_path / "out")
    assert "fewer --tasks" not in result.output, result.output


# --- the Python API ---------------------------------------------------------------------------------------------------

def _settings(kind, stream: StreamConfig, **kw):
    return kind(stream=stream, model=ModelConfig(projection_dim=16), **kw)


def test_an_empty_class_order_is_not_silently_ignored(store, tmp_path):
    """StreamConfig(class_order="") (an unset variable; the CLI refuses an empty path) is refused, as the CLI does,
    rather than running the seeded order and recording it as the run's (while with order_seeds=(0, 1) the same setting
    "fixes the class order")."""
    with pytest.raises(FoalPipeError, match="class_order"):
        learn(store, tmp_path / "out", _settings(LearnSettings, StreamConfig(tasks=3, class_order="")), log=lambda m: None)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind,call", [(LearnSettings, learn), (SweepSettings, sweep)])
def test_empty_order_seeds_are_refused_in_one_line(store, tmp_path, kind, call):
    """order_seeds=() (params.yaml's `[]` means one order from seed) is refused in one line naming order_seeds, not
    an IndexError in runs[0] (protocol/orders.py)."""
    with pytest.raises(FoalPipeError, match="order_seeds"):
        call(store, tmp_path / "out", _settings(kind, StreamConfig(tasks=3), order_seeds=()), log=lambda m: None)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind,call", [(LearnSettings, learn), (SweepSettings, sweep)])
def test_a_repeated_order_seed_is_refused_as_on_the_command_line(store, tmp_path, kind, call):
    """`--order-seeds 0,0` is refused ("repeats a seed; list each class order once"), and so is order_seeds=(0, 0):
    run, it would count order 0 twice in the mean and std and write a metrics.json that `summary` skips and `evaluate`
    refuses as unreadable ("order seed 0 appears twice in 'order_seeds'")."""
    with pytest.raises(FoalPipeError, match="repeat|twice"):
        call(store, tmp_path / "out", _settings(kind, StreamConfig(tasks=3), order_seeds=(0, 0)), log=lambda m: None)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("stream,seeds", [(dict(seed=np.int64(3)), None), (dict(order_seed=np.int64(4)), None),
                                          ({}, (np.int64(4), np.int64(5)))], ids=["seed", "order_seed", "order_seeds"])
def test_numpy_integer_seeds_are_recorded_as_json_integers(store, tmp_path, stream, seeds):
    """check_seed takes np.integer (tests/test_faults_inputs.py: `StreamConfig(seed=np.int64(7)).seed == 7`), and
    StreamConfig and the settings' order_seeds keep its int: metrics.json is written with JSON integers, rather than
    the finished run failing with TypeError "Object of type int64 is not JSON serializable"."""
    out = tmp_path / "out"
    learn(store, out, _settings(LearnSettings, StreamConfig(tasks=3, **stream), order_seeds=seeds), log=lambda m: None)
    metrics = json.loads((out / "metrics.json").read_text())
    expected = 3 if "seed" in stream else 0
    assert type(metrics["seed"]) is int and metrics["seed"] == expected
    if seeds:
        assert metrics["order_seeds"] == [4, 5]
        order = np.random.default_rng(4).permutation(C)  # docs/orders.md: a fresh default_rng(seed), cut 3, 2, 2
        assert metrics["tasks"] == [sorted(order[:3].tolist()), sorted(order[3:5].tolist()), sorted(order[5:].tolist())]
    else:
        assert metrics.get("order_seed", expected) == stream.get("order_seed", expected)


# --- what the fixes above also hold ---------------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="named pipes are POSIX")
def test_a_pipe_as_class_order_is_refused_unread(store, tmp_path):
    """A pipe (`<(...)`, /dev/stdin) can be read once, and every class order's run reads the file again: it is
    refused as not a regular file, before anything opens it (opening a pipe with no writer would hang)."""
    import os

    pipe = tmp_path / "order.fifo"
    os.mkfifo(pipe)
    result = _run("learn", store, tmp_path / "out", "--class-order", pipe)
    assert_clean_error(result, "is not a regular file", tmp_path / "out")
    assert "does not exist" not in result.output, result.output


def test_a_rowless_task_of_a_seeded_split_still_suggests_fewer_tasks(tmp_path):
    """The wording of test_a_rowless_task_of_a_class_order_file_does_not_suggest_fewer_tasks depends on the file:
    without one, fewer --tasks is the fix (each task then holds more classes)."""
    rng = np.random.default_rng(0)
    y, yt = np.repeat([0, 1, 2], 10), np.repeat([0, 1, 2, 3], 3)
    store = write_store(tmp_path / "s.zarr", (rng.normal(size=(30, 4)).astype(np.float32), y),
                        (rng.normal(size=(12, 4)).astype(np.float32), yt), list("abcd"))
    result = _run("learn", store, tmp_path / "out", "--tasks", 4)
    assert_clean_error(result, "has no training rows", tmp_path / "out")
    assert "use fewer --tasks" in result.output, result.output


@pytest.mark.parametrize("stream", [dict(stream="si-blurry", drop_remainder=True), dict(stream="si-blurry", class_order="pilot")])
def test_si_blurry_refuses_disjoint_options_when_configured(stream):
    """The refusal of test_si_blurry_with_a_class_order_is_refused_for_the_combination comes from StreamConfig, before
    any store is read, for --drop-remainder too."""
    with pytest.raises(FoalPipeError, match="splits disjoint tasks; stream='si-blurry' draws its own split"):
        StreamConfig(**stream)


@pytest.mark.parametrize("kw,match", [
    (dict(order_seeds="0,1"), "order_seeds must be a sequence of seeds, got '0,1'"),
    (dict(order_seeds=(0, -1)), "order_seeds holds -1, which is not a seed"),
    (dict(order_seeds=(0, 1), stream=StreamConfig(class_order="pilot")), "so order_seeds has nothing to vary"),
])
def test_api_messages_on_order_seeds_name_order_seeds(store, tmp_path, kw, match):
    """The Python API names the parameter it takes (order_seeds), not `seeds` or `order_seed`."""
    stream = kw.pop("stream", StreamConfig(tasks=3))
    with pytest.raises(FoalPipeError, match=match):
        learn(store, tmp_path / "out", _settings(LearnSettings, stream, **kw), log=lambda m: None)
    assert not (tmp_path / "out").exists()
