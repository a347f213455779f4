"""Measure the sweep runs behind the method figures (thesis 3.2.3 and 3.3).

Both run on one GPU configuration at the setting ``default``, alone on their device, with
the profile stage's harness and power logging, and write the records that
:mod:`opcost.sweep_record` reads (docs/sweep.md). The torch-free names of that module
(:class:`SweepConfig`, :func:`read_record`, ...) are exported here too. The two runs:

- :func:`run_proportionality`: one operation measured with the harness's minimum run time
  set to each value of :meth:`opcost.sweep.SweepConfig.run_times_s`, ``repeats`` times
  (rule ``sweep_proportionality``);
- :func:`run_power_trace`: one ``nvidia-smi`` log over alternating idle and benchmark
  runs, then runs back to back (rule ``sweep_power_trace``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from opcost import harness, profile
from opcost.config import GpuConfig
from opcost.io import write_json_atomic
from opcost.names import parse_setting
from opcost.sweep_record import (
    FIT_FRACTION,
    OUTLIER_SIGMAS,
    SCHEMA_VERSION,
    PowerTrace,
    ProportionalityFit,
    SweepConfig,
    SweepError,
    fit_proportionality,
    gpu_config,
    proportionality_table,
    read_power_trace,
    read_record,
    sweep_gpu,
)

__all__ = [
    "FIT_FRACTION",
    "OUTLIER_SIGMAS",
    "SCHEMA_VERSION",
    "PowerLogContext",
    "PowerTrace",
    "ProportionalityFit",
    "SweepConfig",
    "SweepError",
    "fit_proportionality",
    "gpu_config",
    "power_trace_schedule",
    "proportionality_sweep",
    "proportionality_table",
    "read_power_trace",
    "read_record",
    "run_power_trace",
    "run_proportionality",
    "sweep_gpu",
    "sweep_op",
]


def sweep_op(cfg: SweepConfig) -> tuple[str, dict[str, Any]]:
    """The swept operation: ``(op_id, spec)`` of op ``cfg.op_index`` of the network.

    Operations are numbered in the order in which the forward pass first runs them
    (:func:`opcost.extract.extract_model_input`), so 0 is the first layer.

    Raises:
        SweepError: the network has fewer operations than ``op_index + 1``.
    """
    from opcost.extract import extract_model_input

    table = extract_model_input(cfg.model_input)
    if not 0 <= cfg.op_index < len(table):
        raise SweepError(
            f"sweep.op_index {cfg.op_index}: {cfg.model_input.name} has {len(table)} distinct "
            f"operations (0 to {len(table) - 1}); pick one of them"
        )
    row = table.iloc[cfg.op_index]
    return str(row["op_id"]), json.loads(row["spec"])


def proportionality_sweep(
    workload: harness.Workload,
    opts: harness.HarnessOptions,
    run_times_s: Sequence[float],
    repeats: int,
) -> list[dict[str, Any]]:
    """Measure ``workload`` once per requested minimum run time and repeat.

    Each measurement is :func:`opcost.harness.measure` with ``min_run_time_s`` replaced,
    so the iterations follow from the harness's own stopping rule.
    """
    measurements = []
    for repeat in range(repeats):
        for min_run_time_s in run_times_s:
            timing = harness.measure(
                workload, dataclasses.replace(opts, min_run_time_s=float(min_run_time_s))
            )
            measurements.append(
                {
                    "repeat": repeat,
                    "min_run_time_s": float(min_run_time_s),
                    "iterations": timing.iterations,
                    "number_per_run": timing.number_per_run,
                    "block_times_s": list(timing.block_times_s),
                    "total_time_s": timing.total_time_s,
                    "warmup_iterations": timing.warmup_iterations,
                    "timed_start_unix_s": timing.timed_start_unix_s,
                    "timed_end_unix_s": timing.timed_end_unix_s,
                }
            )
    return measurements


def power_trace_schedule(
    workload: harness.Workload,
    opts: harness.HarnessOptions,
    cfg: SweepConfig,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> list[dict[str, Any]]:
    """Alternate idle and benchmark runs, then run back to back (docs/sweep.md).

    Each run is :func:`opcost.harness.measure` with ``min_run_time_s = cfg.run_s``, so it
    includes the harness's warm-up.

    Returns:
        The events, in order (docs/sweep.md lists their keys).
    """
    run_opts = dataclasses.replace(opts, min_run_time_s=cfg.run_s)
    events: list[dict[str, Any]] = []

    def idle(part: str, index: int) -> None:
        start = clock()
        sleep(cfg.idle_s)
        events.append(
            {
                "part": part,
                "index": index,
                "phase": "idle",
                "start_unix_s": start,
                "end_unix_s": clock(),
            }
        )

    def run(part: str, index: int) -> None:
        start = clock()
        timing = harness.measure(workload, run_opts)
        events.append(
            {
                "part": part,
                "index": index,
                "phase": "run",
                "start_unix_s": start,
                "end_unix_s": clock(),
                "timed_start_unix_s": timing.timed_start_unix_s,
                "timed_end_unix_s": timing.timed_end_unix_s,
                "iterations": timing.iterations,
                "total_time_s": timing.total_time_s,
            }
        )

    for k in range(cfg.cycles):
        idle("alternating", k)
        run("alternating", k)
    idle("alternating", cfg.cycles)
    for k in range(cfg.overlay_runs):
        run("overlay", k)
    return events


PowerLogContext = Callable[..., AbstractContextManager[Any]]


def _prepare(
    kind: str, gpu: GpuConfig, profile_config: Mapping[str, Any], cfg: SweepConfig
) -> tuple[dict[str, Any], harness.Workload, harness.HarnessOptions]:
    """The record's common keys, and the swept operation's workload and options."""
    opts = profile.options_for(gpu, cfg.mode, dict(profile_config))
    op_id, spec = sweep_op(cfg)
    record = profile.record_header(kind, gpu.name, "default", opts, SCHEMA_VERSION)
    record.update(
        model_input=cfg.model_input.name,
        op_index=cfg.op_index,
        op_id=op_id,
        op_type=spec.get("type"),
        spec=spec,
        sweep=dataclasses.asdict(cfg),
    )
    harness.configure_numerics(opts)
    workload = harness.prepare_op(spec, opts)
    record["block_size"] = workload.block_size
    return record, workload, opts


def run_proportionality(
    gpu: GpuConfig, profile_config: Mapping[str, Any], cfg: SweepConfig, json_path: str | Path
) -> dict[str, Any]:
    """The proportionality sweep on GPU configuration ``gpu``; writes and returns the record.

    Args:
        gpu: where to measure (device, dtype, TF32).
        profile_config: the config's ``profile`` section (warm-up, block size).
        cfg: the sweep.
        json_path: the record to write (atomically).
    """
    # Alone on its GPU, as a profiling job is, also next to a profiling run of the study.
    with profile.device_to_itself(profile.resolve_device(gpu.device)) as lock_wait_s:
        record, workload, opts = _prepare("proportionality", gpu, profile_config, cfg)
        record["device_lock_wait_s"] = round(lock_wait_s, 3)
        record["measurements"] = proportionality_sweep(
            workload, opts, cfg.run_times_s(), cfg.repeats
        )
        record["finished_unix_s"] = time.time()
    write_json_atomic(json_path, record)
    return record


def run_power_trace(
    gpu: GpuConfig,
    profile_config: Mapping[str, Any],
    cfg: SweepConfig,
    csv_path: str | Path,
    json_path: str | Path,
    *,
    power_log: PowerLogContext | None = None,
) -> dict[str, Any]:
    """The power trace on GPU configuration ``gpu``; writes the CSV and JSON, returns the record.

    Args:
        gpu, profile_config, cfg: as :func:`run_proportionality`; ``profile_config`` also
            gives the polling interval and the GPU-setting command.
        csv_path: the raw ``nvidia-smi`` log to write (on the CPU: the placeholder).
        json_path: the record to write, after the log.
        power_log: the logging context, called as the profile stage calls its own
            (``(csv_path, device, setting, profile_config, record)``, yielding a reader of
            the energy counter); default :func:`opcost.profile.power_log`. Tests pass one
            that runs the fake ``nvidia-smi``.
    """
    power_log = power_log or profile.power_log
    # Alone on its GPU, as a profiling job is, also next to a profiling run of the study.
    with profile.device_to_itself(profile.resolve_device(gpu.device)) as lock_wait_s:
        record, workload, opts = _prepare("power_trace", gpu, profile_config, cfg)
        record["device_lock_wait_s"] = round(lock_wait_s, 3)
        with power_log(
            Path(csv_path), opts.device, parse_setting("default"), dict(profile_config), record
        ):
            record["events"] = power_trace_schedule(workload, opts, cfg)
        record["finished_unix_s"] = time.time()
    write_json_atomic(json_path, record)
    return record
