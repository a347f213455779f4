"""The sweep runs behind the method figures: their config, record files and the fit.

Torch-free: the figures read the records with :func:`read_record`,
:func:`proportionality_table` and :func:`read_power_trace`; :func:`fit_proportionality`
finds where the runtime stops being proportional to the iterations (thesis 3.2.3). The
measuring itself is :mod:`opcost.sweep` (rules ``sweep_proportionality`` and
``sweep_power_trace``, workflow/rules/sweep.smk), which also exports all of this.

:class:`SweepConfig` is the config's ``sweep`` section; its defaults are the config
schema's. The method, the grid and the record files are described in docs/sweep.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opcost.config import ConfigError, GpuConfig, Study, schema_defaults
from opcost.errors import OpcostError
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
    """The ``sweep`` section of the config; build it with :meth:`from_config`."""

    gpu: str | None
    model: str
    input: tuple[int, ...]
    op_index: int
    mode: str
    shortest_run_s: float
    longest_run_s: float
    points: int
    short_points: int
    repeats: int
    idle_s: float
    run_s: float
    cycles: int
    overlay_runs: int

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None = None) -> SweepConfig:
        """Build from the config's ``sweep`` mapping (missing keys: the schema's defaults).

        Raises:
            ConfigError: an unknown key, or run times that are not 0 < shortest <= longest.
        """
        section = dict(section or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ConfigError(f"sweep: unknown keys {unknown}; known: {sorted(known)}")
        section = {**schema_defaults("sweep"), **section}
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
        """The requested minimum run times, shortest first (docs/sweep.md).

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
        cudnn_benchmark=bool(params.get("cudnn_benchmark", False)),
    )


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
    """Fit t_tot = a N and find where proportionality breaks (docs/sweep.md).

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
