"""DVC stage `evaluate@NAME`: plots, plot data and summary.md for runs/NAME -> runs/NAME/eval/.

`foal-pipe evaluate` finds the run's sweep in runs/NAME-sweep/ by itself.
"""

from __future__ import annotations

from typing import Any

from _params import main


def command(name: str, settings: dict[str, Any]) -> list[Any]:
    return ["evaluate", "--run", f"runs/{name}", "--out", f"runs/{name}/eval"]


if __name__ == "__main__":
    main(command)
