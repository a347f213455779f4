"""Evaluate raw measurements: one benchmark JSON plus its ``nvidia-smi`` CSV -> one row.

The evaluate stage turns ``results/raw/{gpu}/{setting}/{mode}/{ops,networks}/{name}.json``
(with the ``.csv`` beside it) into ``results/dataset/{gpu}.parquet``, one row per successful
measurement, and ``results/dataset/{gpu}.failed.parquet`` (or wherever the workflow puts it),
one row per failed one. The method is thesis section 3.4, formulas (3.1)-(3.9).

Method
------
1. Read the log (:func:`opcost.powerlog.read_power_log`): rows with a non-numerical value in
   a used field are dropped and counted. Power is ``power.draw.instant`` where logged, else
   ``power.draw`` (on Ampere and newer ``power.draw`` is a one-second average that would
   smear the startup effect into the window); column ``power_field`` says which.
2. Cut the log to the timed window: ``timed_start_unix_s <= t <= timed_end_unix_s``, with
   ``t`` = the CSV's local timestamp minus the JSON's ``utc_offset_s``. The log must cover
   the window: a log whose usable rows start more than 3 polling intervals after the
   window's start or end more than that before its end, or a window longer than that
   without a usable row, raises :class:`opcost.powerlog.PowerLogError` naming the CSV.
3. Over the n samples W_i in the window: mean W̄ (3.1) and sample std σ_W (3.2, ddof 1);
   keep the samples with |W_i - W̄| <= 3 σ_W (3.3); their mean is ``power_w`` and their
   sample std ``sigma_power_w``.
4. E_tot = power_w · t_tot (3.4), σ_E = sigma_power_w · t_tot (3.5), and per iteration
   t = t_tot / N (3.6), e = E_tot / N (3.7), σ_t = σ_t_tot / N (3.8), σ_e = σ_E / N (3.9),
   with t_tot = ``total_time_s`` and σ_t_tot = ``sigma_total_time_s`` from the JSON.

Choices where the thesis is ambiguous
-------------------------------------
- *What a sample is.* Every usable row of the log in the window is a sample (the thesis:
  "n being the number of timestamps"), also when it repeats the previous reading because
  the GPU had not updated its power value yet (H100: a new ``power.draw.instant`` about
  every 100 ms, polled every 20 ms). With a fixed polling interval this weights each
  reading by how long it held, i.e. it is a time average. Repeats are not independent, so
  the standard error below counts distinct readings instead.
- *σ_W̄_filtered* in (3.5) is the spread (sample std, ddof 1) of the filtered samples, as
  the thesis's symbols and "standard deviation ... of the filtered power" say, not the
  error of the mean. The error of the mean is carried as well: ``sem_power_w`` =
  ``sigma_power_w`` / sqrt(number of distinct readings among the filtered samples), a run of
  identical consecutive readings counting once.
- *The filter* uses ``<=`` where the thesis writes ``<``. They differ only for a sample
  exactly 3σ away, which in practice happens only when all samples are equal (σ = 0):
  there ``<`` would drop every sample. The filter is applied once (not iterated), around
  the mean of all samples in the window. With a single sample there is no σ: the sample is
  kept, and both sigmas are NaN.
- *t_tot* is the JSON's ``total_time_s``, the sum of the timed blocks (what
  ``torch.utils.benchmark`` reports), not the window length ``timed_end - timed_start``,
  which also holds the harness's work between blocks; ``window_s`` carries the latter.
  The power samples are taken over the whole window.
- *σ_E* (3.5) holds the power spread only and neglects the error of t_tot, as the thesis
  does.
- *Distinct power updates* (``n_power_updates``) are runs of identical consecutive values
  of the power field in the window; two updates that happen to report the same value
  count once. A measurement with fewer than ``min_power_updates`` (default 10) is flagged
  ``low_power_samples``; its power values are kept but should not be used unflagged.
- *Coverage.* The profile stage's logger runs before, through and after the window (a
  logger that dies early fails its job). In the 7,401 committed real logs the first usable
  row comes before the window's start, the last at most 1.01 polling intervals before its
  end, and consecutive rows at most 2.25 intervals apart; the tolerance is 3 intervals. A
  log that misses more at an edge is not the window's log (cut, or a wrong clock or
  ``utc_offset_s``): evaluation fails. A window shorter than the tolerance may hold no
  sample (polls 20 ms apart, a 20 ms window): time stands, power is NaN, and the row is
  flagged ``low_power_samples``. A stretch of more than the tolerance without a usable row
  inside the window (rows dropped there) flags the row ``low_power_samples`` too.
- *Cross-checks* use all samples in the window, unfiltered: ``energy_integrated_j`` is the
  trapezoid integral of the power samples over their timestamps, plus the first and last
  reading held constant out to the window's edges; ``energy_nvml_j`` is the NVML energy
  counter's difference over the window. Both cover the window (``window_s``), not t_tot,
  and are divided by N.
- The local-to-UTC offset is taken once per job (``utc_offset_s``); a job across a
  daylight-saving change would be misplaced by an hour (and then fail: no row in window).

Dataset columns (``results/dataset/{gpu}.parquet``)
----------------------------------------------------
Identity and settings:

========================== ======== =====================================================
column                     unit     meaning
========================== ======== =====================================================
gpu                        --       GPU configuration (``h100``, ``h100-notf32``)
setting                    --       GPU setting: ``default``, ``sm{MHz}``, ``pl{W}``
mode                       --       ``inference`` or ``training``
kind                       --       ``op`` or ``network``
op_id                      --       16-hex-digit op id (null for networks)
model_input                --       model-input set (null for ops)
op_type                    --       the spec's ``type`` (null for networks)
spec                       --       canonical JSON spec, sorted keys (null for networks)
status                     --       always ``ok`` (failures are in the failure table)
device                     --       ``cuda`` or ``cpu``
dtype                      --       numeric type of the GPU configuration (``float32``)
tf32                       --       whether TF32 was allowed (bool)
block_size                 --       distinct instances cycled through in the timed loop
number_per_run             --       iterations per timed block
warmup_iterations          --       untimed iterations before the timed region
requested_sm_clock_mhz     MHz      SM clock the setting locks (null unless ``sm{MHz}``)
requested_power_limit_w    W        power limit the setting sets (null unless ``pl{W}``)
========================== ======== =====================================================

Time:

========================== ======== =====================================================
iterations                 --       N, timed iterations
total_time_s               s        t_tot, sum of the timed blocks (JSON)
sigma_total_time_s         s        σ of t_tot (JSON)
time_s                     s        t = t_tot / N, time per iteration (3.6)
sigma_time_s               s        σ_t = σ_t_tot / N (3.8)
window_s                   s        timed_end_unix_s - timed_start_unix_s
========================== ======== =====================================================

Power (NaN, or 0 for counts, for time-only measurements):

========================== ======== =====================================================
power_field                --       ``power.draw.instant`` or ``power.draw``; null if none
power_interval_ms          ms       nvidia-smi polling interval (null if not recorded)
n_rows_total               --       polls in the whole log (data lines, see powerlog)
n_rows_dropped             --       polls of the whole log dropped as unusable
n_power_samples            --       n, usable rows in the timed window
n_power_updates            --       distinct power readings in the window
n_filtered_out             --       samples removed by the 3σ filter (3.3)
power_unfiltered_w         W        W̄, mean of all samples in the window (3.1)
sigma_power_unfiltered_w   W        σ_W, their sample std (3.2)
power_w                    W        W̄_filtered, mean after the 3σ filter (3.3)
sigma_power_w              W        σ_W̄_filtered, sample std after the filter
sem_power_w                W        standard error of power_w (see choices)
low_power_samples          --       n_power_updates < min_power_updates, or a hole (bool)
========================== ======== =====================================================

Energy (NaN for time-only measurements):

========================== ======== =====================================================
energy_total_j             J        E_tot = power_w · total_time_s (3.4)
sigma_energy_total_j       J        σ_E = sigma_power_w · total_time_s (3.5)
energy_j                   J        e = E_tot / N, energy per iteration (3.7)
sigma_energy_j             J        σ_e = σ_E / N (3.9)
energy_nvml_j              J        NVML counter difference over the window / N
energy_integrated_j        J        integral of power over the window / N
========================== ======== =====================================================

Conditions, means over the samples in the window (NaN where not logged):

========================== ======== =====================================================
sm_clock_mhz               MHz      measured SM clock (``clocks.sm``)
mem_clock_mhz              MHz      measured memory clock (``clocks.mem``)
temperature_c              °C       GPU temperature (``temperature.gpu``)
power_limit_w              W        power limit (``power.limit``)
utilization_gpu_pct        %        GPU utilisation (``utilization.gpu``)
========================== ======== =====================================================

Provenance (from the JSON):

========================== ======== =====================================================
peak_memory_bytes          B        torch.cuda.max_memory_allocated (nullable int)
gpu_name                   --       e.g. ``NVIDIA H100 80GB HBM3``
gpu_uuid                   --       the card's UUID
driver_version             --       NVIDIA driver
cuda_version               --       CUDA runtime of torch
torch_version              --       PyTorch version
host                       --       host name
timed_start_unix_s         s        wall clock at the start of the timed region (UTC)
timed_end_unix_s           s        wall clock at its end (UTC)
json_path                  --       the benchmark JSON the row comes from
========================== ======== =====================================================

Failure table columns: ``gpu, setting, mode, kind, op_id, model_input, failure_reason,
json_path`` (strings; ``op_id``/``model_input`` null as above).
"""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opcost.errors import OpcostError
from opcost.powerlog import PowerLog, PowerLogError, read_power_log
from opcost.tables import write_parquet_atomic

