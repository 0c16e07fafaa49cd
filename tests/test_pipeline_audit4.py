"""The pipeline audit's fourth round: every stage but settings@NAME builds its command from its own settings file alone
(never params.yaml, which DVC may have changed since), evaluate@NAME names its sweep, sweep gammas pass exactly,
`foal-pipe evaluate --run .` finds the sweep beside the run, run names that break paths are refused, and params.yaml's
syntax errors, duplicate keys, list entries and quoted gammas are refused in one line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import STAGES
from test_pipeline import ROOT, VENV_BIN, _command, _commit, _dvc, _env, _fresh_clone, _params, _ran, _run

from foal_pipe.store import write_store


def _stage(name: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STAGES / f"{name}.py"), *args], cwd=cwd, env=_env(ROOT),
                          capture_output=True, text=True, timeout=300)


def _ok(name: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    proc = _stage(name, cwd, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _refused(proc: subprocess.CompletedProcess) -> str:
    """The one line a refusal prints (exit status 1, no traceback)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("Error: "), proc.stdout + proc.stderr
    return lines[0]


def _write_params(root: Path, params: dict) -> None:
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture()
def work(tmp_path) -> Path:
    """params.yaml (small, gamma 0.5, sweep gammas 0.1 and 1) and a synthetic digits store of 10 classes."""
    params = _params(projection_dim=32, tasks=5, gamma=0.5)
    params["sweep"]["gammas"] = [0.1, 1.0]
    _write_params(tmp_path, params)
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(10, 8))
    y_train, y_test = np.repeat(np.arange(10), 12), np.repeat(np.arange(10), 4)
    write_store(tmp_path / "data/features/digits.zarr", (centers[y_train] + 0.3 * rng.normal(size=(120, 8)), y_train),
                (centers[y_test] + 0.3 * rng.normal(size=(40, 8)), y_test), [str(c) for c in range(10)], dataset="digits")
    return tmp_path


# --------------------------------------------------------------------------------------------------
# 1. A stage runs the settings DVC recorded for it, never params.yaml


def test_learn_and_sweep_run_their_settings_file_not_params_yaml(work):
    """params.yaml edited after settings@digits wrote the files (what `dvc repro -s -f learn@digits` ran, and DVC then
    recorded against the old settings): learn and sweep run the recorded gamma and gammas (the old code: 2.0 and 5)."""
    _ok("settings", work, "digits")
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["learn"]["gamma"] = 2.0
    params["sweep"]["gammas"] = [5]
    _write_params(work, params)
    learn = _ok("learn", work, "digits")
    assert "--gamma 0.5 --engine gram" in learn.stdout, learn.stdout
    assert json.loads((work / "runs/digits/metrics.json").read_text())["gamma"] == 0.5
    sweep = _ok("sweep", work, "digits")
    assert "--gammas 0.1,1 --select loo" in sweep.stdout, sweep.stdout
    assert json.loads((work / "runs/digits-sweep/sweep.json").read_text())["gammas"] == [0.1, 1.0]


@pytest.mark.parametrize("stage", ["extract", "learn", "sweep", "table"])
def test_a_missing_settings_file_is_refused_in_one_line(work, stage):
    """Without runs/digits-settings/STAGE.settings.json the stage ran params.yaml's settings; now it says what to run."""
    line = _refused(_stage(stage, work, "digits"))
    assert line == (f"Error: runs/digits-settings/{stage}.settings.json is missing: {stage}@digits reads its settings from "
                    "it, not from params.yaml; run `dvc repro settings@digits` (or `python stages/settings.py digits`) "
                    "to write it"), line
    assert not (work / "runs/digits").exists() and not (work / "runs/digits-sweep").exists()


