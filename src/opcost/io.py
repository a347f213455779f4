"""Writing files atomically, and reading the pipeline's tables with clear errors.

Every file a stage writes goes through :func:`write_atomic`: it is written under a
temporary name in its directory, flushed to disk and renamed into place, so a reader (or
Snakemake after a crash) sees the whole file or none.

    write_json_atomic(path, {"a": 1})
    write_parquet_atomic(table, path)
    table = read_parquet(path, columns=["op_id"])
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from opcost.errors import OpcostError


class TableError(OpcostError, ValueError):
    """A table file is missing, corrupt or lacks columns; the message names the file."""


def staged_path(path: str | Path) -> Path:
    """The temporary name a file is written under before it is renamed to ``path``."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_atomic(path: str | Path, content: bytes | str | Callable[[Path], None]) -> None:
    """Write ``content`` to ``path`` atomically, creating its directory.

    Args:
        path: the final file.
        content: bytes, text (UTF-8), or a function that writes the temporary file whose
            path it is given (e.g. ``lambda tmp: table.to_parquet(tmp)``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = staged_path(path)
    try:
        if callable(content):
            content(tmp)
        else:
            data = content.encode() if isinstance(content, str) else content
            with tmp.open("wb") as f:
                f.write(data)
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: str | Path, obj: Any, **dump_kwargs: Any) -> None:
    """Write ``obj`` as JSON (one document, newline-terminated), atomically."""
    dump_kwargs.setdefault("indent", 1)
    dump_kwargs.setdefault("sort_keys", True)
    write_atomic(path, json.dumps(obj, **dump_kwargs) + "\n")


def write_parquet_atomic(table: pd.DataFrame, path: str | Path) -> None:
    """Write a table as Parquet, atomically."""
    write_atomic(path, lambda tmp: table.to_parquet(tmp, index=False))


def write_csv_atomic(table: pd.DataFrame, path: str | Path) -> None:
    """Write a table as CSV (for the report and for people), atomically."""
    write_atomic(path, lambda tmp: table.to_csv(tmp, index=False))


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