#: Kind of measurement -> subfolder of ``results/raw/{gpu}/{setting}/{mode}``.
KIND_DIRS = {"op": "ops", "network": "networks"}
SCHEMA_VERSION = 1
#: Default threshold for ``low_power_samples``.
MIN_POWER_UPDATES = 10

_STR = "str" if int(pd.__version__.split(".")[0]) >= 3 else object

#: Dataset columns in order, with their dtype (units and meaning: module docstring).
DATASET_COLUMNS: dict[str, Any] = {
    "gpu": _STR,
    "setting": _STR,
    "mode": _STR,
    "kind": _STR,
    "op_id": _STR,
    "model_input": _STR,
    "op_type": _STR,
    "spec": _STR,
    "status": _STR,
    "device": _STR,
    "dtype": _STR,
    "tf32": "bool",
    "block_size": "Int64",
    "number_per_run": "Int64",
    "warmup_iterations": "Int64",
    "requested_sm_clock_mhz": "Int64",
    "requested_power_limit_w": "Int64",
    "iterations": "int64",
    "total_time_s": "float64",
    "sigma_total_time_s": "float64",
    "time_s": "float64",
    "sigma_time_s": "float64",
    "window_s": "float64",
    "power_field": _STR,
    "power_interval_ms": "Int64",
    "n_rows_total": "int64",
    "n_rows_dropped": "int64",
    "n_power_samples": "int64",
    "n_power_updates": "int64",
    "n_filtered_out": "int64",
    "power_unfiltered_w": "float64",
    "sigma_power_unfiltered_w": "float64",
    "power_w": "float64",
    "sigma_power_w": "float64",
    "sem_power_w": "float64",
    "low_power_samples": "bool",
    "energy_total_j": "float64",
    "sigma_energy_total_j": "float64",
    "energy_j": "float64",
    "sigma_energy_j": "float64",
    "energy_nvml_j": "float64",
    "energy_integrated_j": "float64",
    "sm_clock_mhz": "float64",
    "mem_clock_mhz": "float64",
    "temperature_c": "float64",
    "power_limit_w": "float64",
    "utilization_gpu_pct": "float64",
    "peak_memory_bytes": "Int64",
    "gpu_name": _STR,
    "gpu_uuid": _STR,
    "driver_version": _STR,
    "cuda_version": _STR,
    "torch_version": _STR,
    "host": _STR,
    "timed_start_unix_s": "float64",
    "timed_end_unix_s": "float64",
    "json_path": _STR,
}
FAILURE_COLUMNS = (
    "gpu",
    "setting",
    "mode",
    "kind",
    "op_id",
    "model_input",
    "failure_reason",
    "json_path",
)
# Log field -> dataset column of its window mean.
_CONDITION_COLUMNS = {
    "clocks.sm": "sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
    "temperature.gpu": "temperature_c",
    "power.limit": "power_limit_w",
    "utilization.gpu": "utilization_gpu_pct",
}
_NAN = float("nan")
#: A log must reach this many polling intervals of the timed window's edges (see
#: :func:`_check_coverage`).
COVERAGE_TOLERANCE_INTERVALS = 3