@pytest.mark.parametrize(
    ("stage", "edit", "problem"),
    [
        ("learn", lambda d: d["learn"].update(gamma="x"), "its learn.gamma is 'x'"),
        ("learn", lambda d: d["learn"].pop("seed"), "its `learn` is {"),
        ("learn", lambda d: d.update(sweep={}), "it holds ['learn', 'sweep'], not ['learn']"),
        ("sweep", lambda d: d["learn"].update(gamma=1.0), "its `learn` is {"),  # sweep's holds no gamma
        ("sweep", lambda d: d["sweep"].update(gammas=[0.1, -1]), "its sweep.gammas is [0.1, -1]"),
        ("extract", lambda d: d.update(dataset=3), "its `dataset` is 3"),
        ("table", lambda d: d["table"].update(heads="ridge"), "its table.heads is 'ridge'"),
    ],
)
def test_a_settings_file_unlike_what_settings_writes_is_refused(work, stage, edit, problem):
    _ok("settings", work, "digits")
    path = work / f"runs/digits-settings/{stage}.settings.json"
    values = json.loads(path.read_text())
    edit(values)
    path.write_text(json.dumps(values))
    line = _refused(_stage(stage, work, "digits"))
    assert line.startswith(f"Error: runs/digits-settings/{stage}.settings.json is not what settings@digits writes: "
                           f"{problem}"), line
    assert line.endswith("run `dvc repro settings@digits` (or `python stages/settings.py digits`) to write it again"), line
    path.write_text("{not json")
    assert "is not what settings@digits writes (Expecting property name" in _refused(_stage(stage, work, "digits"))


def test_extract_takes_its_fingerprint_of_inputs(tmp_path, monkeypatch):
    """extract.settings.json may hold `inputs` beside the settings (the fingerprint settings@NAME adds)."""
    if str(STAGES) not in sys.path:
        sys.path.insert(0, str(STAGES))
    import _params

    monkeypatch.chdir(tmp_path)
    settings = _params.stage_settings(_params.resolve(_params_defaults(), "digits"))["extract"]
    (tmp_path / "runs/digits-settings").mkdir(parents=True)
    (tmp_path / "runs/digits-settings/extract.settings.json").write_text(json.dumps({**settings, "inputs": {}}))
    assert _params.read_settings("digits", "extract") == {**settings, "inputs": {}}


def _params_defaults() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


@pytest.mark.slow
def test_a_forced_learn_with_other_params_is_not_recorded_as_the_current_one(tmp_path):
    """The audit's reproduction: gamma 0.5 in params.yaml, `dvc repro -s -f learn@digits`, params.yaml restored, `dvc
    repro`: DVC skipped learn@digits as unchanged while metrics.json held gamma 0.5 (params.yaml and its settings file:
    1.0). Now the forced learn runs the recorded 1.0, so what DVC records is what ran."""
    repo = _fresh_clone(tmp_path / "clone")
    env = _env(repo)
    _run([_dvc(), "config", "core.analytics", "false"], repo, env)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["learn"].update(projection_dim=32)
    params["sweep"]["gammas"] = [1.0]
    params["table"].update(heads=["ncm"], order_seeds=[0])
    _write_params(repo, params)
    _commit(repo, "small")
    _run([_dvc(), "repro"], repo, env)
    params["learn"]["gamma"] = 0.5
    _write_params(repo, params)
    forced = _run([_dvc(), "repro", "-s", "-f", "learn@digits"], repo, env)
    assert "--gamma 1.0 --engine gram" in forced.stdout, forced.stdout
    _run(["git", "checkout", "params.yaml"], repo, env)
    again = _run([_dvc(), "repro"], repo, env)
    assert _ran(again) == {"settings@digits"}, again.stdout
    assert json.loads(_run([_dvc(), "status", "--json"], repo, env).stdout) == {"settings@digits": ["always changed"]}
    recorded = json.loads((repo / "runs/digits-settings/learn.settings.json").read_text())["learn"]["gamma"]
    assert json.loads((repo / "runs/digits/metrics.json").read_text())["gamma"] == recorded == 1.0


# --------------------------------------------------------------------------------------------------
# 2. evaluate@NAME evaluates with the sweep it depends on


def test_evaluate_names_the_declared_sweep(work):
    """A sweep.json in runs/digits/ (here: an older sweep of the same settings, gammas 0.1 and 1) was taken before
    the declared runs/digits-sweep/sweep.json (gammas 1 and 10)."""
    assert _command("evaluate")[-2:] == ["--sweep", "runs/digits-sweep/sweep.json"]
    for stage in ("settings", "learn", "sweep"):
        _ok(stage, work, "digits")
    shutil.move(work / "runs/digits-sweep/sweep.json", work / "runs/digits/sweep.json")
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["sweep"]["gammas"] = [1.0, 10.0]
    _write_params(work, params)
    for stage in ("settings", "sweep"):
        _ok(stage, work, "digits")
    evaluate = _ok("evaluate", work, "digits")
    assert ("$ foal-pipe evaluate --run runs/digits --out runs/digits/eval --sweep runs/digits-sweep/sweep.json"
            in evaluate.stdout), evaluate.stdout
    assert "From `runs/digits-sweep/sweep.json`" in (work / "runs/digits/eval/summary.md").read_text()
    gammas = [float(row.split(",")[0]) for row in (work / "runs/digits/eval/gamma.csv").read_text().splitlines()[1:]]
    assert gammas == [1.0, 10.0]


