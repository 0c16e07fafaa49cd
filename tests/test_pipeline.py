"""The DVC pipeline: the stage scripts, and `dvc repro` end to end in a temporary copy of the repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from foal_pipe.store import write_store

ROOT = Path(__file__).resolve().parent.parent
STAGES = ROOT / "stages"
VENV_BIN = Path(sys.executable).parent


def _env(root: Path) -> dict[str, str]:
    """Run stages with this interpreter (first on PATH, as `python` in dvc.yaml) and ``root``'s code."""
    env = dict(os.environ)
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(root),
        HF_HUB_OFFLINE="1",
        DVC_NO_ANALYTICS="1",
        FOAL_PIPE_DEBUG="",
        COLUMNS="200",
        GIT_AUTHOR_NAME="foal-pipe test", GIT_AUTHOR_EMAIL="test@example.invalid",
        GIT_COMMITTER_NAME="foal-pipe test", GIT_COMMITTER_EMAIL="test@example.invalid",
    )
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def _params(**learn) -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["learn"].update(learn)
    return params


def _summary_cell(text: str, label: str) -> float:
    match = re.search(rf"^\| {re.escape(label)} \| ([-0-9.]+) \|", text, re.MULTILINE)
    assert match, f"no {label} row in summary.md:\n{text}"
    return float(match.group(1))


# --------------------------------------------------------------------------------------------------
# The repository's pipeline files


def test_params_and_dvc_yaml_agree():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert params["datasets"] == ["digits"] and params["extract"]["model"] == "pixels"
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    assert list(dvc["stages"]) == ["extract", "learn", "sweep", "evaluate"]
    for name, stage in dvc["stages"].items():
        assert stage["foreach"] == "${datasets}"
        assert stage["do"]["cmd"] == f"python stages/{name}.py ${{item}}"
        assert f"stages/{name}.py" in stage["do"]["deps"]
        for dep in stage["do"]["deps"]:
            if "${" not in dep:
                assert (ROOT / dep).exists(), f"{name}: dependency {dep} does not exist"
    assert dvc["stages"]["extract"]["do"]["outs"] == [{"data/features/${item}.zarr": {"persist": True}}]
    # the sweep must not depend on learn.gamma or learn.engine, or a gamma change would rerun it
    sweep_params = dvc["stages"]["sweep"]["do"]["params"]
    assert "learn" not in sweep_params and "learn.gamma" not in sweep_params and "learn.engine" not in sweep_params
    assert {f"learn.{k}" for k in params["learn"]} - set(sweep_params) == {"learn.gamma", "learn.engine"}
    assert (ROOT / ".dvc" / "config").read_text().count("analytics = false") == 1


# --------------------------------------------------------------------------------------------------
# Stage scripts, without DVC


@pytest.fixture()
def workdir(tmp_path):
    """A directory with params.yaml (small, non-default stream settings) and a synthetic digits store."""
    params = _params(projection_dim=64, tasks=5, drop_last=True, mask_unseen=False, gamma=0.5)
    params["sweep"]["gammas"] = [0.1, 1.0]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(10, 16))
    y_train, y_test = np.repeat(np.arange(10), 23), np.repeat(np.arange(10), 7)
    x_train = centers[y_train] + 0.3 * rng.normal(size=(y_train.size, 16))
    x_test = centers[y_test] + 0.3 * rng.normal(size=(y_test.size, 16))
    write_store(tmp_path / "data" / "features" / "digits.zarr", (x_train, y_train), (x_test, y_test),
                [str(c) for c in range(10)], dataset="digits")
    return tmp_path