@dataclass(frozen=True)
class RecordField:
    """What one field of a benchmark record may hold: JSON types and a range."""

    types: tuple[str, ...]  # "integer", "number" (finite), "string", "boolean", "object"
    nullable: bool = True
    minimum: float | None = None  # least value allowed
    above: float | None = None  # values must be greater than this
    maximum: float | None = None  # greatest value allowed


_OPTIONAL_STR = RecordField(("string",))
_COUNT = RecordField(("integer",), minimum=1)
_NONNEGATIVE_INT = RecordField(("integer",), minimum=0)
_TIME_S = RecordField(("number",), minimum=0)
#: The benchmark-record fields the evaluation reads (docs/formats.md), checked when a
#: record is read; other fields are not. ``schema_version``, ``status`` and ``kind`` are
#: checked before, with their own messages.
RECORD_FIELDS: dict[str, RecordField] = {
    "failure_reason": _OPTIONAL_STR,
    "gpu": RecordField(("string",), nullable=False),
    "setting": RecordField(("string",), nullable=False),
    "mode": RecordField(("string",), nullable=False),
    "op_id": _OPTIONAL_STR,
    "model_input": _OPTIONAL_STR,
    "spec": RecordField(("object",)),
    "device": _OPTIONAL_STR,
    "dtype": _OPTIONAL_STR,
    "tf32": RecordField(("boolean",)),
    "power_available": RecordField(("boolean",)),
    "block_size": _COUNT,
    "number_per_run": _COUNT,
    "warmup_iterations": _NONNEGATIVE_INT,
    "requested_sm_clock_mhz": _COUNT,
    "requested_power_limit_w": _COUNT,
    "power_interval_ms": _COUNT,
    "peak_memory_bytes": _NONNEGATIVE_INT,
    "gpu_name": _OPTIONAL_STR,
    "gpu_uuid": _OPTIONAL_STR,
    "driver_version": _OPTIONAL_STR,
    "cuda_version": _OPTIONAL_STR,
    "torch_version": _OPTIONAL_STR,
    "host": _OPTIONAL_STR,
    "iterations": _COUNT,
    "total_time_s": RecordField(("number",), above=0),
    "sigma_total_time_s": _TIME_S,
    "timed_start_unix_s": _TIME_S,
    "timed_end_unix_s": _TIME_S,
    # Local time minus UTC: time zones lie within -12 h and +14 h.
    "utc_offset_s": RecordField(("integer",), minimum=-12 * 3600, maximum=14 * 3600),
    "energy_counter_start_mj": _NONNEGATIVE_INT,
    "energy_counter_end_mj": _NONNEGATIVE_INT,
}
#: Fields a record of ``status: ok`` must hold, not null.
REQUIRED_WHEN_OK = ("iterations", "total_time_s", "timed_start_unix_s", "timed_end_unix_s")
_JSON_TYPES = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and math.isfinite(v))
    ),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
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
            does not cover the timed window (see the module docstring).
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
        row.update(_time_only_power_columns())
    else:
        row.update(_power_columns(record, log, json_path, min_power_updates))
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
            rows.append(row)
    dataset = pd.DataFrame.from_records(rows, columns=list(DATASET_COLUMNS))
    dataset = dataset.astype(DATASET_COLUMNS)
    failed = pd.DataFrame.from_records(failures, columns=list(FAILURE_COLUMNS))
    failed = failed.astype(dict.fromkeys(FAILURE_COLUMNS, _STR))
    return dataset, failed


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