# --------------------------------------------------------------------------------------------------
# 4. Sweep gammas pass exactly


def test_sweep_gammas_pass_exactly(work):
    """`f"{g:g}"` rounded 0.12345678 to 0.123457 (recorded so in sweep.json) and made 0.1234567 and 0.1234568 one
    value listed twice (refused by settings@NAME); the short form stays where it is exact."""
    params = _params()
    params["sweep"]["gammas"] = [0.12345678, 1, 1e8, 0.1]
    assert _command("sweep", params=params)[6] == "0.12345678,1,1e+08,0.1"
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["sweep"]["gammas"] = [0.1234567, 0.1234568]
    _write_params(work, params)
    _ok("settings", work, "digits")
    sweep = _ok("sweep", work, "digits")
    assert "--gammas 0.1234567,0.1234568 " in sweep.stdout
    assert json.loads((work / "runs/digits-sweep/sweep.json").read_text())["gammas"] == [0.1234567, 0.1234568]


# --------------------------------------------------------------------------------------------------
# 5. `foal-pipe evaluate --run .` and `--run ..` find the sweep beside the run


def test_a_run_given_as_dot_or_dotdot_finds_its_sweep_beside_it(work, monkeypatch):
    from foal_pipe.report.discovery import load_run, sweep_candidates

    for stage in ("settings", "learn", "sweep"):
        _ok(stage, work, "digits")
    run = work / "runs/digits"
    monkeypatch.chdir(run)
    assert sweep_candidates(Path(".")) == (Path("sweep.json"), Path("../digits-sweep/sweep.json"))
    found = load_run(".")
    assert found.sweep_path == Path("../digits-sweep/sweep.json") and found.sweep.gammas == [0.1, 1.0]
    (run / "sub").mkdir()
    monkeypatch.chdir(run / "sub")
    assert load_run("..").sweep_path == Path("../../digits-sweep/sweep.json")
    monkeypatch.chdir(run)
    proc = subprocess.run([str(VENV_BIN / "foal-pipe"), "evaluate", "--run", ".", "--out", str(work / "ev")], cwd=run,
                          env=_env(ROOT), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "From `../digits-sweep/sweep.json`" in (work / "ev/summary.md").read_text()


# --------------------------------------------------------------------------------------------------
# 6. A run name is one plain folder name


@pytest.mark.parametrize("name", ["../esc", "..", ".", "a/b", "a\\b", "-x"])
def test_a_run_name_that_breaks_paths_is_refused_before_anything_is_written(tmp_path, name):
    """`"../esc": {dataset: digits}` made settings write esc-settings/ in the repository root; `..` passed settings."""
    params = _params()
    params["datasets"] = {"digits": {}, name: {"dataset": "digits"}}
    _write_params(tmp_path, params)
    line = _refused(_stage("settings", tmp_path, name))
    assert line == (f"Error: the run name {name!r} under `datasets` in params.yaml is not a plain folder name (it names "
                    "data/features/NAME.zarr and runs/NAME/); rename it: no '/' or '\\', not '.' or '..', not empty, "
                    "no leading '-'"), line
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["params.yaml"]
    assert _refused(_stage("learn", tmp_path, name)) == line  # a stage run by hand refuses it before reading anything


def test_an_empty_run_name_is_refused(tmp_path):
    if str(STAGES) not in sys.path:
        sys.path.insert(0, str(STAGES))
    import _params

    params = _params_defaults()
    params["datasets"] = {"": {"dataset": "digits"}}
    with pytest.raises(_params.ParamsError, match=re.escape("the run name '' under `datasets`")):
        _params.resolve(params, "")


# --------------------------------------------------------------------------------------------------
# 7. params.yaml's syntax, duplicate keys, entries and quoted numbers


def _settings_with(tmp_path: Path, text: str | None) -> str:
    if text is not None:
        (tmp_path / "params.yaml").write_text(text)
    return _refused(_stage("settings", tmp_path, "digits"))


def test_a_yaml_syntax_error_or_no_params_yaml_is_one_line(tmp_path):
    """Both were a traceback."""
    assert _settings_with(tmp_path, None) == (f"Error: no params.yaml in {tmp_path}; run the stage from the repository "
                                              "root, where dvc.yaml is")
    text = (ROOT / "params.yaml").read_text().replace("  gamma: 1.0 ", "  gamma: 1.0: 2 ", 1)
    number = next(i for i, row in enumerate(text.splitlines(), 1) if row.startswith("  gamma: 1.0: 2 "))
    assert _settings_with(tmp_path, text) == (f"Error: params.yaml is not valid YAML: mapping values are not allowed here "
                                              f"at line {number}, column 13; fix its syntax")


def test_a_key_set_twice_is_refused_naming_it(tmp_path):
    """PyYAML kept the last gamma (0.5) where DVC refuses the file."""
    text = (ROOT / "params.yaml").read_text().replace("  gamma: 1.0 ", "  gamma: 0.5\n  gamma: 1.0 ", 1)
    number = next(i for i, row in enumerate(text.splitlines(), 1) if row == "  gamma: 0.5")
    assert _settings_with(tmp_path, text) == (f"Error: params.yaml sets the key `gamma` twice in one mapping (lines "
                                              f"{number} and {number + 1}); keep one (DVC refuses it too)")
    assert not (tmp_path / "runs").exists()


def test_yaml_anchors_merged_and_overridden_are_no_duplicates(tmp_path):
    """`<<: *anchor` then one of its keys is YAML's override, not a key set twice."""
    if str(STAGES) not in sys.path:
        sys.path.insert(0, str(STAGES))
    import settings

    (tmp_path / "params.yaml").write_text("a: &base {x: 1, y: 2}\nb:\n  <<: *base\n  x: 3\n")
    cwd = Path.cwd()
    try:
        import os

        os.chdir(tmp_path)
        assert settings.load_params() == {"a": {"x": 1, "y": 2}, "b": {"x": 3, "y": 2}}
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize(("entry", "expected"), [("[]", "datasets.digits in params.yaml must be a mapping of overrides "
                                                           "(or {}), got []"),
                                                  ("{learn: []}", "datasets.digits.learn in params.yaml must map keys of "
                                                                  "`learn` to values, got []")])
def test_an_entry_that_is_a_list_is_refused(tmp_path, entry, expected):
    """`digits: []` (and `learn: []` in an entry) ran as {}."""
    text = (ROOT / "params.yaml").read_text().replace("  digits: {}\n", f"  digits: {entry}\n", 1)
    assert _settings_with(tmp_path, text) == f"Error: {expected}"


@pytest.mark.parametrize(("old", "new", "key", "value"), [
    ("  gamma: 1.0 ", '  gamma: "1.0" ', "learn.gamma", "'1.0'"),
    ("  gamma: 1.0 ", "  gamma: '1e-3' ", "learn.gamma", "'1e-3'"),
    ("  gammas: null ", '  gammas: ["0.1", 1] ', "sweep.gammas", "['0.1', 1]"),
])
def test_a_quoted_gamma_is_refused(tmp_path, old, new, key, value):
    """A quoted number is a string; it ran as the number it spells."""
    text = (ROOT / "params.yaml").read_text().replace(old, new, 1)
    assert f"Error: {key} in params.yaml must be " in _settings_with(tmp_path, text)
    assert _settings_with(tmp_path, text).endswith(f", got {value}")


def test_unquoted_gammas_in_exponent_form_still_pass(tmp_path):
    """PyYAML reads an unquoted `1e-3` as a string: the number it spells, as before; and a quoted `auto` is auto."""
    text = (ROOT / "params.yaml").read_text().replace("  gamma: 1.0 ", "  gamma: 1e-3 ", 1).replace(
        "  gammas: null ", "  gammas: [1e-3, 1] ", 1)
    (tmp_path / "params.yaml").write_text(text)
    _ok("settings", tmp_path, "digits")
    recorded = json.loads((tmp_path / "runs/digits-settings/learn.settings.json").read_text())["learn"]["gamma"]
    assert recorded == 0.001  # as a float: 1e-3 and 0.001 give the same bytes
    (tmp_path / "params.yaml").write_text(text.replace("  gamma: 1e-3 ", '  gamma: "auto" ', 1))
    _ok("settings", tmp_path, "digits")
    assert json.loads((tmp_path / "runs/digits-settings/learn.settings.json").read_text())["learn"]["gamma"] == "auto"
