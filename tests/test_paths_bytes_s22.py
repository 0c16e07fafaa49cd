"""Where things are must not change what comes out: a store copied, moved, renamed or reached through a symlink, a
relative or absolute path, another working directory give the same bytes (the store's path as typed, which the
outputs record, aside); awkward paths (spaces, a leading dash, Unicode forms, ``~``, a line break, long names) work
or are refused in one line; an output that is a symlink, a file or read-only is handled without harm."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from helpers import assert_one_line_error, build_store, invoke, written_copy

LEARN = ("--tasks", "3", "--projection-dim", "40", "--seed", "1")
TIMED = {"timings.json"}  # wall-clock seconds: the one file allowed to differ between two runs


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("paths")
    return written_copy(build_store(root / "raw.zarr"), root / "s.zarr")


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in TIMED}


def _pipeline(features: str, out: Path) -> dict[str, bytes]:
    """learn, sweep, evaluate (no plots), predict and a table on ``features`` (as typed), into ``out``; every file
    they wrote, with the typed store path replaced by ``STORE`` (the one difference allowed: the outputs record it)."""
    run, sweep = out / "run", out / "sweep"
    for args in (("learn", "--features", features, "--out", run, "--gamma", "auto", *LEARN),
                 ("sweep", "--features", features, "--out", sweep, *LEARN),
                 ("evaluate", "--run", run, "--sweep", sweep, "--out", out / "eval", "--no-plots"),
                 ("predict", "--model", run / "model.safetensors", "--features", features, "--out", out / "pred.csv"),
                 ("table", "--features", features, "--out", out / "table", "--tasks", "3", "--projection-dim", "40",
                  "--order-seeds", "0,1", "--heads", "ridge,ncm")):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
    recorded = json.loads((run / "metrics.json").read_text())["features"]
    return {name: data.replace(json.dumps(recorded).encode(), b'"STORE"').replace(recorded.encode(), b"STORE")
            for name, data in _files(out).items()
            if name != "eval/summary.md"}  # names the run and sweep directories as typed


def test_a_copied_moved_or_linked_store_from_another_folder_gives_the_same_bytes(store, tmp_path, monkeypatch):
    """The reference: the store by its relative name from its own folder. Then a copy, a moved copy, a symlink, an
    absolute path, ``./`` and a trailing slash, each from a folder of its own."""
    monkeypatch.chdir(store.parent)
    reference = _pipeline("s.zarr", tmp_path / "ref")
    assert (tmp_path / "ref" / "eval" / "class_accuracy.csv").exists()
    shutil.copytree(store, tmp_path / "copy.zarr")
    shutil.copytree(store, tmp_path / "before.zarr")
    (tmp_path / "before.zarr").rename(tmp_path / "moved.zarr")
    (tmp_path / "link.zarr").symlink_to(store)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for k, features in enumerate(["../copy.zarr", "../moved.zarr", "../link.zarr", str(store), "./../copy.zarr",
                                  "../copy.zarr/"]):
        monkeypatch.chdir(elsewhere)
        got = _pipeline(features, tmp_path / f"v{k}")
        assert got.keys() == reference.keys(), features
        for name in reference:
            if name.startswith("table/"):  # the table labels its column by the store's folder name
                continue
            assert got[name] == reference[name], (features, name)


def test_the_same_relative_command_from_two_folders_gives_the_same_bytes(store, tmp_path, monkeypatch):
    outputs = []
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        shutil.copytree(store, tmp_path / where / "s.zarr")
        monkeypatch.chdir(tmp_path / where)
        _pipeline("s.zarr", Path("out"))
        outputs.append(_files(tmp_path / where / "out"))
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("name", ["my store.zarr", "-store.zarr", "café.zarr", "x" * 240 + ".zarr"])
def test_awkward_store_names_work(store, tmp_path, monkeypatch, name):
    monkeypatch.chdir(store.parent)
    reference = _pipeline("s.zarr", tmp_path / "ref")
    shutil.copytree(store, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    got = _pipeline(f"./{name}" if name.startswith("-") else name, tmp_path / "out")
    assert {k: v for k, v in got.items() if not k.startswith("table/")} == \
        {k: v for k, v in reference.items() if not k.startswith("table/")}


def test_outputs_through_a_symlinked_folder_land_in_its_target_and_keep_the_link(store, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "mine.txt").write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(target)
    result = invoke("learn", "--features", store, "--out", link, *LEARN)
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and (target / "metrics.json").exists() and (target / "mine.txt").read_text() == "mine"


@pytest.mark.parametrize("command", ["learn", "sweep", "table", "evaluate", "predict"])
def test_an_out_that_is_a_file_is_refused_and_kept(store, tmp_path, command):
    run = tmp_path / "run"
    assert invoke("learn", "--features", store, "--out", run, *LEARN).exit_code == 0
    existing = tmp_path / "existing"
    existing.write_text("keep")
    out = existing / "p.csv" if command == "predict" else existing
    args = {"evaluate": ("evaluate", "--run", run, "--out", out),
            "predict": ("predict", "--model", run / "model.safetensors", "--features", store, "--out", out)}.get(
        command, (command, "--features", store, "--out", out, "--tasks", "3", "--projection-dim", "40"))
    assert_one_line_error(invoke(*args), str(existing.name), "--out")
    assert existing.read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "run"]


CLI = "import sys; from foal_pipe.cli import main; sys.argv[0] = 'foal-pipe'; main()"
NOCAP = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner,-linux_immutable", "--"]


@pytest.mark.parametrize("command", ["learn", "sweep", "table"])
def test_a_read_only_folder_or_a_link_to_one_is_refused_in_one_line(store, tmp_path, command):
    read_only = tmp_path / "ro"
    read_only.mkdir()
    (read_only / "k").write_text("keep")
    (tmp_path / "link").symlink_to(read_only)
    read_only.chmod(0o555)
    prefix = NOCAP if os.geteuid() == 0 else []
    if prefix and shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's DAC override")
    try:
        for out in (read_only, read_only / "x", tmp_path / "link", tmp_path / "link" / "y"):
            done = subprocess.run([*prefix, sys.executable, "-c", CLI, command, "--features", str(store),
                                   "--out", str(out), "--tasks", "3", "--projection-dim", "40"],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 1, done.stderr
            assert done.stderr.startswith("Error: cannot write ") and "Permission denied" in done.stderr, done.stderr
            assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
            assert sorted(p.name for p in read_only.iterdir()) == ["k"]
    finally:
        read_only.chmod(0o755)


# --- faults the audit found: each is xfail(strict) until mended ---------------------------------------------------


def _two_folders_with_one_store_name(tmp_path: Path, legacy: bool) -> tuple[Path, Path]:
    """``proj/s.zarr`` (the run's store, learned as ``s.zarr`` from ``proj``) and ``else/s.zarr``, another store of
    the same classes and number of test rows; ``legacy``: stores of the first format, without a generation id."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "else").mkdir()
    for folder, seed in (("proj", 0), ("else", 5)):
        raw = build_store(tmp_path / f"raw-{folder}.zarr", seed=seed)
        if legacy:
            raw.rename(tmp_path / folder / "s.zarr")
        else:
            written_copy(raw, tmp_path / folder / "s.zarr")
    return tmp_path / "proj", tmp_path / "else"


def test_evaluate_finds_the_runs_own_store_whatever_folder_it_runs_in(tmp_path, monkeypatch):
    proj, other = _two_folders_with_one_store_name(tmp_path, legacy=False)
    monkeypatch.chdir(proj)
    assert invoke("learn", "--features", "s.zarr", "--out", "runs/r", *LEARN).exit_code == 0
    outputs = []
    for where, out in ((proj, tmp_path / "ev1"), (other, tmp_path / "ev2")):
        monkeypatch.chdir(where)
        result = invoke("evaluate", "--run", proj / "runs" / "r", "--out", out, "--no-plots")
        assert result.exit_code == 0, result.output
        outputs.append(_files(out))
    assert "class_accuracy.csv" in outputs[0]
    assert outputs[0] == outputs[1]


def test_evaluate_never_scores_another_store_of_the_recorded_name(tmp_path, monkeypatch):
    proj, other = _two_folders_with_one_store_name(tmp_path, legacy=True)
    monkeypatch.chdir(proj)
    assert invoke("learn", "--features", "s.zarr", "--out", "runs/r", *LEARN).exit_code == 0
    assert invoke("evaluate", "--run", "runs/r", "--out", tmp_path / "ev1", "--no-plots").exit_code == 0
    right = (tmp_path / "ev1" / "class_accuracy.csv").read_bytes()
    monkeypatch.chdir(other)
    assert invoke("evaluate", "--run", proj / "runs" / "r", "--out", tmp_path / "ev2", "--no-plots").exit_code == 0
    got = tmp_path / "ev2" / "class_accuracy.csv"
    assert not got.exists() or got.read_bytes() == right  # refused (said why), or the run's own store's numbers


@pytest.mark.parametrize("command", ["learn", "sweep", "table", "evaluate", "predict"])
def test_a_tilde_out_is_the_home_folder_not_a_folder_named_tilde(store, tmp_path, monkeypatch, command):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    run = tmp_path / "run"
    assert invoke("learn", "--features", store, "--out", run, *LEARN).exit_code == 0
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    args = {"evaluate": ("evaluate", "--run", run, "--out", "~/out", "--no-plots"),
            "predict": ("predict", "--model", run / "model.safetensors", "--features", store, "--out", "~/out")}.get(
        command, (command, "--features", store, "--out", "~/out", "--tasks", "3", "--projection-dim", "40"))
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert not (work / "~").exists()
    assert (home / "out").exists()


@pytest.mark.parametrize("command", ["info", "learn"])
def test_a_tilde_store_is_read_from_the_home_folder(store, tmp_path, monkeypatch, command):
    home = tmp_path / "home"
    home.mkdir()
    (home / "s.zarr").symlink_to(store)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    args = ("info", "~/s.zarr") if command == "info" else ("learn", "--features", "~/s.zarr", "--out", "r", *LEARN)
    result = invoke(*args)
    assert result.exit_code == 0, result.output


def test_a_store_name_in_the_other_unicode_form_is_named_as_such(store, tmp_path, monkeypatch):
    nfc = unicodedata.normalize("NFC", "café.zarr")
    shutil.copytree(store, tmp_path / nfc)
    monkeypatch.chdir(tmp_path)
    result = invoke("info", unicodedata.normalize("NFD", nfc))
    assert_one_line_error(result, "NFC")
    assert "Unicode" in result.output


def test_a_path_with_a_line_break_is_refused_in_one_line(tmp_path):
    result = invoke("info", tmp_path / "no\nsuch.zarr")
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1, result.output


def _tick_boxes(fig) -> list:
    renderer = fig.canvas.get_renderer()
    return [label.get_window_extent(renderer) for ax in fig.axes for label in ax.get_xticklabels() if label.get_text()]


def test_table_png_draws_long_store_names_apart_and_inside_the_figure(store, tmp_path, recwarn, figures):
    names = [f"vit_base_patch16_224_augreg2_in21k_ft_in1k_cifar100_seed{k}.zarr" for k in range(2)]
    for name in names:
        shutil.copytree(store, tmp_path / name)
    result = invoke("table", "--features", tmp_path / names[0], "--features", tmp_path / names[1], "--out",
                    tmp_path / "t", "--tasks", "3", "--projection-dim", "40", "--order-seeds", "0", "--heads", "ridge")
    assert result.exit_code == 0, result.output
    assert not [w for w in recwarn if "constrained_layout" in str(w.message)]
    (fig,) = figures
    a, b = _tick_boxes(fig)
    assert not a.overlaps(b)
    assert all(box.x0 >= 0 and box.x1 <= fig.bbox.x1 for box in (a, b))


def test_table_png_title_fits_the_figure(store, tmp_path, figures):
    result = invoke("table", "--features", store, "--out", tmp_path / "t", "--tasks", "3", "--projection-dim", "40",
                    "--order-seeds", "0,1", "--heads", "ridge,ncm")
    assert result.exit_code == 0, result.output
    (fig,) = figures
    box = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1, (box, fig.bbox)


def test_the_pipeline_files_hold_no_absolute_path_of_a_relative_store(store, tmp_path, monkeypatch):
    """A relative --features is recorded as typed (docs/evaluate.md), never resolved to where it was run."""
    monkeypatch.chdir(store.parent)
    _pipeline("s.zarr", tmp_path / "out")
    texts = [p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.suffix in {".json", ".csv", ".md", ".tex"}]
    assert texts and not any(str(store.parent).encode() in t for t in texts)
    assert json.loads((tmp_path / "out" / "run" / "metrics.json").read_text())["features"] == "s.zarr"
