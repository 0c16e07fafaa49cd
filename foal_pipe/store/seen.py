"""Whether a Dask cluster's workers see a feature store as this process does: each reads the store at its path
itself, and one that sees none there, or another store, would otherwise fail as if the store were damaged, or
read another store's rows."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from foal_pipe.cluster import cluster_errors, cluster_failure
from foal_pipe.errors import FoalPipeError
from foal_pipe.store.read import _fingerprint

if TYPE_CHECKING:
    from distributed import Client


def store_identity(path: str | Path) -> str:
    """What identifies the store at ``path`` as this process sees it (its generation id, else a hash of its attributes
    file, and whether it is complete: what :func:`~foal_pipe.store.check_same` compares, less the folder's inode,
    which differs between nodes), or ``error: <why>`` where it cannot be read."""
    try:
        return repr(_fingerprint(Path(path))[2:])
    except (OSError, ValueError, RecursionError) as exc:
        return f"error: {type(exc).__name__}"


def check_workers_see(client: Client, path: str | Path, shown: str | Path, fix: str) -> None:
    """Refuse, in one line, a cluster whose workers do not see the store at ``path`` (resolved; ``shown``: as the user
    named it) as this process does: each worker reads it there, and one that cannot would otherwise fail as if the
    store were missing or damaged. ``fix``: the last words, what to do."""
    here = store_identity(path)
    try:
        seen = client.run(store_identity, str(path))
    except cluster_errors() as exc:
        raise cluster_failure(exc) from None
    except Exception:  # noqa: BLE001  workers that cannot answer (another foal-pipe): the error at hand is the one to say
        return
    blind = {worker: identity for worker, identity in sorted(seen.items()) if identity != here}
    if blind:
        worker, identity = next(iter(blind.items()))
        how = f"cannot read {path}, {identity[7:]}" if identity.startswith("error: ") else f"sees another store at {path}"
        raise FoalPipeError(f"the Dask workers do not see the feature store {shown} as this process does ({len(blind)} of "
                            f"{len(seen)}: {worker} {how}); every worker must see the store at the same path (a shared "
                            f"filesystem, docs/dask.md): {fix}")
