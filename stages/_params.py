"""Shared by the stage scripts: read params.yaml, run one foal-pipe command.

The stage scripts hold no logic of their own: each turns params.yaml into the command line that a user
would type, prints it, and runs it in this process (the same code path as the ``foal-pipe`` CLI).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

#: Relative to the working directory, as DVC runs stages from the directory of dvc.yaml.
PARAMS = Path("params.yaml")


def stage_params() -> tuple[str, dict[str, Any]]:
    """``(dataset, params)``: the script's only argument (dvc.yaml's ``${item}``) and all of params.yaml."""
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} DATASET  (one of the `datasets` in {PARAMS.name})")
    return sys.argv[1], yaml.safe_load(PARAMS.read_text())


def stream_args(p: dict[str, Any]) -> list[str]:
    """The options `learn` and `sweep` share: how the stream is built and the state is kept."""
    args = [
        "--tasks", p["tasks"], "--batch-size", p["batch_size"], "--projection-dim", p["projection_dim"],
        "--seed", p["seed"], "--dtype", p["dtype"], "--backend", p["backend"],
        "--projection-init", p["projection_init"],
    ]
    if p["drop_last"]:
        args.append("--drop-last")
    if not p["mask_unseen"]:
        args.append("--no-mask-unseen")
    return args


def run(args: list[Any]) -> None:
    """Print ``foal-pipe ARGS`` and run it here; exits with the command's status."""
    args = [str(a) for a in args]
    print("$ foal-pipe " + shlex.join(args), flush=True)
    from foal_pipe.cli import app

    app(args, prog_name="foal-pipe")
