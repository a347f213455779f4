"""A measurement's trace (``opcost.tracing``) as dataset columns and breakdown rows.

A trace is recorded by the profiling job itself, after its timed window, in its benchmark
JSON (key ``trace``), or by a trace job of its own, beside its profiling pair:
``results/raw/{gpu}/{setting}/{mode}/traces/{ops|networks}/{name}.json`` for
``.../{ops|networks}/{name}.json`` (config ``profile.traces``). Where a measurement has
both, the one finished last counts (:func:`find_trace`). Its columns join the
measurement's dataset row (NaN where there is no trace, or it failed); a network's
per-op breakdown becomes rows of ``results/dataset/{gpu}.breakdown.parquet``
(:data:`opcost.schemas.BREAKDOWN`). No torch needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from opcost.errors import OpcostError

#: Trace record keys copied into the dataset as they are (seconds, counts).
_COPIED = (
    "gpu_time_s",
    "sigma_gpu_time_s",
    "forward_gpu_time_s",
    "gpu_busy_time_s",
    "forward_gpu_busy_time_s",
    "host_time_s",
    "sigma_host_time_s",
    "forward_host_time_s",
    "burst_wall_time_s",
    "sigma_burst_wall_time_s",
    "host_burst_steps",
    "traced_host_time_s",
    "traced_forward_host_time_s",
    "n_kernels",
    "forward_n_kernels",
    "launch_gap_s",
    "sync_s",
    "host_probe_s",
    "host_cpu",
    # A network with CUDA graphs (opcost.tracing.graph_figures), null for ops.
    "graph_time_s",
    "sigma_graph_time_s",
    "graph_energy_j",
    "graph_power_w",
    "graph_gpu_time_s",
    "graph_n_kernels",
    "graph_launch_gap_s",
    "graph_failure_reason",
)
#: Dataset column <- trace record key, where the names differ.
_RENAMED = {
    "trace_wall_time_s": "wall_time_s",
    "trace_number_per_run": "wall_number_per_run",
    "trace_host": "host",
}
TRACE_COLUMNS = (*_COPIED, *_RENAMED, "trace_json_path")


class TraceRecordError(OpcostError, ValueError):
    """A trace JSON that cannot be read: the message names it."""


def trace_path(json_path: str | Path) -> Path:
    """Where the trace of the measurement in ``json_path`` lies."""
    json_path = Path(json_path)
    return json_path.parent.parent / "traces" / json_path.parent.name / json_path.name


def read_trace(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TraceRecordError(f"trace {path} cannot be read ({e}); rerun its trace job") from e
    if not isinstance(record, dict) or record.get("status") not in ("ok", "failed"):
        raise TraceRecordError(f"trace {path} is not a finished trace record; rerun its trace job")
    return record


class Trace(NamedTuple):
    """A trace record and the JSON it lies in (a trace job's, or a benchmark JSON)."""

    record: dict[str, Any]
    path: Path


def embedded_trace(benchmark: dict[str, Any]) -> dict[str, Any] | None:
    """The trace a profiling job recorded in its benchmark record ``benchmark``, as a
    trace job's record reads (the job's header, then the trace's figures), else None."""
    trace = benchmark.get("trace")
    if not isinstance(trace, dict):
        return None
    header = {k: v for k, v in benchmark.items() if k != "trace"}
    return {**header, **trace}


def find_trace(json_path: str | Path) -> Trace | None:
    """The trace of the measurement whose benchmark JSON is ``json_path``: the one its
    profiling job recorded, or a trace job's beside it (:func:`trace_path`); where both
    exist, the one finished last (a study traced again on purpose). None without one."""
    json_path = Path(json_path)
    found = []
    separate = trace_path(json_path)
    if separate.exists():
        found.append(Trace(read_trace(separate), separate))
    try:
        benchmark = json.loads(json_path.read_text())
    except (OSError, ValueError):
        benchmark = None
    embedded = embedded_trace(benchmark) if isinstance(benchmark, dict) else None
    if embedded is not None:
        found.append(Trace(embedded, json_path))
    if not found:
        return None
    return max(found, key=lambda t: t.record.get("finished_unix_s") or 0.0)


def _as_trace(trace: Trace | str | Path | None) -> Trace | None:
    if trace is None or isinstance(trace, Trace):
        return trace
    if not Path(trace).exists():
        return None
    return Trace(read_trace(trace), Path(trace))


def trace_columns(trace: Trace | str | Path | None) -> dict[str, Any]:
    """The dataset columns of one trace (a :class:`Trace`, or a trace job's JSON; all
    None without a usable one)."""
    out: dict[str, Any] = dict.fromkeys(TRACE_COLUMNS)
    trace = _as_trace(trace)
    if trace is None or trace.record["status"] != "ok":
        return out
    record = trace.record
    for key in _COPIED:
        out[key] = record.get(key)
    for column, key in _RENAMED.items():
        out[column] = record.get(key)
    out["trace_json_path"] = str(trace.path)
    return out


def breakdown_rows(trace: Trace | str | Path) -> list[dict[str, Any]]:
    """A network trace's breakdown: one row per host span of its mean traced step."""
    found = _as_trace(trace)
    if found is None:
        raise TraceRecordError(f"trace {trace} cannot be read (no such file); rerun its trace job")
    record = found.record
    if record["status"] != "ok" or record.get("kind") != "network":
        return []
    rows = []
    for index, span in enumerate(record.get("breakdown") or []):
        rows.append(
            {
                "gpu": record["gpu"],
                "setting": record["setting"],
                "mode": record["mode"],
                "model_input": record["model_input"],
                "index": index,
                "phase": span["phase"],
                "label": span["label"],
                "call": span["call"],
                "op_id": span["op_id"],
                "host_s": span["host_s"],
                "gpu_s": span["gpu_s"],
                "gpu_busy_s": span.get("gpu_busy_s"),
                "n_kernels": span["n_kernels"],
            }
        )
    return rows


def network_rows(paths: list[str | Path]) -> list[dict[str, Any]]:
    """Dataset rows for network traces with no profiling pair (a trace job run alone, as
    ``experiments/graph_networks.py`` does): identity, the trace's columns, and NaN for the
    1-s window's ``time_s`` and ``energy_j``."""
    rows = []
    for path in paths:
        record = read_trace(path)
        identity = {k: record[k] for k in ("gpu", "setting", "mode", "model_input")}
        nan = float("nan")
        rows.append(
            {**identity, "kind": "network", "time_s": nan, "energy_j": nan, **trace_columns(path)}
        )
    return rows
