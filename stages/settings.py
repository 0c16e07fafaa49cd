"""DVC stage `settings@NAME`: each stage's settings for run NAME -> runs/NAME-settings/{extract,learn,sweep,table}.settings.json.

The other stages depend on these files, not on params.yaml: DVC reruns a stage when the bytes of its settings
change, so a change reruns only the stages it concerns. Written in one canonical form (sorted keys), so that
settings equal in value give the same bytes however params.yaml writes them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml
from _params import PARAMS, ParamsError, resolve, stage_settings


def write(name: str, settings: dict[str, Any]) -> None:
    out = Path("runs") / f"{name}-settings"
    out.mkdir(parents=True, exist_ok=True)
    for stage, values in stage_settings(settings).items():
        (out / f"{stage}.settings.json").write_text(json.dumps(values, indent=1, sort_keys=True) + "\n")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} NAME  (a run under `datasets` in {PARAMS.name})")
    try:
        write(sys.argv[1], resolve(yaml.safe_load(PARAMS.read_text()), sys.argv[1]))
    except ParamsError as exc:
        sys.exit(f"Error: {exc}")


if __name__ == "__main__":
    main()
