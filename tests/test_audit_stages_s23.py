"""The DVC pipeline as a user edits it (audit s23, dvcp): params.yaml run names YAML reads as numbers or booleans, run
names the shell splits or runs, task counts past a registered dataset's classes, a settings stage that fails after
DVC removed (or while it wrote) its files, YAML 1.1 values DVC reads otherwise, and a data_dir that digits ignores.
Each test builds params.yaml in a temporary folder and runs stages/settings.py there (or `dvc repro`, marked slow)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import STAGES, params_with

ROOT = STAGES.parent
VENV_BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT),
            "HF_HUB_OFFLINE": "1", "DVC_NO_ANALYTICS": "1", "FOAL_PIPE_DEBUG": "", "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}


def _settings(cwd: Path, name: str, text: str | None = None) -> subprocess.CompletedProcess:
    """`python stages/settings.py NAME` in ``cwd`` (params.yaml written from ``text`` first, where given)."""
    if text is not None:
        (cwd / "params.yaml").write_text(text)
    return subprocess.run([sys.executable, str(STAGES / "settings.py"), name], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=120)


def _refused(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """One line `Error: ...` on stderr, exit status 1, no traceback, each fragment named."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("Error: "), (proc.returncode, proc.stderr)
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _repo_params(old: str, new: str) -> str:
    text = (ROOT / "params.yaml").read_text()
    assert old in text, old
    return text.replace(old, new, 1)


# --------------------------------------------------------------------------------------------------
# 1. A run name that YAML reads as a number, a boolean or null: a traceback, or (with DVC) a run never run


@pytest.mark.parametrize(("entry", "name"), [("1: {dataset: digits}", "1"), ("yes: {dataset: digits}", "yes"),
                                             ("2024: {dataset: digits}", "2024")])
def test_a_run_name_yaml_reads_as_no_string_is_one_line(tmp_path, entry, name):
    """`1:` or `yes:` under `datasets`: `settings.py 1` died in `', '.join(entries)` (TypeError traceback); DVC gives no
    stage at all for an integer key, so `2024:` beside `digits:` was silently never run. Refuse it, asking for quotes."""
    text = _repo_params("  digits: {}", f"  {entry}")
    _refused(_settings(tmp_path, name, text), "datasets", "quot")
    assert not (tmp_path / "runs").exists()
    both = _repo_params("  digits: {}", f"  digits: {{}}\n  {entry}")  # settings@digits reads the whole file
    _refused(_settings(tmp_path, "digits", both), "datasets", "quot")


# --------------------------------------------------------------------------------------------------
# 2. A run name the shell splits or runs: dvc.yaml's `python stages/settings.py ${key}` was a shell command line


@pytest.mark.parametrize("name", ["my run", "x;touch INJECTED;true", "a$HOME", "tab\there", "new\nline", "b`id`"])
def test_a_run_name_that_is_no_single_shell_word_is_refused(tmp_path, name):
    """It names runs/NAME and data/features/NAME.zarr, and DVC pasted it unquoted into each stage's shell command:
    `my run` reached settings.py as two arguments (a bare usage line), `x;touch INJECTED;true` ran `touch`. The
    commands hold no name now; the name is still one plain word, refused before anything is written."""
    params = params_with()
    params["datasets"] = {name: {"dataset": "digits"}}
    _refused(_settings(tmp_path, name, yaml.safe_dump(params)), "run name")
    assert not (tmp_path / "runs").exists()


def _dvc_repo(dest: Path, params_text: str) -> Path:
    """A git repository with dvc.yaml, the stages and the given params.yaml (foal_pipe comes from PYTHONPATH)."""
    dvc = VENV_BIN / "dvc" if (VENV_BIN / "dvc").exists() else shutil.which("dvc")
    if shutil.which("git") is None or dvc is None:
        pytest.skip("needs git and dvc")
    dest.mkdir()
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / ".dvc", dest / ".dvc", ignore=shutil.ignore_patterns("cache", "tmp", "*.lock"))
    shutil.copytree(STAGES, dest / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "params.yaml").write_text(params_text)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "-c", "commit.gpgsign=false", "commit", "-qm", "x"]):
        subprocess.run(cmd, cwd=dest, env=_env(), check=True, capture_output=True)
    return dest


