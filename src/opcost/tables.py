"""Former home of the table helpers, now in :mod:`opcost.io`; import them from there.

Kept only until every module imports :mod:`opcost.io`; the names below are the same
objects, so ``except TableError`` catches either spelling.
"""

from __future__ import annotations

from opcost.io import TableError, read_parquet, write_csv_atomic, write_parquet_atomic

__all__ = ["TableError", "read_parquet", "write_csv_atomic", "write_parquet_atomic"]
