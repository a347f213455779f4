"""Dedicated measurement runs behind the method figures (thesis 3.2.3 and 3.3).

Two runs, each on one GPU configuration (``sweep.gpu``, default the study's first), at the
GPU setting ``default`` (the card as it is), with the harness and logging of the profile
stage (:mod:`opcost.harness`, :mod:`opcost.profile`, :mod:`opcost.nvsmi`):

*Proportionality* (thesis 3.2.3, figure 3.1). The harness computes the time per iteration
as t_tot / N (3.6), which assumes that the total runtime of the timed region is
proportional to the number of iterations. The sweep measures one operation (operation
``sweep.op_index`` of ``sweep.model`` at ``sweep.input``) with the harness's minimum run
time set to each value of a grid, ``sweep.repeats`` times (repeats interleaved, so that a
drift does not line up with the run time), and records the iterations N and total runtime
t_tot of every measurement. The grid (:meth:`SweepConfig.run_times_s`) has ``sweep.points``
run times evenly spaced up to ``sweep.longest_run_s`` (the linear part, iterations evenly
spaced as in the thesis) and ``sweep.short_points`` run times spaced geometrically from
``sweep.shortest_run_s`` up to the linear part (where proportionality may break).
:func:`fit_proportionality` then finds where it breaks, as the thesis does:

1. fit t_tot = a N to the 6/7 of the measurements with the most iterations, by least
   squares on relative residuals r_i = t_i / (a N_i) - 1 (a fit through the origin, since
   proportionality is what (3.6) assumes; relative, since the spread of a timed loop grows
   with its length and absolute residuals would let the longest runs decide alone);
2. σ = sample std of the fitted measurements' relative residuals;
3. outliers: measurements with |r_i| > 5 σ; the threshold is the largest total runtime
   among them (no outlier: NaN). Below it, t_tot / N is not the time per iteration.

The rule of step 1 works only if at least 6/7 of the measurements lie in the linear
regime: the default grid (24 linear, 4 short points) is sized for that. A grid geometric
over the whole range would put about half of the points where fixed per-block costs
(synchronisation, timer) still matter; they would inflate σ and hide every outlier.

*Power trace* (thesis 3.3). One ``nvidia-smi`` log (:class:`opcost.nvsmi.PowerLogger`) over
``sweep.cycles`` cycles of idle (``sweep.idle_s``) and a benchmark run of the same
operation (``sweep.run_s`` of timed work after the profile stage's warm-up), a final idle,
and then ``sweep.overlay_runs`` benchmark runs back to back, which show the startup effect
of each run and the 3σ channel of (3.3). The log is read only after the logger stopped
(``nvidia-smi`` buffers ``-f`` output until it exits).

On the CPU both runs measure time only; the power trace's CSV is then the profile stage's
``# no power log`` placeholder and the figures say so.

Files (``results/sweep/{gpu}/``):

- ``proportionality.json``: ``schema_version``, ``kind`` (``proportionality``), the GPU
  configuration, device, op (``op_id``, ``op_type``, ``spec``), ``mode``, provenance,
  ``device_lock_wait_s`` (a sweep holds its device's lock, as a profiling job does), and
  ``measurements``: one object per measurement with ``repeat``, ``min_run_time_s``
  (requested), ``iterations``, ``number_per_run``, ``block_times_s``, ``total_time_s``,
  ``warmup_iterations``, ``timed_start_unix_s``, ``timed_end_unix_s``.
- ``power_trace.csv``: the raw ``nvidia-smi`` log, untouched (docs/formats.md).
- ``power_trace.json``: as above with ``kind`` ``power_trace``, the profile stage's power
  keys (``power_available``, ``power_fields``, ``power_interval_ms``, ``utc_offset_s``, GPU
  identity), and ``events``: one object per phase with ``part`` (``alternating`` or
  ``overlay``), ``index``, ``phase`` (``idle`` or ``run``), ``start_unix_s``,
  ``end_unix_s`` and, for runs, ``timed_start_unix_s``, ``timed_end_unix_s``,
  ``iterations``, ``total_time_s``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opcost import harness, profile
from opcost.config import ConfigError, GpuConfig, Study
from opcost.errors import OpcostError
from opcost.io import write_json_atomic
from opcost.names import ModelInput, parse_setting
from opcost.powerlog import read_power_log

SCHEMA_VERSION = 1
#: Share of the measurements, those with the most iterations, that the line is fitted to.
FIT_FRACTION = 6 / 7
#: A measurement this many σ off the fitted line breaks proportionality.
OUTLIER_SIGMAS = 5.0


class SweepError(OpcostError, RuntimeError):
    """A sweep cannot run or its files cannot be read; the message says what to do."""


@dataclass(frozen=True)
class SweepConfig:
    """The ``sweep`` section of the config (defaults as in the config schema)."""

    gpu: str | None = None
    model: str = "resnet18"
    input: tuple[int, ...] = (32, 3, 224, 224)
    op_index: int = 0
    mode: str = "inference"
    shortest_run_s: float = 1e-5
    longest_run_s: float = 1.0
    points: int = 24
    short_points: int = 4
    repeats: int = 3
    idle_s: float = 2.0
    run_s: float = 2.0
    cycles: int = 3
    overlay_runs: int = 5

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> SweepConfig:
        """Build from the config's ``sweep`` mapping (missing keys take the defaults).

        Raises:
            ConfigError: an unknown key, or run times that are not 0 < shortest <= longest.
        """
        section = dict(section or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ConfigError(f"sweep: unknown keys {unknown}; known: {sorted(known)}")
        if "input" in section:
            section["input"] = tuple(int(d) for d in section["input"])
        cfg = cls(**section)
        if not 0 < cfg.shortest_run_s <= cfg.longest_run_s:
            raise ConfigError(
                f"sweep: need 0 < shortest_run_s <= longest_run_s, got {cfg.shortest_run_s} "
                f"and {cfg.longest_run_s}"
            )
        minimum = {"points": 3, "short_points": 0, "repeats": 1, "cycles": 1, "overlay_runs": 1}
        for key, low in minimum.items():
            value = getattr(cfg, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"sweep.{key}: expected an integer >= {low}, got {value!r}")
        if cfg.mode not in ("inference", "training"):
            raise ConfigError(f"sweep.mode: expected inference or training, got {cfg.mode!r}")
        return cfg

    @property
    def model_input(self) -> ModelInput:
        return ModelInput(self.model, self.input)

    def run_times_s(self) -> list[float]:
        """The requested minimum run times, shortest first (module docstring).

        ``short_points`` values geometric from ``shortest_run_s`` up to (not including) the
        first linear value, then ``points`` values evenly spaced from
        ``longest_run_s / points`` to ``longest_run_s``.
        """
        step = self.longest_run_s / self.points
        linear = [step * (k + 1) for k in range(self.points)]
        if self.short_points == 0 or self.shortest_run_s >= step:
            return linear
        short = np.geomspace(self.shortest_run_s, step, self.short_points + 1)[:-1]
        return [float(t) for t in short] + linear


def sweep_gpu(study: Study, cfg: SweepConfig) -> str:
    """The GPU configuration the sweeps run on: ``sweep.gpu``, else the study's first.

    Raises:
        ConfigError: ``sweep.gpu`` names no GPU configuration of the study.
    """
    if cfg.gpu is None:
        return next(iter(study.gpus))
    if cfg.gpu not in study.gpus:
        raise ConfigError(
            f"sweep.gpu: {cfg.gpu!r} is not a GPU configuration of this study "
            f"({', '.join(study.gpus)}); name one of them, or null for the first"
        )
    return cfg.gpu


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


@dataclass(frozen=True)
class ProportionalityFit:
    """Result of :func:`fit_proportionality`; arrays follow the input order.

    Attributes:
        time_per_iteration_s: a, the fitted slope of t_tot = a N.
        sigma_rel: σ of the fitted measurements' relative residuals.
        residual_rel: r_i = t_i / (a N_i) - 1 for every measurement.
        fitted: which measurements the line was fitted to.
        outlier: which measurements lie more than ``outlier_sigmas`` σ off the line.
        threshold_s: the largest total runtime of an outlier (NaN if there is none):
            below it proportionality breaks.
    """

    time_per_iteration_s: float
    sigma_rel: float
    residual_rel: np.ndarray
    fitted: np.ndarray
    outlier: np.ndarray
    threshold_s: float
    outlier_sigmas: float


def fit_proportionality(
    iterations: Sequence[int] | np.ndarray,
    total_time_s: Sequence[float] | np.ndarray,
    *,
    fit_fraction: float = FIT_FRACTION,
    outlier_sigmas: float = OUTLIER_SIGMAS,
) -> ProportionalityFit:
    """Fit t_tot = a N and find where proportionality breaks (module docstring).

    Minimising sum_i (t_i - a N_i)^2 / t_i^2 gives a = sum(N_i / t_i) / sum(N_i^2 / t_i^2).

    Raises:
        SweepError: fewer than 3 measurements are fitted, or a time is not positive.
    """
    n = np.asarray(iterations, dtype=float)
    t = np.asarray(total_time_s, dtype=float)
    if n.shape != t.shape or np.any(t <= 0) or np.any(n <= 0):
        raise SweepError("fit_proportionality needs positive iterations and times, pairwise")
    order = np.argsort(-n, kind="stable")
    n_fit = math.ceil(fit_fraction * len(n))
    if n_fit < 3:
        raise SweepError(
            f"{len(n)} measurements are too few to fit; raise sweep.points or sweep.repeats"
        )
    fitted = np.zeros(len(n), dtype=bool)
    fitted[order[:n_fit]] = True
    nf, tf = n[fitted], t[fitted]
    slope = float(np.sum(nf / tf) / np.sum(nf**2 / tf**2))
    residual = t / (slope * n) - 1
    sigma = float(np.std(residual[fitted], ddof=1))
    outlier = np.abs(residual) > outlier_sigmas * sigma
    threshold = float(t[outlier].max()) if outlier.any() else math.nan
    return ProportionalityFit(slope, sigma, residual, fitted, outlier, threshold, outlier_sigmas)


def power_trace_schedule(
    workload: harness.Workload,
    opts: harness.HarnessOptions,
    cfg: SweepConfig,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> list[dict[str, Any]]:
    """Alternate idle and benchmark runs, then run back to back (module docstring).

    Each run is :func:`opcost.harness.measure` with ``min_run_time_s = cfg.run_s``, so it
    includes the harness's warm-up.

    Returns:
        The events, in order (see the module docstring for their keys).
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


