"""A model file's checksum: the SHA-256 of its canonical content (metadata and tensors), independent of the file's
layout, so any flipped bit or edited metadata value is refused by :func:`foal_pipe.model.modelfile.read_model`."""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

#: ``checksum`` is this prefix and 64 hex digits.
CHECKSUM_PREFIX = "sha256:"
_READ_BLOCK = 1 << 24


def is_checksum(value: Any) -> bool:
    """Whether ``value`` has the form of a ``checksum``: ``sha256:`` and 64 lowercase hex digits."""
    digits = value[len(CHECKSUM_PREFIX):] if isinstance(value, str) and value.startswith(CHECKSUM_PREFIX) else ""
    return len(digits) == 64 and all(c in "0123456789abcdef" for c in digits)


def content_checksum(strings: Mapping[str, str], entries: Collection[tuple[str, str, Any, Any]]) -> str:
    """``checksum``: ``sha256:`` and the SHA-256 hex digest of the model's canonical encoding.

    ``strings`` are the metadata values as stored (JSON text; ``checksum`` itself is left out), ``entries``
    ``(name, dtype code, shape, byte blocks)`` of every tensor. The encoding is the metadata as JSON (keys
    sorted, no spaces) and a newline, then, per tensor in name order, ``[name, code, shape]`` as JSON, a newline
    and the tensor's little-endian, C-order bytes. It depends on content only, not on the file's layout.
    """
    digest = hashlib.sha256()
    text = {k: v for k, v in strings.items() if k != "checksum"}
    digest.update(json.dumps(text, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    for name, code, shape, blocks in sorted(entries, key=lambda entry: entry[0]):
        digest.update(json.dumps([name, code, [int(n) for n in shape]], separators=(",", ":")).encode() + b"\n")
        for block in blocks:
            digest.update(block)
    return CHECKSUM_PREFIX + digest.hexdigest()


def file_checksum(path: Path, strings: Mapping[str, str]) -> str:
    """:func:`content_checksum` of a model file, its tensors' bytes streamed from disk (none held whole)."""
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
        start = 8 + size

        def blocks(lo: int, hi: int) -> Any:
            fh.seek(start + lo)
            while lo < hi:
                block = fh.read(min(_READ_BLOCK, hi - lo))
                if not block:
                    raise OSError("the file ends inside a tensor")
                lo += len(block)
                yield block

        entries = [(name, info["dtype"], info["shape"], blocks(*info["data_offsets"]))
                   for name, info in header.items() if name != "__metadata__"]
        return content_checksum(strings, entries)
