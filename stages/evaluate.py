"""DVC stage `evaluate@NAME`: plots, plot data and summary.md for runs/NAME -> runs/NAME/eval/.

It reads no settings. The sweep is named explicitly, runs/NAME-sweep/sweep.json (sweep@NAME's output, which this
stage depends on), so that a sweep.json left in runs/NAME/ by hand, which `foal-pipe evaluate` would try first, is
never used instead.
"""

from __future__ import annotations

from typing import Any

from _params import main


def command(name: str, settings: dict[str, Any]) -> list[Any]:
    return ["evaluate", "--run", f"runs/{name}", "--out", f"runs/{name}/eval", "--sweep", f"runs/{name}-sweep/sweep.json"]


if __name__ == "__main__":
    main(command, None, "evaluate")