def _stage(name: str, cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run([sys.executable, str(STAGES / f"{name}.py"), *args], cwd, _env(ROOT), check=check)


def test_learn_sweep_evaluate_stage_scripts(workdir):
    learn = _stage("learn", workdir, "digits")
    assert ("$ foal-pipe learn --features data/features/digits.zarr --out runs/digits --tasks 5 --batch-size 10 "
            "--projection-dim 64 --seed 0") in learn.stdout
    assert "--drop-last --no-mask-unseen --gamma 0.5 --engine gram" in learn.stdout
    metrics = json.loads((workdir / "runs/digits/metrics.json").read_text())
    assert (metrics["gamma"], metrics["projection_dim"], metrics["n_tasks"]) == (0.5, 64, 5)
    assert (metrics["drop_last"], metrics["mask_unseen"]) == (True, False)
    assert (workdir / "runs/digits/model.safetensors").is_file()

    sweep = _stage("sweep", workdir, "digits")
    assert "--gammas 0.1,1 --tasks 5" in sweep.stdout and "--gamma " not in sweep.stdout
    report = json.loads((workdir / "runs/digits-sweep/sweep.json").read_text())
    assert report["gammas"] == [0.1, 1.0] and report["projection_dim"] == 64

    evaluate = _stage("evaluate", workdir, "digits")
    assert ("$ foal-pipe evaluate --run runs/digits --sweep runs/digits-sweep/sweep.json --out runs/digits/eval"
            in evaluate.stdout)
    out = workdir / "runs/digits/eval"
    assert {p.name for p in out.iterdir()} >= {"summary.md", "scores.json", "gamma.png", "weight_norms.png"}
    assert _summary_cell((out / "summary.md").read_text(), "A_avg (%)") == pytest.approx(
        100 * metrics["A_avg"], abs=0.005)


def test_stage_script_failures_exit_nonzero(workdir):
    usage = _stage("learn", workdir, check=False)
    assert usage.returncode != 0 and "usage:" in usage.stderr
    missing = _stage("learn", workdir, "nosuchdataset", check=False)
    assert missing.returncode == 1 and "Error:" in missing.stderr and "nosuchdataset.zarr" in missing.stderr


def test_extract_stage_script_resumes_or_replaces(tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(_params()))
    first = _stage("extract", tmp_path, "digits")
    assert ("$ foal-pipe extract --dataset digits --model pixels --fusion mean-cls --token cls --normalize "
            "--dtype float32 --out data/features/digits.zarr") in first.stdout
    assert "--overwrite" not in first.stdout
    attrs = json.loads((tmp_path / "data/features/digits.zarr/zarr.json").read_text())["attributes"]
    assert attrs["complete"] is True and attrs["dataset"] == "digits" and attrs["encoder"]["name"] == "pixels"
    # DVC reruns extract only when something changed: a complete store is then stale and replaced
    second = _stage("extract", tmp_path, "digits")
    assert second.stdout.splitlines()[0].endswith("--overwrite")


# --------------------------------------------------------------------------------------------------
# dvc repro end to end


def _copy_repo(dest: Path) -> None:
    """What a fresh clone holds: tracked files plus untracked files git does not ignore (work in progress)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode == 0:
        for name in filter(None, listed.stdout.decode().split("\0")):
            src = ROOT / name
            if src.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
    else:  # not a git checkout (an sdist, say): copy the tree without environments and outputs
        shutil.copytree(ROOT, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", "runs", "features", "dvc_plots", "__pycache__", ".pytest_cache", "*.egg-info", "tmp",
            "cache"))


def test_dvc_repro_end_to_end(tmp_path):
    git = shutil.which("git")
    dvc = VENV_BIN / "dvc" if (VENV_BIN / "dvc").exists() else shutil.which("dvc")
    if git is None or dvc is None:
        pytest.skip(f"needs git and dvc on PATH (git: {git}, dvc: {dvc}); `make test` installs dvc")
    repo = tmp_path / "clone"
    repo.mkdir()
    _copy_repo(repo)
    for leftover in ("dvc.lock", "runs", "data/features", "dvc_plots"):  # a fresh clone has no outputs
        path = repo / leftover
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    env = _env(repo)
    dvc = str(dvc)
    _run([git, "init", "-q"], repo, env)
    _run([git, "add", "-A"], repo, env)
    _run([git, "-c", "commit.gpgsign=false", "commit", "-qm", "fresh clone"], repo, env)

    repro = _run([dvc, "repro"], repo, env)
    for stage in ("extract@digits", "learn@digits", "sweep@digits", "evaluate@digits"):
        assert f"Running stage '{stage}'" in repro.stdout, repro.stdout
    metrics = json.loads((repo / "runs/digits/metrics.json").read_text())
    summary = (repo / "runs/digits/eval/summary.md").read_text()
    for label, key in [("A_avg (%)", "A_avg"), ("A_last (%)", "A_last"), ("F (%)", "F")]:
        assert _summary_cell(summary, label) == pytest.approx(100 * metrics[key], abs=0.005)
    for png in ("accuracy_matrix", "steps", "weight_norms", "gamma"):
        assert (repo / f"runs/digits/eval/{png}.png").stat().st_size > 10_000
    assert metrics["A_avg"] > 0.8  # pixels + D=1000 on digits is an easy problem
    assert "Data and pipelines are up to date." in _run([dvc, "status"], repo, env).stdout

    shown = json.loads(_run([dvc, "metrics", "show", "--json"], repo, env).stdout)
    scores = next(iter(shown.values()))["data"]["runs/digits/eval/scores.json"]["data"]
    assert scores["A_avg"] == pytest.approx(metrics["A_avg"])

    # the experiment: only learn and evaluate rerun, extraction and the sweep are cached
    _run([git, "add", "-A"], repo, env)
    _run([git, "-c", "commit.gpgsign=false", "commit", "-qm", "pipeline ran"], repo, env)
    exp = _run([dvc, "exp", "run", "-S", "learn.gamma=0.1"], repo, env)
    ran = set(re.findall(r"Running stage '([^']+)'", exp.stdout))
    assert ran == {"learn@digits", "evaluate@digits"}, exp.stdout
    after = json.loads((repo / "runs/digits/metrics.json").read_text())
    assert after["gamma"] == 0.1
    # learn --gamma 0.1 reproduces the sweep's gamma = 0.1 entry (same stream, same projection)
    sweep = json.loads((repo / "runs/digits-sweep/sweep.json").read_text())
    entry = next(r for r in sweep["results"] if r["gamma"] == pytest.approx(0.1))
    assert after["A_avg"] == pytest.approx(entry["A_avg"], abs=1e-9)
    assert _summary_cell((repo / "runs/digits/eval/summary.md").read_text(), "A_avg (%)") == pytest.approx(
        100 * after["A_avg"], abs=0.005)


# --------------------------------------------------------------------------------------------------
# README: the two-command start, the paper configuration, the CLI reference

README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    return README.split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


def test_readme_quick_start_is_exactly_two_commands():
    block = re.search(r"```\n(.*?)```", _section("Quick start"), re.S).group(1)
    assert block.splitlines() == ["make demo", "make test"]


def test_readme_paper_configuration_is_valid_and_comparable():
    from foal_pipe.paper import PAPER_BACKBONE, match_paper

    block = re.search(r"```yaml\n(.*?)```", _section("Reproducing the paper"), re.S).group(1)
    config = yaml.safe_load(block)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for section, values in config.items():
        if isinstance(values, dict):
            assert set(values) <= set(params[section]), f"README sets unknown {section} keys"
            params[section].update(values)
        else:
            params[section] = values
    assert params["datasets"] == ["cifar100"] and params["extract"]["model"] == PAPER_BACKBONE
    learn, extract = params["learn"], params["extract"]
    run = {"dataset": "cifar100", "n_tasks": learn["tasks"], "projection_dim": learn["projection_dim"],
           "gamma": learn["gamma"], "batch_size": learn["batch_size"],
           "encoder": {"name": extract["model"], "fusion": extract["fusion"], "token": extract["token"],
                       "image_size": extract["image_size"] or 224}}
    assert match_paper(run).comparable, match_paper(run).differences


def test_readme_documents_every_command_and_option():
    import typer.main

    from foal_pipe.cli import app

    group = typer.main.get_command(app)
    missing = []
    for name, command in group.commands.items():
        if f"`{name}`" not in README and f"foal-pipe {name}" not in README:
            missing.append(f"command {name}")
        for param in command.params:
            if param.param_type_name == "option" and param.name != "help":
                flag = max(param.opts, key=len)
                if flag not in README:
                    missing.append(f"{name} {flag}")
    assert not missing, "README.md does not document: " + ", ".join(missing)
