"""Reading and writing the pipeline's Parquet tables."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd


class TableError(ValueError):
    """A table file is missing, corrupt or lacks columns; the message names the file."""


def _write_atomic(path: str | Path, write: Callable[[Path], None]) -> None:
    """Write under a temporary name, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_parquet_atomic(table: pd.DataFrame, path: str | Path) -> None:
    """Write a table as Parquet, atomically."""
    _write_atomic(path, lambda tmp: table.to_parquet(tmp, index=False))


def write_csv_atomic(table: pd.DataFrame, path: str | Path) -> None:
    """Write a table as CSV (for the report and for people), atomically."""
    _write_atomic(path, lambda tmp: table.to_csv(tmp, index=False))


def read_parquet(path: str | Path, columns: list[str] | None = None) -> pd.DataFrame:
    """Read a table, naming the file in any error."""
    path = Path(path)
    if not path.exists():
        raise TableError(f"{path}: no such file")
    try:
        table = pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise TableError(f"{path}: not a readable Parquet file ({e})") from e
    missing = [c for c in columns or [] if c not in table.columns]
    if missing:
        raise TableError(f"{path}: missing columns {missing}")
    return table
