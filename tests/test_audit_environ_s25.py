"""Audit s25: the same command gives the same bytes under a different environment.

Checked and found to agree (scratch runs, not kept here): `learn` (--gamma 1 and auto), `sweep`, `evaluate`, `table`
(two stores, ridge and ncm, two orders) and `extract` (pixels, and a tiny ViT checkpoint with --keep-blocks) on tiny
inputs, every output file by SHA-256 (timings.json and the sidecar NAME.zarr.log.json aside), under PYTHONHASHSEED 0, 1
and random; LANG/LC_ALL C, C.UTF-8 and de_DE.UTF-8 (decimal comma); TZ UTC and Pacific/Kiritimati; COLUMNS 40 and 300;
a pipe, a terminal (`script`), TERM=dumb; NO_COLOR, FORCE_COLOR; HOME unset (root, who has a passwd entry); a TMPDIR
with spaces; PYTHONWARNINGS=error; MPLBACKEND=svg; a MATPLOTLIBRC with another style (the PNGs keep their bytes);
umask 077 (every file 0600, every folder 0700, the same bytes). Relative against absolute paths from other working
directories differ only where a path is documented as recorded as typed (metrics.json and sweep.json `features`,
table's store labels, summary.md's run, the store's `source` and hence its generation id).

Below: names and paths are taken as the UTF-8 bytes they are (io/pathtext.py), not decoded by the locale's
file-system encoding, so stores and records are the same bytes in every locale; extract with a checkpoint runs where
no home directory can be found (the checkpoint-hash cache is skipped); Python's -O mode, under which zarr 3.1 cannot
read a store, is refused in one line naming it, never reported as a corrupt store.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY_VIT, build_store, invoke, make_image_tree, store_files, three_class_store

CLI = [sys.executable, "-c", "from foal_pipe.cli import main; main()"]
ASCII = {"PYTHONUTF8": "0", "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONIOENCODING": ""}


def _latin1(tmp_path: Path) -> dict[str, str]:
    """An ISO-8859-1 locale built with localedef into ``tmp_path`` (skipped where it cannot be built)."""
    localedef = shutil.which("localedef")
    folder = tmp_path / "locale"
    folder.mkdir()
    if localedef is None or subprocess.run([localedef, "-i", "en_US", "-f", "ISO-8859-1", str(folder / "en_US.ISO-8859-1")],
                                           capture_output=True).returncode not in (0, 1):
        pytest.skip("localedef cannot build en_US.ISO-8859-1 here")
    env = {"LOCPATH": str(folder), "LC_ALL": "en_US.ISO-8859-1", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
    probe = subprocess.run([sys.executable, "-c", "import sys; print(sys.getfilesystemencoding())"], capture_output=True,
                           text=True, env=os.environ | env)
    if probe.stdout.strip() != "iso8859-1":
        pytest.skip("the ISO-8859-1 locale does not take effect here")
    return env


def _locale(kind: str, tmp_path: Path) -> dict[str, str]:
    return ASCII if kind == "ascii" else _latin1(tmp_path)


def _cli(args: list, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, timeout=300, cwd=cwd, env=os.environ | env,
                          text=True, encoding="utf-8", errors="replace")


# --- names and paths follow the bytes on disk, not the locale ----------------------------------------------------

@pytest.mark.parametrize("kind", ["ascii", "latin-1"])
def test_imagefolder_class_names_and_store_bytes_do_not_depend_on_the_locale(tmp_path, kind):
    """`extract --dataset imagefolder` of a tree whose class folder is `café` (UTF-8 bytes on disk) gives the classes
    ["café", "dog"] and the same store bytes (manifest names, generation id) under LC_ALL=C with PYTHONUTF8=0 and under
    an ISO-8859-1 locale as in a UTF-8 one: the names are decoded from their bytes as UTF-8, not by the locale (which
    refused the UTF-8 name under C, and named the class "cafÃ©" under ISO-8859-1)."""
    env = _locale(kind, tmp_path)
    images = make_image_tree(tmp_path / "images", {"café": 3, "dog": 3})
    args = ["extract", "--dataset", "imagefolder", "--data-dir", images, "--model", "pixels", "--image-size", 8,
            "--workers", 0, "--device", "cpu", "--out"]
    assert invoke(*args, tmp_path / "utf8.zarr").exit_code == 0
    classes = json.loads((tmp_path / "utf8.zarr" / "zarr.json").read_text(encoding="utf-8"))["attributes"]["classes"]
    assert classes == ["café", "dog"]  # the reference run, in this (UTF-8) process
    done = _cli([*args, tmp_path / "other.zarr"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    ours, theirs = store_files(tmp_path / "utf8.zarr"), store_files(tmp_path / "other.zarr")
    assert sorted(ours) == sorted(theirs)
    assert [name for name in ours if ours[name] != theirs[name]] == []


@pytest.mark.parametrize("kind", ["ascii", "latin-1"])
def test_learn_table_and_evaluate_record_a_non_ascii_store_path_as_typed_in_any_locale(tmp_path, kind):
    """`learn --features süß.zarr` (relative, the bytes typed are UTF-8) records `features` as typed, "süß.zarr", under
    LC_ALL=C with PYTHONUTF8=0 and under ISO-8859-1 as in a UTF-8 locale (not lone surrogates, not "sÃ¼Ã\\x9f.zarr"),
    and so do table.json's `features` and summary.md's run title: a path's text is its bytes decoded as UTF-8."""
    env = _locale(kind, tmp_path)
    three_class_store(tmp_path / "süß.zarr")
    learned = _cli(["learn", "--features", "süß.zarr", "--out", "rün", "--tasks", 3, "--projection-dim", 8, "--gamma", 1],
                   env, cwd=tmp_path)
    assert learned.returncode == 0, learned.stdout + learned.stderr
    assert json.loads((tmp_path / "rün" / "metrics.json").read_bytes())["features"] == "süß.zarr"
    tabled = _cli(["table", "--features", "süß.zarr", "--out", "tâble", "--tasks", 3, "--projection-dim", 8,
                   "--order-seeds", 0], env, cwd=tmp_path)
    assert tabled.returncode == 0, tabled.stdout + tabled.stderr
    assert json.loads((tmp_path / "tâble" / "table.json").read_bytes())["features"] == ["süß.zarr"]
    evaluated = _cli(["evaluate", "--run", "rün", "--no-plots"], env, cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    assert "# F-OAL run: rün " in (tmp_path / "rün" / "eval" / "summary.md").read_bytes().decode("utf-8")


# --- no home directory --------------------------------------------------------------------------------------------

def test_extract_with_a_checkpoint_needs_no_home_directory(tmp_path, monkeypatch, tiny_vit_checkpoint, one_torch_thread):
    """A container run under a uid without a passwd entry and without HOME (`docker run --user 4242`, OpenShift):
    `extract --checkpoint` runs and completes its store, the checkpoint-hash cache (an optimisation, which
    encoders/hashes.py cache_dir finds under the home directory) skipped rather than a RuntimeError traceback."""
    import pwd

    from foal_pipe.encoders.hashes import CACHE_VARIABLE

    for name in ("HOME", CACHE_VARIABLE, "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    images = make_image_tree(tmp_path / "images", {"cat": 2, "dog": 2})
    out = tmp_path / "vit.zarr"
    result = invoke("extract", "--dataset", "imagefolder", "--data-dir", images, "--model", TINY_VIT, "--checkpoint",
                    tiny_vit_checkpoint, "--model-kwargs", "patch_size=8,depth=2,num_heads=2,embed_dim=32",
                    "--image-size", 32, "--out", out, "--workers", 0, "--device", "cpu")
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert result.exit_code == 0, result.output
    assert json.loads((out / "zarr.json").read_text())["attributes"]["complete"] is True


# --- Python's optimisation mode -----------------------------------------------------------------------------------

def test_python_optimize_mode_does_not_call_a_good_store_corrupt(tmp_path):
    """PYTHONOPTIMIZE=1 (or `python -O`): zarr 3.1's GroupMetadata.from_dict pops `node_type` inside an assert, so
    no store can be read; every command is refused before it starts, in one line naming Python's optimisation mode
    (exit status 2, nothing written), not a good store called corrupt."""
    store = three_class_store(tmp_path / "s.zarr")
    args = ["learn", "--features", store, "--tasks", 3, "--projection-dim", 8, "--gamma", 1, "--out"]
    plain = _cli([*args, tmp_path / "plain"], {})
    assert plain.returncode == 0, plain.stdout + plain.stderr
    optimized = _cli([*args, tmp_path / "optimized"], {"PYTHONOPTIMIZE": "1"})
    said = optimized.stdout + optimized.stderr
    if optimized.returncode == 0:
        for name in ("metrics.json", "model.safetensors"):
            assert (tmp_path / "optimized" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name
    else:
        assert "corrupt" not in said and "re-extract" not in said, said
        assert "PYTHONOPTIMIZE" in said or "-O" in said, said
        assert optimized.returncode == 2 and said.startswith("Error: ") and said.count("\n") == 1, said
        assert not (tmp_path / "optimized").exists()


@pytest.mark.parametrize("kind", ["ascii", "latin-1"])
def test_a_split_drawn_by_test_split_does_not_depend_on_the_locale(tmp_path, kind):
    """`extract --test-split` draws each class's test images with a generator seeded by its name: the name as text
    from its bytes, so a `café` folder gives the same split, and the same store bytes, in every locale."""
    env = _locale(kind, tmp_path)
    images = make_image_tree(tmp_path / "images", {"café": 4, "dog": 4}, split=False)
    args = ["extract", "--dataset", "imagefolder", "--data-dir", images, "--test-split", 0.5, "--model", "pixels",
            "--image-size", 8, "--workers", 0, "--device", "cpu", "--out"]
    assert invoke(*args, tmp_path / "utf8.zarr").exit_code == 0
    done = _cli([*args, tmp_path / "other.zarr"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert store_files(tmp_path / "utf8.zarr") == store_files(tmp_path / "other.zarr")


def test_a_class_folder_whose_name_is_not_utf8_is_still_refused_in_any_locale(tmp_path):
    """Only a name whose bytes are not UTF-8 is refused (here ``caf\\xe9``, ISO-8859-1's `café`), and under LC_ALL=C
    as in a UTF-8 locale: one line naming the file by its bytes."""
    images = make_image_tree(tmp_path / "images", {"dog": 2, "cat": 2})
    for split in ("train", "test"):
        os.rename(os.path.join(os.fsencode(images), split.encode(), b"cat"), os.path.join(os.fsencode(images),
                                                                                        split.encode(), b"caf\xe9"))
    done = _cli(["extract", "--dataset", "imagefolder", "--data-dir", images, "--model", "pixels", "--image-size", 8,
                 "--workers", 0, "--device", "cpu", "--out", tmp_path / "s.zarr"], ASCII)
    said = done.stdout + done.stderr
    assert done.returncode == 1 and said.startswith("Error: ") and said.count("\n") == 1, said
    assert "caf\\xe9/img000.png' has a name that is not UTF-8 text" in said, said
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("kind", ["ascii", "latin-1"])
def test_a_continued_run_and_its_reports_are_the_same_bytes_in_any_locale(tmp_path, kind):
    """learn, sweep, a continued learn (`--init-model rä/...`, `--eval-features bä.zarr`) and evaluate, run in a
    UTF-8 locale and in another from two copies of one folder: every record and report is the same bytes, the
    paths in them as typed (metrics.json's `init_model` and scored stores, sweep.json's `features`), and evaluate
    finds the stores the runs recorded (their text turned back into this locale's paths: the per-class results)."""
    env = _locale(kind, tmp_path)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    build_store(ours / "bä.zarr", n_train=120, n_test=60, seed=0)
    build_store(ours / "bü.zarr", n_train=120, n_test=60, seed=1)
    shutil.copytree(ours, theirs)
    steps = [["learn", "--features", "bä.zarr", "--out", "rä", "--tasks", 2, "--projection-dim", 8, "--gamma", 1],
             ["sweep", "--features", "bä.zarr", "--out", "rä", "--tasks", 2, "--projection-dim", 8],
             ["learn", "--features", "bü.zarr", "--out", "cönt", "--tasks", 2, "--gamma", 1, "--init-model",
              "rä/model.safetensors", "--eval-features", "bä.zarr"],
             ["evaluate", "--run", "rä", "--no-plots"], ["evaluate", "--run", "cönt", "--no-plots"]]
    for step in steps:
        for folder, environment in ((ours, {}), (theirs, env)):
            done = _cli(step, environment, cwd=folder)
            assert done.returncode == 0, (step, done.stdout + done.stderr)
    files = ["rä/metrics.json", "rä/sweep.json", "rä/eval/summary.md", "rä/eval/scores.json", "cönt/metrics.json",
             "cönt/eval/summary.md", "cönt/eval/scores.json", "cönt/eval/class_accuracy.csv"]
    assert [name for name in files if (ours / name).read_bytes() != (theirs / name).read_bytes()] == []
    continued = json.loads((theirs / "cönt" / "metrics.json").read_bytes())
    assert continued["continuation"]["init_model"] == "rä/model.safetensors"
    assert [e["features"] for e in continued["continuation"]["eval_features"]] == ["bä.zarr"]
    assert json.loads((theirs / "rä" / "sweep.json").read_bytes())["features"] == "bä.zarr"


def test_the_python_api_names_optimize_mode_not_a_corrupt_store(tmp_path):
    """Opening a good store from Python under `python -O` raises FoalPipeError naming -O / PYTHONOPTIMIZE (zarr 3.1
    cannot read its metadata there), not "corrupt array metadata ... re-extract it"."""
    store = three_class_store(tmp_path / "s.zarr")
    code = ("from foal_pipe.errors import FoalPipeError\nfrom foal_pipe.store import open_store\n"
            f"try:\n    open_store({str(store)!r})\nexcept FoalPipeError as exc:\n    print(exc)\nelse:\n    print('opened')")
    done = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = done.stdout.strip()
    assert said == "opened" or ("PYTHONOPTIMIZE" in said and "corrupt" not in said), said


def test_the_checkpoint_hash_records_are_skipped_without_a_home_directory(tmp_path, monkeypatch):
    """With no home directory and neither FOAL_PIPE_CACHE_DIR nor XDG_CACHE_HOME, the hash records have no folder:
    a checkpoint is hashed each time (the hash still returned), nothing recorded, nothing raised."""
    import pwd

    from foal_pipe.encoders import hashes

    for name in ("HOME", hashes.CACHE_VARIABLE, "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"weights")
    os.utime(weights, ns=(0, 0))  # long settled: it would be recorded where a cache folder exists
    calls = []
    assert hashes.cache_dir() is None
    for _ in range(2):
        assert hashes.recorded(weights) is None
        assert hashes.hashed(weights, lambda path: calls.append(path) or "ab" * 32) == "ab" * 32
    assert len(calls) == 2
    hashes.forget(weights)