def gpu_config(name: str, params: Mapping[str, Any]) -> GpuConfig:
    """The GPU configuration a sweep rule names (``params``: :func:`opcost.workflow.gpu_params`).

    The sweeps run at the setting ``default``: the card as it is.
    """
    return GpuConfig(
        name=name,
        device=params["device"],
        tf32=bool(params["tf32"]),
        dtype=params["dtype"],
        settings=(parse_setting("default"),),
        slurm_gpu_model=None,
        slurm_constraint=None,
    )


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


def read_record(json_path: str | Path, kind: str) -> dict[str, Any]:
    """A sweep's JSON record, checked for its kind and schema version.

    Raises:
        SweepError: unreadable, another kind, or another schema version.
    """
    try:
        record = json.loads(Path(json_path).read_text())
    except (OSError, ValueError) as e:
        raise SweepError(
            f"sweep record {json_path} cannot be read ({e}); rerun its sweep rule"
        ) from e
    if not isinstance(record, dict) or record.get("kind") != kind:
        raise SweepError(f"{json_path} is not a {kind} record; rerun the sweep_{kind} rule")
    if record.get("schema_version") != SCHEMA_VERSION:
        raise SweepError(
            f"{json_path} has schema_version {record.get('schema_version')!r}, this opcost "
            f"reads {SCHEMA_VERSION}; rerun the sweep_{kind} rule"
        )
    return record