def _time_only_power_columns() -> dict[str, Any]:
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
            *_CONDITION_COLUMNS.values(),
        ),
        _NAN,
    )
    row.update(dict.fromkeys(("n_rows_total", "n_rows_dropped", "n_power_samples"), 0))
    row.update(n_power_updates=0, n_filtered_out=0, power_field=None, low_power_samples=False)
    return row


def _power_columns(
    record: dict[str, Any], log: PowerLog, json_path: Path, min_power_updates: int
) -> dict[str, Any]:
    start = float(record["timed_start_unix_s"])
    end = float(record["timed_end_unix_s"])
    utc_offset_s = _number(record, "utc_offset_s", json_path, required=True)
    # Compare in the log's own clock (local time as µs since the epoch), so that only the
    # window's two edges are converted, not every timestamp.
    local_us = log.samples["timestamp"].to_numpy("datetime64[us]").astype(np.int64)
    start_us = (start + utc_offset_s) * 1e6
    end_us = (end + utc_offset_s) * 1e6
    in_window = (local_us >= start_us) & (local_us <= end_us)
    n = int(in_window.sum())
    has_hole = _check_coverage(record, log, json_path, local_us / 1e6 - utc_offset_s, n)
    if n == 0:
        # The log spans the window, but the window is shorter than the coverage tolerance
        # and no poll fell inside. Time stands; power is unknown, and the row is flagged.
        row = _time_only_power_columns()
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
    for field, column in _CONDITION_COLUMNS.items():
        if field in log.samples:
            row[column] = _mean(log.samples[field].to_numpy(np.float64)[in_window])
        else:
            row[column] = _NAN
    return row


def _check_coverage(
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
