"""CSV rows that a reader splits as they were written, for every CSV file foal-pipe writes.

Apart from the atomic writes, so that ``predict``'s and the report's tables share one rule for quoting.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from typing import Any

#: How foal-pipe's CSV text is encoded, whatever the locale: UTF-8, so that a command gives the same bytes on every
#: machine and a class name in any script is written, and a file name's bytes that are not UTF-8 (which Python reads
#: as surrogates) written back as they were.
ENCODING, ERRORS = "utf-8", "surrogateescape"


class CsvRows:
    """``csv.writer`` rows ending in ``\n`` that a reader splits as written: the csv module quotes a field holding its
    line terminator's characters only, so a carriage return in a class name or a path split its row; such a row is
    written with every field quoted."""

    def __init__(self, fh: Any) -> None:
        self._plain = csv.writer(fh, lineterminator="\n")
        self._quoted = csv.writer(fh, lineterminator="\n", quoting=csv.QUOTE_ALL)

    def writerow(self, row: Iterable[Any]) -> None:
        row = list(row)
        (self._quoted if any(isinstance(v, str) and "\r" in v for v in row) else self._plain).writerow(row)

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def csv_dict_writer(fh: Any, fieldnames: Sequence[str]) -> csv.DictWriter:
    """``csv.DictWriter`` whose rows go through :class:`CsvRows`."""
    writer = csv.DictWriter(fh, fieldnames=fieldnames, lineterminator="\n")
    writer.writer = CsvRows(fh)  # type: ignore[assignment]
    return writer
