"""Read a raw ``nvidia-smi`` power log (the CSV the profile stage writes, untouched).

The log is the output of ``nvidia-smi --query-gpu=<fields> --format=csv,nounits -lms <ms>``:
a header naming each field with its unit (``power.draw.instant [W]``), then one line per
poll, e.g. ``2026/11/22 09:41:24.502, 121.09, 80.05, 450, 2619, 36, 0``. A time-only (CPU)
measurement writes a file whose only line is ``# no power log: <reason>``.

:func:`read_power_log` reads it into a :class:`PowerLog` (the usable samples, the power
field chosen, and how many polls were dropped). Which rows are dropped and how polls are
counted (thesis 3.4: "Any existing rows containing a non-numerical value are dropped"):
docs/method.md, "Reading the power log".
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from opcost.errors import OpcostError

#: Format of ``nvidia-smi``'s timestamps: host local time, no zone, milliseconds.
TIMESTAMP_FORMAT = "%Y/%m/%d %H:%M:%S.%f"
#: A timestamp in that format, found anywhere in a line (to count the polls it holds).
_TIMESTAMP_RE = re.compile(rb"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d")
#: First characters of the CSV a time-only measurement writes instead of a log.
NO_POWER_LOG_PREFIX = "# no power log"
#: Power fields in order of preference.
POWER_FIELDS = ("power.draw.instant", "power.draw")
#: Fields besides the power field that the evaluation uses; a row where one of them is
#: not a number is dropped.
USED_FIELDS = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.limit")
#: Header names ``nvidia-smi`` prints for fields queried under a shorter name.
HEADER_ALIASES = {
    "clocks.current.sm": "clocks.sm",
    "clocks.current.memory": "clocks.mem",
    "clocks.current.graphics": "clocks.gr",
    "clocks.current.video": "clocks.video",
}


class PowerLogError(OpcostError, ValueError):
    """A power log cannot be used; the message names the file and what to check."""


@dataclass(frozen=True, eq=False)
class PowerLog:
    """The usable rows of one ``nvidia-smi`` log.

    Attributes:
        path: The CSV file read.
        samples: One row per usable poll, in file order: ``timestamp`` (datetime64, host
            local time as printed, no zone) and one float64 column per numerical field,
            named by query name without unit (``power.draw.instant``, ``clocks.sm``, ...).
        power_field: The column holding power in W: ``power.draw.instant`` or ``power.draw``.
        n_rows_total: Polls in the log after the header, dropped ones included: one per
            non-blank line, more for a line that holds several (see the module docstring).
        n_rows_dropped: Polls dropped as unusable (see the module docstring).
    """

    path: Path
    samples: pd.DataFrame
    power_field: str
    n_rows_total: int
    n_rows_dropped: int


def field_name(header_column: str) -> str:
    """The query name of a CSV header column: ``clocks.current.sm [MHz]`` -> ``clocks.sm``."""
    name = header_column.strip()
    if name.endswith("]") and " [" in name:
        name = name[: name.rindex(" [")]
    return HEADER_ALIASES.get(name, name)


def read_power_log(path: str | Path) -> PowerLog | None:
    """Read a raw ``nvidia-smi`` CSV; None for a time-only measurement's placeholder.

    Args:
        path: The CSV written by the profile stage.

    Returns:
        The usable rows and counts, or None when the file is the ``# no power log: ...``
        placeholder of a time-only measurement.

    Raises:
        PowerLogError: The file is missing or empty, holds no sample after its header, has
            no ``timestamp`` column, logs no power field with a numerical value, or has no
            usable row. The message names the file.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise PowerLogError(
            f"power log {path} cannot be read ({e}); rerun the profile job that writes it"
        ) from e
    if raw.startswith(NO_POWER_LOG_PREFIX.encode()):
        return None
    lines = raw.split(b"\n")
    header = lines[0].decode("utf-8", errors="replace").rstrip("\r")
    if not header.strip():
        raise PowerLogError(
            f"power log {path} is empty; rerun the profile job (was nvidia-smi running?)"
        )
    names = [field_name(c) for c in header.split(",")]
    if "timestamp" not in names:
        raise PowerLogError(
            f"power log {path} has no 'timestamp' column (header: {header!r}); the profile "
            f"stage must query timestamp as the first field"
        )
    if len(set(names)) != len(names):
        raise PowerLogError(f"power log {path} names a field twice (header: {header!r})")

    body = lines[1:]
    # A file that does not end with a newline was cut off mid-line (nvidia-smi killed
    # while writing): its last line cannot be trusted even if it happens to parse.
    truncated = 0
    if body and body[-1] != b"":
        truncated = _polls_in(body[-1], len(names))
        body = body[:-1]
    body = [line for line in body if line.strip()]
    polls = [_polls_in(line, len(names)) for line in body]
    n_rows_total = sum(polls) + truncated
    if n_rows_total == 0:
        raise PowerLogError(
            f"power log {path} holds its header but no sample (the file was cut, or "
            f"nvidia-smi stopped before its first poll); remeasure it (chmod u+w, delete it "
            f"and its .json, rerun)"
        )
    n_commas = len(names) - 1
    good = [
        line for line, n in zip(body, polls, strict=True) if n == 1 and line.count(b",") == n_commas
    ]

    timestamps, columns = _parse_rows(good, names)
    # A field that is never a number was not really logged (a string field, or one the
    # GPU reports as [N/A] throughout); dropping it keeps it from emptying the log.
    columns = {n: v for n, v in columns.items() if not np.isnan(v).all()}
    power_field = next((f for f in POWER_FIELDS if f in columns), None)
    if power_field is None:
        if not good:
            raise PowerLogError(
                f"power log {path} has no usable row ({n_rows_total} rows, none with the "
                f"header's {len(names)} fields); remeasure it (chmod u+w, delete it and its "
                f".json, rerun)"
            )
        raise PowerLogError(
            f"power log {path} has no power field with a numerical value (header: "
            f"{header!r}); the profile stage must log power.draw.instant or power.draw with "
            f"--format=csv,nounits"
        )
    used = [power_field, *(f for f in USED_FIELDS if f in columns)]
    usable = ~np.isnat(timestamps)
    for name in used:
        usable &= ~np.isnan(columns[name])
    n_usable = int(usable.sum())
    if n_usable == 0:
        raise PowerLogError(
            f"power log {path} has no usable row ({n_rows_total} rows, none with a valid "
            f"timestamp and numerical {', '.join(used)}); rerun the profile job"
        )
    samples = pd.DataFrame(
        {"timestamp": timestamps[usable], **{n: v[usable] for n, v in columns.items()}}
    )
    return PowerLog(
        path=path,
        samples=samples,
        power_field=power_field,
        n_rows_total=n_rows_total,
        n_rows_dropped=n_rows_total - n_usable,
    )


