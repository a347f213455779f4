"""Evaluate raw measurements: one benchmark JSON plus its ``nvidia-smi`` CSV -> one row.

The evaluate stage turns ``results/raw/{gpu}/{setting}/{mode}/{ops,networks}/{name}.json``
(with the ``.csv`` beside it) into ``results/dataset/{gpu}.parquet``, one row per successful
measurement (columns :data:`opcost.schemas.DATASET`), and a failure table, one row per
failed one (:data:`opcost.schemas.FAILED`)::

    dataset, failures = evaluate_gpu("results/raw/h100", "h100")
    write_dataset(dataset, failures, "results/dataset/h100.parquet", "h100.failed.parquet")

A record is checked against :data:`opcost.record_schema.RECORD_FIELDS` when it is read. The
formulas (thesis 3.4, (3.1)-(3.9)) are in :mod:`opcost.method`; docs/method.md describes
them and the choices made where the thesis is ambiguous, docs/formats.md the files.
"""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from opcost import trace_eval
from opcost.config import schema_defaults
from opcost.errors import OpcostError
from opcost.io import write_parquet_atomic
from opcost.method import power_columns, time_only_power_columns
from opcost.powerlog import PowerLogError, read_power_log
from opcost.record_schema import RECORD_FIELDS, RECORD_SCHEMA_VERSION, REQUIRED_WHEN_OK
from opcost.schemas import BREAKDOWN, DATASET, FAILED

#: Kind of measurement -> subfolder of ``results/raw/{gpu}/{setting}/{mode}``.
KIND_DIRS = {"op": "ops", "network": "networks"}
SCHEMA_VERSION = RECORD_SCHEMA_VERSION
#: Default threshold for ``low_power_samples``: the config schema's
#: ``evaluate.min_power_updates``.
MIN_POWER_UPDATES: int = schema_defaults("evaluate")["min_power_updates"]
#: Dataset columns in order, with their pandas dtype (``opcost.schemas.DATASET``).
DATASET_COLUMNS: dict[str, Any] = DATASET.dtypes()
#: Failure-table columns in order (``opcost.schemas.FAILED``).
FAILURE_COLUMNS = FAILED.names
_NAN = float("nan")
_JSON_TYPES = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and math.isfinite(v))
    ),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


class EvaluationError(OpcostError, ValueError):
    """A benchmark JSON cannot be evaluated; the message names the file."""


def evaluate_measurement(
    json_path: str | Path,
    csv_path: str | Path | None,
    *,
    min_power_updates: int = MIN_POWER_UPDATES,
) -> dict[str, Any]:
    """Evaluate one measurement: its benchmark JSON and its ``nvidia-smi`` CSV.

    Args:
        json_path: The benchmark JSON.
        csv_path: The raw CSV beside it; None for a measurement without one (time only).
        min_power_updates: Fewer distinct power readings in the window than this flags
            the row ``low_power_samples``.

    Returns:
        For ``status: ok``: one dataset row, keyed by :data:`DATASET_COLUMNS`. For
        ``status: failed``: ``status`` plus the failure-table columns
        (:data:`FAILURE_COLUMNS`).

    Raises:
        EvaluationError: The JSON is unreadable, or a field the evaluation reads is
            missing, of the wrong type or out of range (:data:`RECORD_FIELDS`).
        PowerLogError: The measurement has power but its CSV is missing or unusable, or
            does not cover the timed window (docs/method.md).
    """
    json_path = Path(json_path)
    record = _read_record(json_path)
    if record["status"] == "failed":
        row = {c: record.get(c) for c in FAILURE_COLUMNS}
        row["failure_reason"] = record.get("failure_reason") or "(no reason recorded)"
        row["json_path"] = str(json_path)
        row["status"] = "failed"
        return row

    row = _identity_columns(record, json_path)
    row.update(_time_columns(record, json_path))
    log = None
    if record.get("power_available", False) and record.get("device") != "cpu":
        if csv_path is None:
            raise PowerLogError(
                f"{json_path} says power_available but no power log was given; pass the "
                f"CSV beside it, or rerun the profile job"
            )
        log = read_power_log(csv_path)
    if log is None:
        row.update(time_only_power_columns())
    else:
        utc_offset_s = _number(record, "utc_offset_s", json_path, required=True)
        row.update(power_columns(record, log, json_path, utc_offset_s, min_power_updates))
    return {c: row.get(c) for c in DATASET_COLUMNS}