def proportionality_table(record: Mapping[str, Any]) -> pd.DataFrame:
    """One row per measurement: ``repeat``, ``min_run_time_s``, ``iterations``,
    ``total_time_s``, ``time_per_iteration_s`` (t_tot / N)."""
    rows = [
        {k: m[k] for k in ("repeat", "min_run_time_s", "iterations", "total_time_s")}
        for m in record["measurements"]
    ]
    table = pd.DataFrame(rows, columns=["repeat", "min_run_time_s", "iterations", "total_time_s"])
    table["time_per_iteration_s"] = table["total_time_s"] / table["iterations"]
    return table


@dataclass(frozen=True)
class PowerTrace:
    """A power trace: its record and, where power was measured, its samples.

    Attributes:
        record: the JSON record (events, provenance).
        samples: None without power (CPU); else one row per usable log line with
            ``unix_s`` (UTC seconds), ``power_w`` (the log's power field) and the other
            logged fields by query name (``clocks.sm``, ...).
        power_field: ``power.draw.instant`` or ``power.draw``; None without power.
    """

    record: dict[str, Any]
    samples: pd.DataFrame | None
    power_field: str | None

    @property
    def events(self) -> pd.DataFrame:
        columns = [
            "part",
            "index",
            "phase",
            "start_unix_s",
            "end_unix_s",
            "timed_start_unix_s",
            "timed_end_unix_s",
            "iterations",
            "total_time_s",
        ]
        return pd.DataFrame(self.record.get("events", []), columns=columns)


def read_power_trace(csv_path: str | Path, json_path: str | Path) -> PowerTrace:
    """The power-trace sweep's CSV and JSON, the CSV's local timestamps turned into UTC.

    Raises:
        SweepError: the JSON cannot be read (see :func:`read_record`).
        PowerLogError: the CSV is unusable.
    """
    record = read_record(json_path, "power_trace")
    log = read_power_log(csv_path) if record.get("power_available") else None
    if log is None:
        return PowerTrace(record, None, None)
    samples = log.samples.copy()
    local_s = samples["timestamp"].to_numpy("datetime64[us]").astype(np.int64) / 1e6
    samples.insert(0, "unix_s", local_s - float(record.get("utc_offset_s", 0)))
    samples["power_w"] = samples[log.power_field]
    return PowerTrace(record, samples, log.power_field)
