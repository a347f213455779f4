"""What a study will measure, before anything is submitted: ops, measurements, batches, GPU-hours.

A dry run of the workflow cannot show the profiling jobs of a new study: they depend on
the op list, which a checkpoint builds. :func:`plan_study` extracts every model-input set
itself, on the meta device (seconds, no GPU, no Snakemake), and counts per GPU
configuration what the workflow's profiling rules would run: the same raw files
(:func:`opcost.workflow.raw_prefixes`), less those already in ``results/raw``.

The GPU-hours are an estimate: per measurement, ``warmup_s + min_run_time_s`` plus the
job overhead measured on the H100 and H200 runs (README: 0.27 s per job with the 0.2 s
warm-up, so :data:`JOB_OVERHEAD_S` beyond it), and per SLURM batch the start-up measured
on the test cluster (docs/slurm.md, "Batching"). Where the profiling jobs trace what they
measured (a CUDA configuration, config ``profile.traces: in_profiling_jobs``), each adds
the trace's mean time measured on the H100 and H200 (docs/results.md, "Traces and
replay": :data:`TRACE_OP_S`, :data:`TRACE_NETWORK_S`), and each batch the profiler's first
start (:data:`PROFILER_START_S`). A network's build or an op that cannot reach
``min_run_time_s`` in one block takes longer.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from opcost.config import Study, traced_in_job
from opcost.errors import OpcostError
from opcost.workflow import raw_prefixes

#: Seconds per profiling job beyond its warm-up and timed window (README: median overhead
#: 0.27 s per job on the H100 and H200, of which 0.2 s is the default warm-up).
JOB_OVERHEAD_S = 0.07
#: Seconds per SLURM batch before its first job (Python, Snakemake, torch, CUDA):
#: about 10 s on the test cluster (docs/slurm.md, "Measured overhead per operation").
BATCH_STARTUP_S = 10.0
#: Seconds a profiling job's trace adds, mean per op and per network (an op 0.07-0.10 s,
#: a network 2.0-2.6 s with its CUDA-graph window; experiments/trace_in_job_cost.py,
#: H100 and H200, 2026-11-26), and the profiler's first start in a process (3.4-6 s).
TRACE_OP_S = 0.09
TRACE_NETWORK_S = 2.5
PROFILER_START_S = 5.0
#: The profiling group's name in the profile's ``group-components``.
PROFILE_GROUP = "profile_{gpu}"


class PlanError(OpcostError, ValueError):
    """The plan cannot be made (a profile without a batch size); the message says why."""


@dataclass(frozen=True)
class ProfileBatching:
    """What the SLURM profile says about profiling batches."""

    batch_size: int
    #: SLURM time limit asked per job, minutes (the rules' ``runtime`` on attempt 1), or
    #: None where the profile does not set it.
    op_runtime_min: float | None = None
    network_runtime_min: float | None = None


@dataclass(frozen=True)
class GpuPlan:
    """The profiling a study needs on one GPU configuration."""

    gpu: str
    settings: int
    modes: int
    ops: int
    networks: int
    #: (ops + networks) x settings x modes: every raw measurement of the configuration.
    measurements: int
    #: Of those, already in results/raw (both the .json and the .csv).
    measured: int
    #: Of those still to run, op measurements and network measurements.
    missing_ops: int
    missing_networks: int
    batches: int
    gpu_hours: float
    #: SLURM time limit the batches ask for in all, hours (None without runtimes).
    requested_hours: float | None

    @property
    def missing(self) -> int:
        return self.missing_ops + self.missing_networks


def _runtime_min(profile: dict[str, Any], rule: str) -> float | None:
    expr = ((profile.get("set-resources") or {}).get(rule) or {}).get("runtime")
    if expr is None:
        return None
    try:
        # Snakemake evaluates resource values as Python with `attempt` in scope.
        return float(eval(str(expr), {"__builtins__": {}}, {"attempt": 1}))
    except Exception as e:
        raise PlanError(f"set-resources.{rule}.runtime: cannot evaluate {expr!r}: {e}") from e


def read_profile(path: str | Path, batch_size: int | None = None) -> ProfileBatching:
    """The batch size and per-job runtimes of a SLURM profile (a directory or its YAML).

    Args:
        path: the profile.
        batch_size: the batch size to use instead of the profile's; then a missing or
            unreadable profile only leaves the runtimes unknown.

    Raises:
        PlanError: the file is missing or unreadable, or sets no batch size for the
            profiling group (``group-components: [profile_{gpu}=N]``), and no
            ``batch_size`` was given.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.yaml"
    try:
        profile = yaml.safe_load(path.read_text()) or {}
        if not isinstance(profile, dict):
            raise PlanError(f"{path}: a profile must be a mapping; or give --batch-size")
    except (OSError, yaml.YAMLError, PlanError) as e:
        if batch_size is not None:
            return ProfileBatching(batch_size)
        if isinstance(e, PlanError):
            raise
        raise PlanError(f"{path}: cannot read the profile ({e}); or give --batch-size") from e
    size = batch_size
    for item in [] if size is not None else profile.get("group-components") or []:
        name, _, value = str(item).partition("=")
        if name.strip() == PROFILE_GROUP:
            try:
                size = int(value)
            except ValueError:
                size = None
    if size is None or size < 1:
        raise PlanError(
            f"{path}: no batch size for the profiling jobs (group-components: "
            f"{PROFILE_GROUP}=N); give --batch-size N"
        )
    return ProfileBatching(
        size, _runtime_min(profile, "profile_op"), _runtime_min(profile, "profile_network")
    )


