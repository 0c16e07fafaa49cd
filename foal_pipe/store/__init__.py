"""The feature store: the Zarr contract between ``extract`` and ``learn`` (docs/feature-store.md).

This package owns the format. Every write goes through it -- arrays with a crc32c checksum on every chunk,
whole-chunk writes, ``progress``, ``complete`` and the ``generation`` id, the swap of a replaced store, the
sidecar run log -- and every read is checked by it:

* :func:`open_store` refuses anything a learner cannot trust (missing, not a store, incomplete, another
  format version, attributes of the wrong type, dtypes outside the spec, mismatched or absurd shapes, a
  chunk file missing, bad labels) with a one-line :class:`FoalPipeError`, before reading anything whole.
* Reads go through a Zarr store that treats a missing chunk as an error (Zarr's own reads it as zeros), and
  a chunk that fails its checksum or cannot be decoded is named by split and rows.
* :meth:`FeatureStore.check_unchanged` tells a reader whether the store it read is still the one it opened.

Features are never loaded whole: :meth:`Split.iter_chunks` and :meth:`Split.take` read chunk by chunk and
check every row they return for NaN and inf.

A store made with ``extract --keep-blocks`` (format 3) also keeps every block's token (``SPLIT/blocks``, read
with :meth:`Split.read_blocks`/:meth:`Split.take_blocks`) and the final norm (:class:`BlockLayout`);
:meth:`FeatureStore.fused` (or ``open_store(path, fusion=...)``) gives the store with its features fused from
them at read time, :meth:`FeatureStore.fusions` several fusions from one read (:mod:`foal_pipe.store.blockfusion`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from foal_pipe.lazy import lazy_names

if TYPE_CHECKING:
    from foal_pipe.store.integrity import check_chunks, compute_generation
    from foal_pipe.store.log import log_path, log_run, read_log, update_run, writer_lock
    from foal_pipe.store.meta import (
        BLOCK_DTYPES,
        FEATURE_DTYPES,
        FORMAT,
        FORMAT_VERSION,
        LABEL_CHUNK_ROWS,
        LOG_SUFFIX,
        MEMORY_SHARE,
        READABLE_VERSIONS,
        ROW_ARRAYS,
        SPLITS,
        UNLABELLED,
        BlockLayout,
        StoreMeta,
        open_array,
        read_meta,
    )
    from foal_pipe.store.read import FeatureStore, Split, check_same, open_store, read_manifest_bytes, read_split
    from foal_pipe.store.verify import ChunkProblem, Verification, has_checksums, verify_store
    from foal_pipe.store.write import (
        FeatureWriter,
        complete_store,
        create_array,
        create_skeleton,
        mark_progress,
        remove_partial_files,
        reopen_at,
        replace_store,
        write_store,
    )

__all__ = [
    "BLOCK_DTYPES", "BlockLayout", "ChunkProblem", "FEATURE_DTYPES", "FORMAT", "FORMAT_VERSION", "FeatureStore",
    "FeatureWriter", "LABEL_CHUNK_ROWS", "LOG_SUFFIX", "MEMORY_SHARE", "READABLE_VERSIONS", "ROW_ARRAYS", "SPLITS",
    "Split", "StoreMeta", "UNLABELLED", "Verification", "check_chunks", "check_same", "complete_store",
    "compute_generation", "create_array", "create_skeleton", "has_checksums", "log_path", "log_run", "mark_progress",
    "open_array", "open_store", "read_log", "read_manifest_bytes", "read_meta", "read_split", "remove_partial_files", "reopen_at",
    "replace_store",
    "update_run", "verify_store", "write_store", "writer_lock"
]

__getattr__ = lazy_names(__name__, {
    "foal_pipe.store.integrity": ["check_chunks", "compute_generation"],
    "foal_pipe.store.log": ["log_path", "log_run", "read_log", "update_run", "writer_lock"],
    "foal_pipe.store.meta": ["BLOCK_DTYPES", "FEATURE_DTYPES", "FORMAT", "FORMAT_VERSION", "LABEL_CHUNK_ROWS",
                               "LOG_SUFFIX", "MEMORY_SHARE", "READABLE_VERSIONS", "ROW_ARRAYS", "SPLITS",
                               "UNLABELLED", "BlockLayout", "StoreMeta", "open_array", "read_meta"],
    "foal_pipe.store.read": ["FeatureStore", "Split", "check_same", "open_store", "read_manifest_bytes", "read_split"],
    "foal_pipe.store.verify": ["ChunkProblem", "Verification", "has_checksums", "verify_store"],
    "foal_pipe.store.write": ["FeatureWriter", "complete_store", "create_array",
                                "create_skeleton", "mark_progress", "remove_partial_files", "reopen_at",
                                "replace_store", "write_store"],
})