def _dvc(repo: Path, *args: str) -> subprocess.CompletedProcess:
    dvc = VENV_BIN / "dvc" if (VENV_BIN / "dvc").exists() else shutil.which("dvc")
    return subprocess.run([str(dvc), *args], cwd=repo, env=_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["x;touch INJECTED;true", "x';touch INJECTED;'"])
def test_dvc_repro_runs_no_command_hidden_in_a_run_name(tmp_path, name):
    """`dvc repro` with a run named `x;touch INJECTED;true` ran `touch INJECTED` in the repository (and settings.py got
    the run `x`); quoting `'${key}'` in dvc.yaml stopped that one, not a name holding `'` (DVC pastes the key
    unescaped). The commands now hold no name: each script reads it from DVC_STAGE, then refuses it."""
    params = params_with()
    params["datasets"] = {name: {"dataset": "digits"}}
    repo = _dvc_repo(tmp_path / "repo", yaml.safe_dump(params))
    done = _dvc(repo, "repro")
    assert done.returncode != 0
    assert not (repo / "INJECTED").exists(), "a shell command in a run name ran"
    assert "run name" in done.stdout + done.stderr, done.stdout + done.stderr


# --------------------------------------------------------------------------------------------------
# 3. A task count past the classes a registered dataset has: refused by learn or table after DVC removed their outputs


@pytest.mark.parametrize(("old", "new", "key"), [("  tasks: 5 ", "  tasks: 11 ", "learn.tasks"),
                                                 ("  tasks: [5]", "  tasks: [5, 11]", "table.tasks")])
def test_more_tasks_than_a_registered_datasets_classes_is_refused_first(tmp_path, old, new, key):
    """digits has 10 classes (the registry says so, no store needed). `learn.tasks: 11` passed settings@digits, which
    wrote its files (and dvc.lock its params); learn@digits then refused `--tasks 11 is larger than the number of
    classes (10)`, after DVC had deleted runs/digits/model.safetensors and metrics.json."""
    _refused(_settings(tmp_path, "digits", _repo_params(old, new)), key, "10")
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------------------------------
# 4. The settings stage's own files: kept when it refuses under DVC, written together or not at all


@pytest.mark.slow
def test_a_refused_edit_keeps_the_settings_files_dvc_repro_wrote(tmp_path):
    """`dvc repro settings@digits`, then `learn.tasks: 0`: the stage refuses, but DVC had deleted its four settings
    files first (not `persist`), so `python stages/learn.py digits` then finds none and `dvc status` lists them deleted."""
    repo = _dvc_repo(tmp_path / "repo", (ROOT / "params.yaml").read_text())
    first = _dvc(repo, "repro", "settings@digits")
    assert first.returncode == 0, first.stdout + first.stderr
    folder = repo / "runs" / "digits-settings"
    before = {p.name: p.read_bytes() for p in sorted(folder.glob("*.settings.json"))}
    assert len(before) == 4
    (repo / "params.yaml").write_text(_repo_params("  tasks: 5 ", "  tasks: 0 "))
    again = _dvc(repo, "repro", "settings@digits")
    assert again.returncode != 0 and "learn.tasks in params.yaml must be a positive integer" in again.stderr + again.stdout
    after = {p.name: p.read_bytes() for p in sorted(folder.glob("*.settings.json"))}
    assert after == before, f"the refused run left {sorted(after)} of {sorted(before)}"


def test_a_settings_file_that_cannot_be_written_is_one_line_and_nothing_half_written(tmp_path):
    """runs/digits-settings/learn.settings.json a folder (or runs/digits-settings a file): an IsADirectoryError or
    FileExistsError traceback, and extract.settings.json already written beside the missing three."""
    folder = tmp_path / "runs" / "digits-settings"
    (folder / "learn.settings.json").mkdir(parents=True)
    _refused(_settings(tmp_path, "digits", (ROOT / "params.yaml").read_text()), "learn.settings.json")
    assert sorted(p.name for p in folder.iterdir()) == ["learn.settings.json"]  # the others not written alone
    shutil.rmtree(tmp_path / "runs")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "digits-settings").write_text("")
    _refused(_settings(tmp_path, "digits"), "runs/digits-settings")


