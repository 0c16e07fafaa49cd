"""DVC stage `extract@NAME`: `foal-pipe extract` -> data/features/NAME.zarr.

The store is a `persist` output, so DVC leaves it in place when the stage reruns (after a change of the
extraction's settings, or of the code). The store's own record of its settings decides what happens then:
`foal-pipe extract` resumes an interrupted store with these settings and leaves a complete one alone (it says
so), and only a store made with other settings is replaced (`--overwrite`). A change that does not concern the
extraction never reaches this stage (dvc.yaml), and a rerun that does not change its settings never rewrites a
store. Replace one by hand with `foal-pipe extract ... --overwrite`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _params import extract_spec, kwargs_text, main


def other_settings(out: str, settings: dict[str, Any]) -> bool:
    """Whether the store at ``out`` holds settings other than those asked for (then it is replaced); False when
    there is none, or it holds these settings (complete: nothing to do; interrupted: resumed)."""
    if not Path(out).exists():
        return False
    from foal_pipe.errors import FoalPipeError
    from foal_pipe.extract import check_store, open_inputs

    try:
        spec = extract_spec(settings, out)
        check_store(spec, open_inputs(spec))
    except FoalPipeError:  # other settings, or a store not to resume; `foal-pipe extract` says which, if not these
        return True
    return False


def command(name: str, settings: dict[str, Any]) -> list[Any]:
    p = settings["extract"]
    out = f"data/features/{name}.zarr"
    args = [
        "extract", "--dataset", settings["dataset"], "--model", p["model"], "--fusion", p["fusion"],
        "--token", p["token"], "--normalize" if p["normalize"] else "--no-normalize", "--dtype", p["dtype"],
        "--chunk-rows", p["chunk_rows"], "--device", p["device"], "--precision", p["precision"], "--out", out,
    ]
    optional = {"--checkpoint": "checkpoint", "--image-size": "image_size", "--data-dir": "data_dir",
                "--batch-size": "batch_size", "--workers": "workers"}
    for option, key in optional.items():
        if p[key] is not None:
            args += [option, p[key]]
    if p["test_split"] is not None:
        args += ["--test-split", p["test_split"], "--split-seed", p["split_seed"]]
    if p["model_kwargs"]:
        args += ["--model-kwargs", kwargs_text(p["model_kwargs"])]
    if p["download"]:
        args.append("--download")
    if p["keep_blocks"]:
        args.append("--keep-blocks")
    if other_settings(out, settings):
        args.append("--overwrite")
    return args


if __name__ == "__main__":
    main(command, "extract")
