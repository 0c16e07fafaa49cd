"""A PNG's pixel data checked for length: Pillow decodes a PNG whose compressed data ends early (a well-formed
stream holding only the first rows) without a word and fills the missing rows with zeros, so such an image
would be learned or predicted as a different picture."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # by colour type: grey, RGB, palette, grey + alpha, RGBA
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _expected_bytes(width: int, height: int, bits: int, colour: int, interlaced: bool) -> int:
    """The decompressed size of the image's rows: a filter byte and the packed pixels of each row (of each
    Adam7 pass when interlaced)."""
    def rows(w: int, h: int) -> int:
        return h * (1 + (w * _CHANNELS[colour] * bits + 7) // 8) if w and h else 0

    if not interlaced:
        return rows(width, height)
    return sum(rows(-(-(width - x) // dx), -(-(height - y) // dy)) for x, y, dx, dy in _ADAM7)


def png_shortfall(path: str | Path, data: bytes | None = None) -> str | None:
    """Why the PNG file at ``path`` (``data``: its bytes, where already read) holds fewer pixel rows than its header
    declares (None when it holds them all, or is not a PNG this check reads: Pillow's own decoder judges those)."""
    data = Path(path).read_bytes() if data is None else data
    if not data.startswith(_SIGNATURE):
        return None
    at, header, compressed = len(_SIGNATURE), None, []
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        body = data[at + 8 : at + 8 + length]
        if kind == b"IHDR" and len(body) == 13:
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            compressed.append(body)
        elif kind == b"IEND":
            break
        at += 12 + length
    if header is None or header[3] not in _CHANNELS:
        return None
    width, height, bits, colour, _, _, interlace = header
    expected = _expected_bytes(width, height, bits, colour, interlace == 1)
    try:
        got = len(zlib.decompressobj().decompress(b"".join(compressed), expected + 1))
    except zlib.error:
        return None  # damaged data: Pillow's decoder says so itself
    if got >= expected:
        return None
    return f"its pixel data ends after {got:,} of {expected:,} bytes: the file is truncated"