# --------------------------------------------------------------------------------------------------
# 5. Messages and values: a key missing from its shared section, YAML 1.1 numbers DVC reads as YAML 1.2


def test_a_key_set_only_in_an_entry_is_named_missing_not_unknown(tmp_path):
    """With `gamma` dropped from the shared `learn` and set in `datasets.digits.learn`, the error called gamma an
    unknown key and listed the keys of `learn` without it: the fix it implies (a spelling) is not the fix (set it in
    `learn`, which every entry shares)."""
    text = _repo_params("  gamma: 1.0 ", "  # gamma: 1.0 ").replace("  digits: {}", "  digits: {learn: {gamma: 0.1}}", 1)
    line = _refused(_settings(tmp_path, "digits", text), "gamma")
    assert "unknown" not in line, line


@pytest.mark.parametrize(("old", "new", "key"), [("  seed: 0              #", "  seed: 010            #", "seed"),
                                                 ("  batch_size: 10\n", "  batch_size: 010\n", "batch_size")])
def test_a_number_dvc_reads_otherwise_is_refused_or_read_as_dvc_reads_it(tmp_path, old, new, key):
    """`seed: 010` is 8 to PyYAML (YAML 1.1 octal) and 10 to DVC (YAML 1.2: dvc.lock, `dvc params diff`, `dvc exp show`
    all say 10) while learn ran seed 8. Either refuse the leading zero or read it as DVC records it."""
    from dvc.utils.serialize import parse_yaml

    text = _repo_params(old, new)
    dvc_reads = parse_yaml(text, "params.yaml")["learn"][key]
    done = _settings(tmp_path, "digits", text)
    if done.returncode != 0:
        _refused(done, f"learn.{key}")
        return
    written = json.loads((tmp_path / "runs" / "digits-settings" / "learn.settings.json").read_text())["learn"][key]
    assert written == dvc_reads, f"learn ran {key} {written}, DVC records {dvc_reads}"


# --------------------------------------------------------------------------------------------------
# 6. A setting silently ignored: data_dir for digits, which ships with scikit-learn


def test_a_data_dir_for_digits_is_refused_not_ignored(tmp_path):
    """`extract.data_dir: my-digits` for dataset digits passed, and extract read scikit-learn's bundled digits whatever
    the folder held (even a missing one): the user believes their data was read. Refuse it as test_split is refused."""
    (tmp_path / "my-digits").mkdir()
    text = _repo_params("  data_dir: null ", "  data_dir: my-digits ")
    line = _refused(_settings(tmp_path, "digits", text), "extract.data_dir")
    assert re.search(r"digits|scikit-learn", line), line
    assert not (tmp_path / "runs").exists()


def test_a_data_dir_for_digits_is_refused_by_extract_too(tmp_path):
    """`foal-pipe extract --dataset digits --data-dir X` read scikit-learn's digits, whatever X held, and said nothing."""
    from helpers import assert_one_line_error, invoke

    from foal_pipe.datasets import open_dataset
    from foal_pipe.errors import FoalPipeError

    (tmp_path / "my-digits").mkdir()
    out = tmp_path / "s.zarr"
    result = invoke("extract", "--dataset", "digits", "--model", "pixels", "--data-dir", tmp_path / "my-digits", "--out", out)
    assert_one_line_error(result, "--dataset digits", "scikit-learn", "--data-dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-digits"]
    with pytest.raises(FoalPipeError, match="data_dir does not apply"):
        open_dataset("digits", data_dir=tmp_path / "my-digits")
    assert len(open_dataset("digits").train) == 1442  # no data_dir: scikit-learn's, as before


