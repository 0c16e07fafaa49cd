"""docs/walkthrough.md's "your own image folder -> model -> predict -> add classes" runs as written: the test
builds the folders the page names and runs its commands verbatim, in order."""

from __future__ import annotations

import csv
import json
import re
import shlex
from pathlib import Path

from helpers import make_image_tree
from typer.testing import CliRunner

from foal_pipe import load_model
from foal_pipe.cli import app

PAGE = Path(__file__).resolve().parents[1] / "docs" / "walkthrough.md"
SECTION = "## Your own image folder -> model -> predict -> add classes"


def _blocks() -> tuple[str, list[str]]:
    """The section's folder layout and its commands."""
    section = PAGE.read_text().split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]
    layout, commands = re.findall(r"```\n(.*?)```", section, re.S)
    return layout, [line for line in commands.splitlines() if line.strip()]


def _build(layout: str, root: Path) -> None:
    """Class folders (``X/C/*.png``: 8 images each) and unlabelled folders (``X/*.png``: 3 images)."""
    for seed, (folder, cls) in enumerate(re.findall(r"([\w]+)/(?:([\w]+)/)?\*\.png", layout)):
        if cls:
            make_image_tree(root / folder, {cls: 8}, split=False, seed=seed)
        else:
            make_image_tree(root, {folder: 3}, split=False, seed=seed)


def _csv(path: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(path.open()))


def test_walkthrough_runs_as_written(tmp_path, monkeypatch):
    layout, commands = _blocks()
    _build(layout, tmp_path)
    assert sorted(p.name for p in (tmp_path / "my_photos").iterdir()) == ["cat", "dog", "emu"]
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for line in commands:
        program, *args = shlex.split(line, comments=True)
        assert program == "foal-pipe", line
        result = runner.invoke(app, args)
        assert result.exit_code == 0, f"{line}\n{result.output}"
        assert "Traceback" not in result.output
        if args[0] == "info":
            assert "3: cat, dog, emu" in result.output and "--test-split 0.25 --split-seed 0" in result.output

    first = json.loads(Path("runs/photos/metrics.json").read_text())
    assert first["n_train_seen"] == 18 and first["n_test"] == 6  # 8 images per class, 2 of each to test
    rows = _csv(Path("runs/photos/eval/class_accuracy.csv"))
    assert sorted(r["name"] for r in rows) == ["cat", "dog", "emu"] and all(r["test_rows"] == "2" for r in rows)
    assert Path("runs/photos/eval/confusion_matrix.png").stat().st_size > 5_000
    predicted = _csv(Path("runs/photos/new_photos.csv"))
    assert len(predicted) == 3 and {r["predicted_name"] for r in predicted} <= {"cat", "dog", "emu"}
    assert all(r["top2_name"] in {"cat", "dog", "emu"} for r in predicted)

    assert load_model("runs/photos-more/model.safetensors").class_names == ["cat", "dog", "emu", "fox", "gnu"]
    summary = Path("runs/photos-more/eval/summary.md").read_text()
    assert "## Other feature stores" in summary and "| `my_photos.zarr` | 6 |" in summary
    # learned before the continued run: its test rows come from the --eval-features store (2 per class there)
    assert "| cat | - | 2 |" in summary and "Every class seen" in summary
    norms = {r["name"]: r["task"] for r in _csv(Path("runs/photos-more/eval/weight_norms.csv"))}
    assert norms["cat"] == "" and {norms["fox"], norms["gnu"]} == {"1", "2"}
    later = _csv(Path("runs/photos-more/new_photos.csv"))
    assert len(later) == 3 and {r["predicted_name"] for r in later} <= {"cat", "dog", "emu", "fox", "gnu"}
