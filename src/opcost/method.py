"""The evaluation's formulas: power, energy and their spreads over one timed window.

Thesis section 3.4, formulas (3.1)-(3.9), as docs/method.md describes them with the
choices made where the thesis is ambiguous. :func:`power_columns` turns one benchmark
record and its power log (:class:`opcost.powerlog.PowerLog`) into the power, energy and
condition columns of its dataset row (``opcost.schemas.DATASET``);
:func:`time_only_power_columns` gives those columns for a measurement without a log.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from opcost.powerlog import PowerLog, PowerLogError

# Log field -> dataset column of its window mean.
CONDITION_COLUMNS = {
    "clocks.sm": "sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
    "temperature.gpu": "temperature_c",
    "power.limit": "power_limit_w",
    "utilization.gpu": "utilization_gpu_pct",
}
_NAN = float("nan")
#: A log must reach this many polling intervals of the timed window's edges (see
#: :func:`check_coverage`).
COVERAGE_TOLERANCE_INTERVALS = 3


def time_only_power_columns() -> dict[str, Any]:
    """The power columns of a measurement without a power log: NaN, counts 0."""
    row: dict[str, Any] = dict.fromkeys(
        (
            "power_unfiltered_w",
            "sigma_power_unfiltered_w",
            "power_w",
            "sigma_power_w",
            "sem_power_w",
            "energy_total_j",
            "sigma_energy_total_j",
            "energy_j",
            "sigma_energy_j",
            "energy_nvml_j",
            "energy_integrated_j",
            *CONDITION_COLUMNS.values(),
        ),
        _NAN,
    )
    row.update(dict.fromkeys(("n_rows_total", "n_rows_dropped", "n_power_samples"), 0))
    row.update(n_power_updates=0, n_filtered_out=0, power_field=None, low_power_samples=False)
    return row


def power_columns(
    record: dict[str, Any],
    log: PowerLog,
    json_path: Path,
    utc_offset_s: float,
    min_power_updates: int,
) -> dict[str, Any]:
    """The power, energy and condition columns of a measurement with a power log.

    ``record`` is the checked benchmark record (``opcost.record_schema.RECORD_FIELDS``),
    ``utc_offset_s`` its ``utc_offset_s``. Raises PowerLogError (naming the CSV) when the
    log does not cover the timed window (:func:`check_coverage`).
    """
    start = float(record["timed_start_unix_s"])
    end = float(record["timed_end_unix_s"])
    # Compare in the log's own clock (local time as µs since the epoch), so that only the
    # window's two edges are converted, not every timestamp.
    local_us = log.samples["timestamp"].to_numpy("datetime64[us]").astype(np.int64)
    start_us = (start + utc_offset_s) * 1e6
    end_us = (end + utc_offset_s) * 1e6
    in_window = (local_us >= start_us) & (local_us <= end_us)
    n = int(in_window.sum())
    has_hole = check_coverage(record, log, json_path, local_us / 1e6 - utc_offset_s, n)
    if n == 0:
        # The log spans the window, but the window is shorter than the coverage tolerance
        # and no poll fell inside. Time stands; power is unknown, and the row is flagged.
        row = time_only_power_columns()
        row.update(power_field=log.power_field, low_power_samples=True)
        row.update(n_rows_total=log.n_rows_total, n_rows_dropped=log.n_rows_dropped)
        return row
    power_w = log.samples[log.power_field].to_numpy(np.float64)[in_window]
    t_s = (local_us[in_window] - start_us) / 1e6  # seconds since the window's start

    mean_w = power_w.mean()  # (3.1)
    sigma_w = power_w.std(ddof=1) if n > 1 else _NAN  # (3.2)
    # (3.3), with <= so that a constant log (σ = 0) keeps its samples.
    keep = np.abs(power_w - mean_w) <= 3 * sigma_w if n > 1 else np.ones(n, dtype=bool)
    filtered_w = power_w[keep]
    power_filtered_w = filtered_w.mean()  # (3.1) on the filtered samples
    sigma_filtered_w = filtered_w.std(ddof=1) if filtered_w.size > 1 else _NAN  # (3.2)
    # A reading repeated until the GPU updates its power value is one observation.
    is_update = np.ones(n, dtype=bool)
    is_update[1:] = power_w[1:] != power_w[:-1]
    n_updates = int(is_update.sum())
    n_filtered_updates = int(is_update[keep].sum())

    iterations = record["iterations"]
    total_time_s = float(record["total_time_s"])
    energy_total_j = power_filtered_w * total_time_s  # (3.4)
    sigma_energy_total_j = sigma_filtered_w * total_time_s  # (3.5)

    integrated_j = (
        np.trapezoid(power_w, t_s)
        + power_w[0] * t_s[0]  # hold the first reading back to the window's start
        + power_w[-1] * ((end - start) - t_s[-1])  # and the last one on to its end
    )
    e0 = record.get("energy_counter_start_mj")
    e1 = record.get("energy_counter_end_mj")
    nvml_j = (e1 - e0) / 1000 if e0 is not None and e1 is not None else _NAN

    row: dict[str, Any] = {
        "power_field": log.power_field,
        "n_rows_total": log.n_rows_total,
        "n_rows_dropped": log.n_rows_dropped,
        "n_power_samples": n,
        "n_power_updates": n_updates,
        "n_filtered_out": n - int(keep.sum()),
        "power_unfiltered_w": float(mean_w),
        "sigma_power_unfiltered_w": float(sigma_w),
        "power_w": float(power_filtered_w),
        "sigma_power_w": float(sigma_filtered_w),
        "sem_power_w": float(sigma_filtered_w / math.sqrt(n_filtered_updates)),
        "low_power_samples": n_updates < min_power_updates or has_hole,
        "energy_total_j": float(energy_total_j),
        "sigma_energy_total_j": float(sigma_energy_total_j),
        "energy_j": float(energy_total_j / iterations),  # (3.7)
        "sigma_energy_j": float(sigma_energy_total_j / iterations),  # (3.9)
        "energy_nvml_j": float(nvml_j / iterations),
        "energy_integrated_j": float(integrated_j / iterations),
    }
    for field, column in CONDITION_COLUMNS.items():
        if field in log.samples:
            row[column] = _mean(log.samples[field].to_numpy(np.float64)[in_window])
        else:
            row[column] = _NAN
    return row


def check_coverage(
    record: dict[str, Any], log: PowerLog, json_path: Path, unix_s: np.ndarray, n: int
) -> bool:
    """Check that the log's usable rows cover the timed window; True if it has a hole.

    With the tolerance COVERAGE_TOLERANCE_INTERVALS polling intervals (the record's
    ``power_interval_ms``, else the log's median spacing): the first usable row must come
    at most the tolerance after the window's start and the last one at most the tolerance
    before its end, and a window longer than the tolerance must hold a usable row; else
    this raises PowerLogError. A stretch of the window longer than the tolerance between
    two usable rows (rows dropped inside it) is a hole: the row is flagged.
    """
    start = float(record["timed_start_unix_s"])
    end = float(record["timed_end_unix_s"])
    interval_ms = record.get("power_interval_ms")
    if interval_ms is not None:
        interval_s = interval_ms / 1000
    else:
        interval_s = float(np.median(np.diff(unix_s))) if len(unix_s) > 1 else 0.0
    slack_s = COVERAGE_TOLERANCE_INTERVALS * interval_s
    first, last = float(unix_s[0]), float(unix_s[-1])
    gaps = []
    if first > start + slack_s:
        gaps.append(f"it starts {first - start:.3f} s after the window's start")
    if last < end - slack_s:
        gaps.append(f"it ends {end - last:.3f} s before the window's end")
    if n == 0 and not gaps and end - start > slack_s:
        gaps.append(f"none of its rows in the window's {end - start:.3f} s is usable")
    if gaps:
        what = "has no usable row in" if n == 0 else "covers only part of"
        raise PowerLogError(
            f"power log {log.path} {what} the timed window of {json_path}: "
            f"{' and '.join(gaps)} (rows [{first:.3f}, {last:.3f}] s, window "
            f"[{start:.3f}, {end:.3f}] s, utc_offset_s={record['utc_offset_s']}; tolerance "
            f"{slack_s:.3f} s); check utc_offset_s, else remeasure it (chmod u+w, delete "
            f"the .json and .csv, rerun)"
        )
    # Stretches between consecutive usable rows, clipped to the window.
    hole_s = np.minimum(unix_s[1:], end) - np.maximum(unix_s[:-1], start)
    return bool(hole_s.size and hole_s.max() > slack_s)


def _mean(values: np.ndarray) -> float:
    """Mean of the finite values, NaN (without a warning) if there are none."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else _NAN