def test_download_for_a_dataset_torchvision_does_not_fetch_is_refused_not_ignored(tmp_path):
    """`extract.download: true` for digits passed, and extract (which ignored --download for it) read scikit-learn's
    bundled digits: the settings stage refuses it as extract now does."""
    text = _repo_params("  download: false ", "  download: true ")
    line = _refused(_settings(tmp_path, "digits", text), "extract.download")
    assert "torchvision" in line and "set extract.download: false" in line, line
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------------------------------
# 7. A precision pixels ignored: it computes in float32 whatever --precision says


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_reduced_precision_for_pixels_is_refused_not_ignored(tmp_path, precision):
    """`extract --model pixels --precision bf16` wrote a store computed in fp32 (its record says fp32) without a word."""
    from helpers import assert_one_line_error, invoke

    from foal_pipe.errors import FoalPipeError
    from foal_pipe.extract import ExtractSpec

    out = tmp_path / "s.zarr"
    result = invoke("extract", "--dataset", "digits", "--model", "pixels", "--precision", precision, "--out", out)
    assert_one_line_error(result, "--model pixels", f"--precision {precision}", "does not apply")
    assert not any(tmp_path.iterdir())
    with pytest.raises(FoalPipeError, match=f"precision='{precision}' does not apply"):
        ExtractSpec(model="pixels", precision=precision)
    text = _repo_params("  precision: auto ", f"  precision: {precision} ")
    _refused(_settings(tmp_path, "digits", text), f"extract.precision: {precision}", "pixels")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("precision", ["auto", "fp32"])
def test_pixels_at_auto_or_fp32_still_extracts_in_fp32(tmp_path, precision):
    from helpers import invoke

    out = tmp_path / "s.zarr"
    result = invoke("extract", "--dataset", "digits", "--model", "pixels", "--precision", precision, "--out", out)
    assert result.exit_code == 0, result.output
    assert '"precision": "fp32"' in " ".join((out / "zarr.json").read_text().split())


# --------------------------------------------------------------------------------------------------
# 8. More of what the fixes above must keep or refuse


@pytest.mark.parametrize(("old", "new", "key"), [
    ("  normalize: true ", "  normalize: yes ", "extract.normalize"),  # True to YAML 1.1, the string 'yes' to DVC
    ("  split_seed: 0 ", "  split_seed: 0o10 ", "extract.split_seed"),  # the string '0o10' to YAML 1.1, 8 to DVC
    ("  digits: {}", "  digits: {learn: {seed: 010}}", "datasets.digits.learn.seed"),
])
def test_a_value_dvc_reads_otherwise_is_refused_naming_it(tmp_path, old, new, key):
    line = _refused(_settings(tmp_path, "digits", _repo_params(old, new)), key, "YAML 1.2")
    assert not (tmp_path / "runs").exists(), line


def test_a_run_name_yaml_reads_as_a_boolean_in_yaml_1_1_only_is_refused(tmp_path):
    """`on:` is True to PyYAML and the run `on` to DVC: DVC would run settings@on, which found no run 'on'."""
    _refused(_settings(tmp_path, "on", _repo_params("  digits: {}", "  digits: {}\n  on: {dataset: digits}")),
             "datasets", "quot")
    quoted = _repo_params("  digits: {}", '  digits: {}\n  "on": {dataset: digits}')
    assert _settings(tmp_path, "on", quoted).returncode == 0
    assert sorted(p.name for p in (tmp_path / "runs" / "on-settings").iterdir()) == [
        "extract.settings.json", "learn.settings.json", "sweep.settings.json", "table.settings.json"]  # no temporaries


@pytest.mark.parametrize("name", ["digits-relu", "run_2", "v1.5"])
def test_run_names_of_letters_digits_dots_dashes_and_underscores_pass(tmp_path, name):
    params = params_with()
    params["datasets"] = {name: {"dataset": "digits"}}
    done = _settings(tmp_path, name, yaml.safe_dump(params))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs" / f"{name}-settings" / "learn.settings.json").is_file()


def test_a_refused_write_keeps_the_files_an_earlier_run_wrote(tmp_path):
    """All four written or none: a place that cannot take one leaves the earlier files as they were."""
    text = (ROOT / "params.yaml").read_text()
    assert _settings(tmp_path, "digits", text).returncode == 0
    folder = tmp_path / "runs" / "digits-settings"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    (folder / "table.settings.json").unlink()
    (folder / "table.settings.json").mkdir()
    _refused(_settings(tmp_path, "digits", _repo_params("  gamma: 1.0 ", "  gamma: 0.5 ")), "table.settings.json")
    after = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert after == {k: v for k, v in before.items() if k != "table.settings.json"}
