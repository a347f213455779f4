"""Reading and writing the pipeline's Parquet tables."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd


class TableError(ValueError):
    """A table file is missing, corrupt or lacks columns; the message names the file."""


def write_parquet_atomic(table: pd.DataFrame, path: str | Path) -> None:
    """Write Parquet under a temporary name, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        table.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
