"""Reading a split manifest from where a user points (docs/datasets.md, "Split manifests"): a feature store, whose
``manifest`` array the store layer reads, or the JSON file ``info --export-manifest`` writes. It sits above both the
datasets and the store layers, which stay independent of each other."""

from __future__ import annotations

from pathlib import Path

from foal_pipe.datasets.manifest import SplitManifest, parse_manifest
from foal_pipe.errors import FoalPipeError, param


def read_manifest(path: str | Path) -> SplitManifest:
    """The manifest a feature store records (a ``.zarr`` folder), or a JSON file exported from one."""
    path = Path(path).expanduser()
    if path.is_dir():
        from foal_pipe.store import read_manifest_bytes  # zarr: loaded with the commands that read a store

        raw = read_manifest_bytes(path)
        if raw is None:
            raise FoalPipeError(f"{path} records no split manifest (a store of format 4 or older, or of a dataset read "
                                "from torchvision or HDF5); re-extract it with this foal-pipe, or pass another "
                                f"{param('split_manifest')}")
    elif path.is_file():
        raw = path.read_bytes()
    else:
        raise FoalPipeError(f"split manifest {path} does not exist; pass a feature store or the JSON file "
                            "`foal-pipe info STORE --export-manifest FILE` writes")
    return parse_manifest(raw, str(path))
