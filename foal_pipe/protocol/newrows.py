"""What shows a continuation's store new to its model: its class names mapped to the model's label ids, and its
training rows' identities (generation id, data identities) absent from what the model records it learned."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from foal_pipe.errors import FoalPipeError, param
from foal_pipe.model.deploy import DeployedModel
from foal_pipe.store import FeatureStore
from foal_pipe.store.manifest import IMAGES, data_identities


def label_map(model: DeployedModel, store_classes: Sequence[str]) -> np.ndarray:
    """``merged[k]``: the model label id of store class ``k`` (by name; new names get ids beyond the model's)."""
    if len(set(store_classes)) != len(store_classes):
        dup = next(c for i, c in enumerate(store_classes) if c in store_classes[:i])
        raise FoalPipeError(f"the store names class {dup!r} under two label ids; class names must be unique")
    return model.label_ids(list(store_classes))


def check_new_rows(model: DeployedModel, store: FeatureStore, features: str | Path, init_model: str | Path) -> list[str]:
    """Refuse a store whose training rows the model may have learned (they would count twice). Rows are shown new by
    identity only: the store's generation id not in the model's ``learned_from``, its data identity (the same rows
    re-extracted, or the same images: :func:`data_identities`) not in ``learned_data``; so a store with neither, or a
    model that records neither, is refused. Returns those identities, for the continued model's record."""
    generation, identities = store.meta.generation, data_identities(store)
    if not (generation or identities):
        unknown = f"{features} has no generation id or data identity (a format-{store.meta.format_version} store)"
        fix = "extract it again with this foal-pipe, which records both"
    elif not (model.metadata.get("learned_from") or model.metadata.get("learned_data")):
        unknown = (f"{init_model} records no store it learned (a model file from a foal-pipe that did not yet record the "
                   "stores it learned, or one saved from Python)")
        fix = "learn the model again with this foal-pipe on stores `foal-pipe extract` wrote, whose model file records them"
    else:
        unknown = fix = ""
    if unknown:
        raise FoalPipeError(f"{unknown}, so nothing shows that the model has not learned these rows (continuing would "
                            f"count each twice); {fix}")
    for key, this, what in (("learned_from", generation, "store generation"),
                            *(("learned_data", i, "the same rows extracted again: data identity") for i in identities)):
        if this and this in model.metadata.get(key, []):  # read_model checked both are lists of strings
            raise FoalPipeError(f"{init_model} has already learned the training rows of {features} ({what} "
                                f"{this[:16]}); continuing on them would count every row twice: pass "
                                f"{param('features')} a store of new rows")
    return identities


def unshown_images(model: DeployedModel, identities: Sequence[str], features: str | Path, init_model: str | Path) -> str | None:
    """Why nothing shows the images of a store new to the model, or None: the store names its train images
    (``images:``, :func:`data_identities`) but the model records none it learned (a file of a foal-pipe before
    2026-11-29, or a model of stores without a split manifest), so the same images from a copy of the folder, or from
    a path typed another way, pass :func:`check_new_rows`. A warning, as for ``rows_outside_stores``: the model's
    stores are checked by what it records, and only the rows it cannot name are left to the caller."""
    if not any(i.startswith(IMAGES) for i in identities) or any(
            i.startswith(IMAGES) for i in model.metadata.get("learned_data", [])):
        return None
    return (f"warning: {init_model} records no image it learned (a model file from a foal-pipe that did not yet record "
            f"them, or of stores without a split manifest), so nothing shows that the images of {features} are new to it "
            "(the same images from a copy of the folder, or a path typed another way, would count twice); if it may have "
            "learned them, learn the model again with this foal-pipe on stores it extracted, whose model file records them")