def study_op_ids(study: Study) -> list[str]:
    """Every distinct op of the study, extracted as the workflow's extract rule does."""
    from opcost.extract import extract_model_input, unique_ops

    functional = bool(study.config["extract"]["functional_ops"])
    tables = [extract_model_input(mi, functional_ops=functional) for mi in study.model_inputs]
    return list(unique_ops(tables)["op_id"])


def _measured(root: Path, prefix: str) -> bool:
    return (root / f"{prefix}.json").is_file() and (root / f"{prefix}.csv").is_file()


def plan_study(
    study: Study,
    op_ids: list[str],
    batching: ProfileBatching,
    root: str | Path = ".",
) -> list[GpuPlan]:
    """What each GPU configuration of ``study`` has to measure, given its ops.

    Args:
        study: the loaded study.
        op_ids: its distinct ops (:func:`study_op_ids`).
        batching: batch size and runtimes (:func:`read_profile`).
        root: the workflow's working directory (where ``results/raw`` lies).
    """
    root = Path(root)
    profile = study.config["profile"]
    job_s = profile["warmup_s"] + profile["min_run_time_s"] + JOB_OVERHEAD_S
    plans = []
    for gpu, config in study.gpus.items():
        prefixes = raw_prefixes(study, gpu, op_ids)
        missing = [p for p in prefixes if not _measured(root, p)]
        missing_networks = sum(1 for p in missing if "/networks/" in p)
        missing_ops = len(missing) - missing_networks
        batches = math.ceil(len(missing) / batching.batch_size)
        traced = 0.0
        if traced_in_job(profile, config.device):
            traced = (
                missing_ops * TRACE_OP_S
                + missing_networks * TRACE_NETWORK_S
                + batches * PROFILER_START_S
            )
        requested = None
        if batching.op_runtime_min is not None and batching.network_runtime_min is not None:
            requested = (
                missing_ops * batching.op_runtime_min
                + missing_networks * batching.network_runtime_min
            ) / 60
        plans.append(
            GpuPlan(
                gpu=gpu,
                settings=len(config.settings),
                modes=len(study.modes),
                ops=len(op_ids),
                networks=len(study.model_inputs),
                measurements=len(prefixes),
                measured=len(prefixes) - len(missing),
                missing_ops=missing_ops,
                missing_networks=missing_networks,
                batches=batches,
                gpu_hours=(len(missing) * job_s + batches * BATCH_STARTUP_S + traced) / 3600,
                requested_hours=requested,
            )
        )
    return plans


def as_records(plans: list[GpuPlan]) -> list[dict[str, Any]]:
    """The plans as JSON-ready mappings (``missing`` included)."""
    return [{**asdict(p), "missing": p.missing} for p in plans]


def render_table(plans: list[GpuPlan]) -> str:
    """One row per GPU configuration, then a total row where there are several."""
    header = (
        "gpu",
        "settings",
        "ops",
        "networks",
        "measurements",
        "measured",
        "to run",
        "batches",
        "GPU-h (est.)",
        "time limit asked (h)",
    )
    rows = [
        (
            p.gpu,
            str(p.settings),
            str(p.ops),
            str(p.networks),
            str(p.measurements),
            str(p.measured),
            str(p.missing),
            str(p.batches),
            f"{p.gpu_hours:.2f}",
            "-" if p.requested_hours is None else f"{p.requested_hours:.1f}",
        )
        for p in plans
    ]
    if len(plans) > 1:
        asked = [p.requested_hours for p in plans]
        rows.append(
            (
                "total",
                "",
                "",
                "",
                str(sum(p.measurements for p in plans)),
                str(sum(p.measured for p in plans)),
                str(sum(p.missing for p in plans)),
                str(sum(p.batches for p in plans)),
                f"{sum(p.gpu_hours for p in plans):.2f}",
                "-" if None in asked else f"{sum(asked):.1f}",  # type: ignore[arg-type]
            )
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [header, *rows]
    ]
    return "\n".join(lines)