def evaluate_gpu(
    raw_dir: str | Path, gpu: str, *, min_power_updates: int = MIN_POWER_UPDATES
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Evaluate every measurement of one GPU configuration.

    Walks ``raw_dir/{setting}/{mode}/{ops,networks}/*.json`` (``raw_dir`` =
    ``results/raw/{gpu}``); each JSON's CSV is the file of the same name with ``.csv``.

    Args:
        raw_dir: The GPU configuration's raw folder.
        gpu: The GPU configuration's name; every JSON must name the same.
        min_power_updates: See :func:`evaluate_measurement`.

    Returns:
        ``(dataset, failures)``: one row per successful measurement (columns
        :data:`DATASET_COLUMNS`) and one per failed one (:data:`FAILURE_COLUMNS`), sorted
        by setting, mode, kind and name.

    Raises:
        EvaluationError: ``raw_dir`` is not a folder, or a JSON does not match the path it
            lies under (another GPU, setting, mode, kind or name).
        PowerLogError: A measurement's power log is unusable (see
            :func:`evaluate_measurement`).
    """
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise EvaluationError(
            f"raw folder {raw_dir} does not exist; run the profile stage for GPU {gpu!r} first"
        )
    json_paths = [
        json_path
        for setting_dir in sorted(p for p in raw_dir.iterdir() if p.is_dir())
        for mode_dir in sorted(p for p in setting_dir.iterdir() if p.is_dir())
        for sub in KIND_DIRS.values()
        for json_path in sorted((mode_dir / sub).glob("*.json"))
    ]
    return evaluate_files(json_paths, gpu, min_power_updates=min_power_updates)


def evaluate_files(
    json_paths: Iterable[str | Path], gpu: str, *, min_power_updates: int = MIN_POWER_UPDATES
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Evaluate the given measurements of one GPU configuration (what the rule passes).

    Each ``.../{gpu}/{setting}/{mode}/{ops|networks}/{name}.json`` is read with the CSV of
    the same name beside it. Returns and raises as :func:`evaluate_gpu`.
    """
    kind_of_dir = {sub: kind for kind, sub in KIND_DIRS.items()}
    rows: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    for json_path in map(Path, json_paths):
        csv_path = json_path.with_suffix(".csv")
        row = evaluate_measurement(
            json_path,
            csv_path if csv_path.exists() else None,
            min_power_updates=min_power_updates,
        )
        parts = json_path.parts
        kind = kind_of_dir.get(parts[-2], parts[-2]) if len(parts) >= 5 else None
        expected = {
            "gpu": gpu,
            "setting": parts[-4] if len(parts) >= 5 else None,
            "mode": parts[-3] if len(parts) >= 5 else None,
            "kind": kind,
            "op_id" if kind == "op" else "model_input": json_path.stem,
        }
        wrong = [f"{k}={row[k]!r}, not {v!r}" for k, v in expected.items() if row[k] != v]
        if wrong:
            raise EvaluationError(
                f"{json_path} does not match the path it lies under: it records "
                f"{'; '.join(wrong)}; move it or rerun its profile job"
            )
        if row["status"] == "failed":
            failures.append({c: row[c] for c in FAILURE_COLUMNS})
        else:
            row.update(trace_eval.trace_columns(trace_eval.find_trace(json_path)))
            rows.append(row)
    dataset = pd.DataFrame.from_records(rows, columns=list(DATASET_COLUMNS))
    dataset = dataset.astype(DATASET_COLUMNS)
    failed = pd.DataFrame.from_records(failures, columns=list(FAILURE_COLUMNS))
    failed = failed.astype(FAILED.dtypes())
    return dataset, failed


def breakdown_table(json_paths: Iterable[str | Path]) -> pd.DataFrame:
    """The traced breakdowns of the networks among ``json_paths`` (schema BREAKDOWN)."""
    rows = []
    for json_path in map(Path, json_paths):
        if json_path.parent.name != KIND_DIRS["network"]:
            continue
        trace = trace_eval.find_trace(json_path)
        if trace is not None:
            rows += trace_eval.breakdown_rows(trace)
    table = pd.DataFrame.from_records(rows, columns=list(BREAKDOWN.names))
    return table.astype(BREAKDOWN.dtypes())


def write_dataset(
    dataset: pd.DataFrame,
    failures: pd.DataFrame,
    out_path: str | Path,
    failed_path: str | Path,
) -> None:
    """Write the dataset and the failure table as Parquet, each atomically.

    Each file is written under a temporary name in the same folder and then renamed, so
    that a reader (or Snakemake after a crash) never sees a half-written file.
    """
    write_parquet_atomic(dataset, out_path)
    write_parquet_atomic(failures, failed_path)


def _read_record(json_path: Path) -> dict[str, Any]:
    try:
        with json_path.open("rb") as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise EvaluationError(
            f"benchmark JSON {json_path} cannot be read ({e}); rerun its profile job"
        ) from e
    if not isinstance(record, dict):
        raise EvaluationError(f"benchmark JSON {json_path} is not a JSON object")
    if record.get("schema_version") != SCHEMA_VERSION:
        raise EvaluationError(
            f"benchmark JSON {json_path} has schema_version "
            f"{record.get('schema_version')!r}; this version of opcost reads "
            f"{SCHEMA_VERSION} (docs/formats.md); rerun the profile stage"
        )
    if record.get("status") not in ("ok", "failed"):
        raise EvaluationError(
            f"benchmark JSON {json_path} has status {record.get('status')!r}; expected "
            f"'ok' or 'failed'"
        )
    if record.get("kind") not in KIND_DIRS:
        raise EvaluationError(
            f"benchmark JSON {json_path} has kind {record.get('kind')!r}; expected 'op' or "
            f"'network'"
        )
    problem = _record_problem(record)
    if problem is not None:
        raise EvaluationError(
            f"benchmark JSON {json_path}: {problem} (docs/formats.md); rerun its profile job"
        )
    return record


def _record_problem(record: dict[str, Any]) -> str | None:
    """The first field that breaks :data:`RECORD_FIELDS`, said in words; None if none."""
    required = REQUIRED_WHEN_OK if record["status"] == "ok" else ()
    for key, field in RECORD_FIELDS.items():
        if not field.checked:
            continue
        value = record.get(key)
        if value is None:
            if key in required or (not field.nullable):
                return f"{key} is missing or null, expected {' or '.join(field.types)}"
            continue
        if not any(_JSON_TYPES[t](value) for t in field.types):
            allowed = " or ".join(field.types) + (" or null" if field.nullable else "")
            return f"{key} is {reprlib.repr(value)}, expected {allowed}"
        if (
            (field.minimum is not None and value < field.minimum)
            or (field.above is not None and value <= field.above)
            or (field.maximum is not None and value > field.maximum)
        ):
            bounds = [
                f"{op} {bound:g}"
                for op, bound in ((">=", field.minimum), (">", field.above), ("<=", field.maximum))
                if bound is not None
            ]
            return f"{key} is {value!r}, expected {' and '.join(bounds)}"
    return None


def _number(record: dict[str, Any], key: str, json_path: Path, *, required: bool) -> float:
    value = record.get(key)
    if value is None and not required:
        return _NAN
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise EvaluationError(
            f"benchmark JSON {json_path}: {key} is {value!r}, expected a number "
            f"(docs/formats.md); rerun its profile job"
        )
    return float(value)


def _identity_columns(record: dict[str, Any], json_path: Path) -> dict[str, Any]:
    spec = record.get("spec") if record["kind"] == "op" else None
    return {
        "gpu": record.get("gpu"),
        "setting": record.get("setting"),
        "mode": record.get("mode"),
        "kind": record["kind"],
        "op_id": record.get("op_id"),
        "model_input": record.get("model_input"),
        "op_type": spec.get("type") if isinstance(spec, dict) else None,
        # Same canonical form as the extract stage: sorted keys, no spaces.
        "spec": None if spec is None else json.dumps(spec, sort_keys=True, separators=(",", ":")),
        "status": "ok",
        "device": record.get("device"),
        "dtype": record.get("dtype"),
        "tf32": bool(record.get("tf32", False)),
        "block_size": record.get("block_size"),
        "number_per_run": record.get("number_per_run"),
        "warmup_iterations": record.get("warmup_iterations"),
        "requested_sm_clock_mhz": record.get("requested_sm_clock_mhz"),
        "requested_power_limit_w": record.get("requested_power_limit_w"),
        "power_interval_ms": record.get("power_interval_ms"),
        "peak_memory_bytes": record.get("peak_memory_bytes"),
        "gpu_name": record.get("gpu_name"),
        "gpu_uuid": record.get("gpu_uuid"),
        "driver_version": record.get("driver_version"),
        "cuda_version": record.get("cuda_version"),
        "torch_version": record.get("torch_version"),
        "host": record.get("host"),
        "json_path": str(json_path),
    }


def _time_columns(record: dict[str, Any], json_path: Path) -> dict[str, Any]:
    # Types and ranges are checked against RECORD_FIELDS when the record is read.
    iterations = record["iterations"]
    total_time_s = float(record["total_time_s"])
    sigma_total_time_s = _number(record, "sigma_total_time_s", json_path, required=False)
    start = float(record["timed_start_unix_s"])
    end = float(record["timed_end_unix_s"])
    if end < start:
        raise EvaluationError(
            f"benchmark JSON {json_path}: timed_end_unix_s {end} is before timed_start_unix_s "
            f"{start}; rerun its profile job"
        )
    e0 = record.get("energy_counter_start_mj")
    e1 = record.get("energy_counter_end_mj")
    if e0 is not None and e1 is not None and e1 < e0:
        raise EvaluationError(
            f"benchmark JSON {json_path}: energy_counter_end_mj {e1} is below "
            f"energy_counter_start_mj {e0} (the counter only grows); rerun its profile job"
        )
    return {
        "iterations": iterations,
        "total_time_s": total_time_s,
        "sigma_total_time_s": sigma_total_time_s,
        "time_s": total_time_s / iterations,  # (3.6)
        "sigma_time_s": sigma_total_time_s / iterations,  # (3.8)
        "window_s": end - start,
        "timed_start_unix_s": start,
        "timed_end_unix_s": end,
    }
