"""The fields of the benchmark record each profiling job writes, declared once.

``results/raw/{gpu}/{setting}/{mode}/{ops|networks}/{name}.json`` holds one record:
:data:`RECORD_FIELDS` gives each field's JSON types, range, unit and meaning, in the order
the evaluation checks them (:mod:`opcost.evaluate`). The profiling job writes
``schema_version`` :data:`RECORD_SCHEMA_VERSION`; docs/formats.md's record table is
generated from these fields (:mod:`opcost.schemas_doc`), as the table columns are from
:mod:`opcost.schemas`. Importing this module imports neither torch nor numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RecordField:
    """One field of a benchmark record: JSON types, range, unit and meaning.

    ``checked`` fields are read by the evaluation, which refuses a record whose value has
    another type or lies out of range; the others are written for people and provenance.
    """

    types: tuple[str, ...]  # "integer", "number" (finite), "string", "boolean", "object", "array"
    meaning: str
    unit: str = ""
    nullable: bool = True
    minimum: float | None = None  # least value allowed
    above: float | None = None  # values must be greater than this
    maximum: float | None = None  # greatest value allowed
    checked: bool = True


def _field(types: str, meaning: str, unit: str = "", **kw: Any) -> RecordField:
    return RecordField(tuple(types.split()), meaning, unit, **kw)


_COUNT = {"minimum": 1}
_NONNEGATIVE = {"minimum": 0}
_UNCHECKED = {"checked": False}

#: Current ``schema_version`` of the benchmark record.
RECORD_SCHEMA_VERSION = 1

#: The benchmark record ``results/raw/{gpu}/{setting}/{mode}/{ops|networks}/{name}.json``,
#: in the order the evaluation checks its fields. ``schema_version``, ``status`` and ``kind``
#: are checked first, with their own messages.
RECORD_FIELDS: dict[str, RecordField] = {
    "schema_version": _field("integer", f"{RECORD_SCHEMA_VERSION}", **_UNCHECKED),
    "status": _field("string", "`ok` or `failed`", **_UNCHECKED),
    "kind": _field("string", "`op` or `network`", **_UNCHECKED),
    "failure_reason": _field(
        "string", "why a failed measurement failed (e.g. `CUDA out of memory: ...`)"
    ),
    "gpu": _field("string", "GPU configuration, as in the path", nullable=False),
    "setting": _field("string", "GPU setting, as in the path", nullable=False),
    "mode": _field("string", "`inference` or `training`, as in the path", nullable=False),
    "op_id": _field("string", "the op measured (ops only)"),
    "model_input": _field("string", "the network measured (networks only)"),
    "spec": _field("object", "the op's spec (ops only)"),
    "device": _field("string", "`cuda` or `cpu`"),
    "dtype": _field("string", "numeric type of the GPU configuration"),
    "tf32": _field("boolean", "whether TF32 was allowed"),
    "cudnn_benchmark": _field(
        "boolean", "whether cuDNN timed its convolution algorithms (absent: it did not)"
    ),
    "power_available": _field("boolean", "whether a power log was taken"),
    "block_size": _field(
        "integer", "distinct instances cycled through in the timed loop", **_COUNT
    ),
    "number_per_run": _field(
        "integer", "iterations (calls of the op or network) per timed block", **_COUNT
    ),
    "warmup_iterations": _field(
        "integer", "untimed iterations before the timed region", **_NONNEGATIVE
    ),
    "requested_sm_clock_mhz": _field(
        "integer", "SM clock the setting locks (null unless `sm{MHz}`)", "MHz", **_COUNT
    ),
    "requested_power_limit_w": _field(
        "integer", "power limit the setting sets (null unless `pl{W}`)", "W", **_COUNT
    ),
    "power_interval_ms": _field(
        "integer", "nvidia-smi polling interval (GPU only)", "ms", **_COUNT
    ),
    "peak_memory_bytes": _field(
        "integer", "`torch.cuda.max_memory_allocated` during the job", "B", **_NONNEGATIVE
    ),
    "gpu_name": _field("string", "GPU name"),
    "gpu_uuid": _field("string", "the card's UUID"),
    "driver_version": _field("string", "NVIDIA driver"),
    "cuda_version": _field("string", "CUDA runtime of torch"),
    "torch_version": _field("string", "PyTorch version"),
    "host": _field("string", "host name"),
    "iterations": _field("integer", "N = len(block_times_s) * number_per_run", **_COUNT),
    "total_time_s": _field("number", "t_tot = sum(block_times_s)", "s", above=0),
    "sigma_total_time_s": _field(
        "number",
        "σ of t_tot: N times the sample std of the per-iteration block times",
        "s",
        **_NONNEGATIVE,
    ),
    "timed_start_unix_s": _field(
        "number", "wall clock (`time.time()`) at the start of the timed region", "s", **_NONNEGATIVE
    ),
    "timed_end_unix_s": _field(
        "number", "wall clock at the end of the timed region", "s", **_NONNEGATIVE
    ),
    # Local time minus UTC: time zones lie within -12 h and +14 h.
    "utc_offset_s": _field(
        "integer",
        "local time minus UTC, for nvidia-smi's local timestamps",
        "s",
        minimum=-12 * 3600,
        maximum=14 * 3600,
    ),
    "energy_counter_start_mj": _field(
        "integer",
        "NVML total-energy counter at the start of the timed region",
        "mJ",
        **_NONNEGATIVE,
    ),
    "energy_counter_end_mj": _field(
        "integer", "NVML total-energy counter at its end", "mJ", **_NONNEGATIVE
    ),
    "min_run_time_s": _field("number", "requested minimum timed duration", "s", **_UNCHECKED),
    "warmup_s": _field("number", "requested minimum warm-up duration", "s", **_UNCHECKED),
    "block_times_s": _field(
        "array", "wall duration of each timed block (raw replicates)", "s", **_UNCHECKED
    ),
    "backward": _field("boolean", "whether a backward pass was timed (training)", **_UNCHECKED),
    "calls_per_backward": _field(
        "integer",
        "training: calls whose outputs one backward pass covers (a chain, `opcost.harness`); "
        "0 without a backward pass",
        **_UNCHECKED,
    ),
    "inplace_substituted": _field(
        "boolean", "training: an in-place op was timed as its out-of-place form", **_UNCHECKED
    ),
    "power_fields": _field("array", "fields queried from nvidia-smi", **_UNCHECKED),
    "power_limit_default_w": _field(
        "number", "the card's default power limit (GPU only)", "W", **_UNCHECKED
    ),
    "python_version": _field("string", "Python version", **_UNCHECKED),
    "started_unix_s": _field("number", "job start", "s", **_UNCHECKED),
    "finished_unix_s": _field("number", "job end", "s", **_UNCHECKED),
    "device_lock_wait_s": _field(
        "number",
        "seconds the job waited for its device, held by another profiling job on this host "
        "(`opcost.device_lock`)",
        "s",
        **_UNCHECKED,
    ),
    "trace": _field(
        "object",
        "the trace the job recorded right after its timed window (CUDA configurations, "
        "config `profile.traces: in_profiling_jobs`): a trace record's figures, below",
        **_UNCHECKED,
    ),
}
#: Fields a record of ``status: ok`` must hold, not null.
REQUIRED_WHEN_OK = ("iterations", "total_time_s", "timed_start_unix_s", "timed_end_unix_s")
#: Record fields only a measurement on a CUDA GPU writes.
GPU_ONLY_FIELDS = ("power_interval_ms", "power_limit_default_w", "trace")