def _polls_in(line: bytes, n_fields: int) -> int:
    """How many polls a line holds: its timestamps, or its fields over the header's."""
    by_fields = -(-(line.count(b",") + 1) // n_fields)
    return max(1, len(_TIMESTAMP_RE.findall(line)), by_fields)


def _parse_rows(lines: list[bytes], names: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Parse data lines: timestamps (datetime64[us], NaT for junk) and float64 columns (NaN)."""
    fields = [n for n in names if n != "timestamp"]
    if not lines:
        return np.array([], dtype="datetime64[us]"), {n: np.array([]) for n in fields}
    # The C engine is faster than the pyarrow engine for files of a few hundred lines
    # (measured: 0.5 ms against 1.5 ms per 120-line file), which is what a log holds.
    table = pd.read_csv(
        io.BytesIO(b"\n".join(lines)),
        header=None,
        names=names,
        dtype={"timestamp": str},
        skipinitialspace=True,
        engine="c",
    )
    # An explicit format parses the whole column in one vectorised pass; NaT for junk.
    timestamps = pd.to_datetime(
        table["timestamp"].to_numpy(object), format=TIMESTAMP_FORMAT, errors="coerce"
    ).to_numpy("datetime64[us]")
    columns = {}
    for name in fields:
        column = table[name]
        if column.dtype.kind not in "iuf":  # junk such as [N/A] made it a string column
            column = pd.to_numeric(column.str.strip(), errors="coerce")
        columns[name] = np.asarray(column, dtype=np.float64)
    return timestamps, columns
