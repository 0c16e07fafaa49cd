"""Reading a split manifest from where a user points (docs/datasets.md, "Split manifests"): a feature store, whose
``manifest`` array the store layer reads, or the JSON file ``info --export-manifest`` writes. It sits above both the
datasets and the store layers, which stay independent of each other."""

from __future__ import annotations

from pathlib import Path

from foal_pipe.datasets.manifest import SplitManifest, parse_manifest
from foal_pipe.errors import FoalPipeError


def read_manifest(path: str | Path) -> SplitManifest:
    """The manifest a feature store records (a ``.zarr`` folder), or a JSON file exported from one."""
    path = Path(path).expanduser()
    if path.is_dir():
        from foal_pipe.store import read_manifest_bytes  # zarr: loaded with the commands that read a store

        raw = read_manifest_bytes(path)
        if raw is None:
            raise FoalPipeError(f"{path} records no split manifest: {_why_none(path)}")
    elif path.is_file():
        raw = path.read_bytes()
    else:  # missing, or a named pipe or device, which reading would block on or never end
        what = "is not a file or a folder" if path.exists() else "does not exist"
        raise FoalPipeError(f"split manifest {path} {what}; pass a feature store or the JSON file "
                            "`foal-pipe info STORE --export-manifest FILE` writes")
    return parse_manifest(raw, str(path))


def _why_none(path: Path) -> str:
    """Why the complete store at ``path`` keeps no manifest, and what to do: only ``extract`` writes one (from format
    5), and not for torchvision's or HDF5's archives, whose split is fixed already."""
    from foal_pipe.store.meta import MANIFEST_FROM, read_meta

    _, meta = read_meta(path)
    if meta.format_version < MANIFEST_FROM:
        return (f"it is a store of format {meta.format_version}, and manifests came with format {MANIFEST_FROM}; "
                "re-extract it with this foal-pipe to get one")
    if "extract" not in meta.extra:
        return ("it was written by foal_pipe.store.write_store or another program, which keep no image manifest "
                "(only `foal-pipe extract` records one); extract the images with `foal-pipe extract` to get one")
    return (f"its dataset {meta.dataset!r} is read from torchvision or HDF5, whose archives fix the split: a store "
            "extracted from the same archive has the same split")
