"""Resumable, chunk-aligned feature extraction into a feature store (docs/feature-store.md).

Every write of the store format is :mod:`foal_pipe.store`'s; this package decides what to write. The work is
split in three steps so that a distributed driver can reuse the middle one:

1. :func:`create_store` makes the store skeleton -- attributes, labels, row indices and empty feature arrays
   chunked along rows -- in a hidden sibling folder and renames it into place, so a crash never leaves a
   half-made store. An existing store is resumed if it was made with the same settings (chunk files missing
   below its progress are extracted again), refused otherwise. ``overwrite=True`` builds the replacement
   beside it and swaps it in when complete, so a reader of the old store is never served a half-written one.
2. :func:`extract_rows` encodes rows ``[lo, hi)`` of one split and writes them chunk by chunk, each write
   exactly one chunk. Batches never straddle a chunk boundary, so any chunk is computed from the same
   batches whether the run was interrupted or not, and a resumed store is identical to an uninterrupted one.
   It is callable from any process that can see the store (a DataLoader/Dask worker): it needs only the
   :class:`ExtractSpec` (the dataset and the encoder are opened once per process and cached).
3. :func:`finish_store` sets ``complete`` and the ``generation`` id last, once every split's ``progress``
   reaches its row count and every chunk file is there.

:func:`extraction` wraps them with the store's writer lock and the sidecar run log; :func:`run_extract`
fills every split in one process, recording ``progress`` (rows written, a multiple of the chunk size) after
every chunk; a re-run continues after the last chunk recorded. Torch is imported inside functions only.
"""

from foal_pipe.extract.loading import chunk_ranges
from foal_pipe.extract.run import (
    ExtractProgress,
    ExtractReport,
    extract_rows,
    extraction,
    prepare_store,
    run_extract,
)
from foal_pipe.extract.spec import (
    DEFAULT_CHUNK_ROWS,
    DEFAULT_OUT,
    DTYPES,
    ExtractSpec,
    Inputs,
    load_inputs,
    open_inputs,
    runtime_info,
    store_settings,
    stored_encoder,
)
from foal_pipe.extract.state import StoreState, block_layout, check_store, create_store, finish_store, staging_path
from foal_pipe.store import mark_progress

__all__ = [
    "DEFAULT_CHUNK_ROWS", "DEFAULT_OUT", "DTYPES", "ExtractProgress", "ExtractReport", "ExtractSpec", "Inputs",
    "StoreState", "block_layout", "check_store", "chunk_ranges", "create_store", "extract_rows", "extraction",
    "finish_store", "load_inputs", "mark_progress", "open_inputs", "prepare_store", "run_extract", "runtime_info",
    "staging_path", "store_settings", "stored_encoder"
]
