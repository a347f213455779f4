"""The columns of each table the pipeline writes, declared once.

Each :class:`Table` lists its columns (name, dtype, unit, meaning) in file order (the
benchmark record's fields are declared in :mod:`opcost.record_schema`). Writers build
their tables from these declarations, readers check against them, and the tables in
``docs/formats.md`` are generated from them (:mod:`opcost.schemas_doc`): after a change
here, run

    python -m opcost.schemas_doc docs/formats.md

(``tests/test_schemas.py`` fails while the page and this module disagree). Importing this
module imports neither torch nor numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Pandas dtype names a column may have; ``str`` is pandas' string dtype.
DTYPES = ("str", "bool", "int64", "Int64", "float64")


@dataclass(frozen=True)
class Column:
    """One column of a table file."""

    name: str
    dtype: str  # one of DTYPES; Int64 is a nullable integer
    unit: str  # "" for none
    meaning: str  # Markdown
    group: str = ""  # heading of the group the column opens, in the docs


@dataclass(frozen=True)
class Table:
    """A table file: its path pattern and its columns, in file order."""

    key: str  # names the table's block in docs/formats.md
    path: str
    columns: tuple[Column, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def dtypes(self) -> dict[str, Any]:
        """Column -> pandas dtype, for ``DataFrame.astype``."""
        return {c.name: pandas_dtype(c.dtype) for c in self.columns}


def pandas_dtype(name: str) -> Any:
    """The pandas dtype of a :data:`DTYPES` name."""
    if name != "str":
        return name
    import pandas as pd

    # pandas 3 has a string dtype named "str"; before, strings are objects.
    return "str" if int(pd.__version__.split(".")[0]) >= 3 else object


def _col(name: str, dtype: str, unit: str, meaning: str, group: str = "") -> Column:
    return Column(name, dtype, unit, meaning, group)


#: The dataset's trace columns (``opcost.tracing``, ``opcost.trace_eval``).
TRACE_DATASET_COLUMNS = (
    _col(
        "gpu_time_s",
        "float64",
        "s",
        "GPU kernel time per call: its kernels' durations summed (trace)",
        "Trace (null without one: CPU configurations, data traced before)",
    ),
    _col("sigma_gpu_time_s", "float64", "s", "σ of gpu_time_s over the traced steps"),
    _col("forward_gpu_time_s", "float64", "s", "its forward pass's share (training)"),
    _col("gpu_busy_time_s", "float64", "s", "time the GPU is busy with them: their union"),
    _col("forward_gpu_busy_time_s", "float64", "s", "its forward pass's share (training)"),
    _col("host_time_s", "float64", "s", "host time per call, untraced, queue never full"),
    _col("sigma_host_time_s", "float64", "s", "σ of host_time_s over the bursts"),
    _col("forward_host_time_s", "float64", "s", "its forward pass's share (training)"),
    _col("burst_wall_time_s", "float64", "s", "wall time per call of those bursts, synced"),
    _col("sigma_burst_wall_time_s", "float64", "s", "σ of burst_wall_time_s over the bursts"),
    _col("host_burst_steps", "Int64", "", "steps per host burst"),
    _col("traced_host_time_s", "float64", "s", "host time per call under the profiler"),
    _col("traced_forward_host_time_s", "float64", "s", "its forward pass's share"),
    _col("n_kernels", "float64", "", "device kernels, copies and sets per call"),
    _col("forward_n_kernels", "float64", "", "their forward pass's share"),
    _col("launch_gap_s", "float64", "s", "median idle gap between two queued kernels"),
    _col("sync_s", "float64", "s", "a synchronisation with an idle device, host side"),
    _col("host_probe_s", "float64", "s", "host-speed probe: 200 small dispatches issued"),
    _col("host_cpu", "str", "", "the trace host's CPU model"),
    _col(
        "graph_time_s",
        "float64",
        "s",
        "a network's step replayed from a CUDA graph: time per step",
        "Trace, CUDA graphs (networks on a GPU; null for ops and where capture failed)",
    ),
    _col("sigma_graph_time_s", "float64", "s", "σ of graph_time_s over the timed blocks"),
    _col(
        "graph_energy_j",
        "float64",
        "J",
        "energy per step (NVML counter, a ~1-s window between two of its changes)",
    ),
    _col("graph_power_w", "float64", "W", "graph_energy_j / graph_time_s"),
    _col("graph_gpu_time_s", "float64", "s", "kernel time per step of traced replays"),
    _col("graph_n_kernels", "float64", "", "kernels per step of traced replays"),
    _col("graph_launch_gap_s", "float64", "s", "median idle gap between two graph kernels"),
    _col("graph_failure_reason", "str", "", "why the step could not be captured"),
    _col(
        "trace_wall_time_s",
        "float64",
        "s",
        "time per call beside the trace: the profiling job's window, or a trace job's loop",
    ),
    _col("trace_number_per_run", "Int64", "", "calls per timed block of that loop"),
    _col("trace_host", "str", "", "host name of the job that traced"),
    _col(
        "trace_json_path",
        "str",
        "",
        "the JSON these columns come from: the benchmark JSON, or a trace job's",
    ),
)

DATASET = Table(
    "dataset",
    "results/dataset/{gpu}.parquet",
    (
        _col(
            "gpu", "str", "", "GPU configuration (`h100`, `h100-notf32`)", "Identity and settings"
        ),
        _col("setting", "str", "", "GPU setting: `default`, `sm{MHz}`, `pl{W}`"),
        _col("mode", "str", "", "`inference` or `training`"),
        _col("kind", "str", "", "`op` or `network`"),
        _col("op_id", "str", "", "16-hex-digit op id (null for networks)"),
        _col("model_input", "str", "", "model-input set (null for ops)"),
        _col("op_type", "str", "", "the spec's `type` (null for networks)"),
        _col("spec", "str", "", "canonical JSON spec, sorted keys (null for networks)"),
        _col("status", "str", "", "always `ok` (failures are in the failure table)"),
        _col("device", "str", "", "`cuda` or `cpu`"),
        _col("dtype", "str", "", "numeric type of the GPU configuration (`float32`)"),
        _col("tf32", "bool", "", "whether TF32 was allowed"),
        _col("block_size", "Int64", "", "distinct instances cycled through in the timed loop"),
        _col("number_per_run", "Int64", "", "iterations per timed block"),
        _col("warmup_iterations", "Int64", "", "untimed iterations before the timed region"),
        _col(
            "requested_sm_clock_mhz",
            "Int64",
            "MHz",
            "SM clock the setting locks (null unless `sm{MHz}`)",
        ),
        _col(
            "requested_power_limit_w",
            "Int64",
            "W",
            "power limit the setting sets (null unless `pl{W}`)",
        ),
        _col("iterations", "int64", "", "N, timed iterations", "Time"),
        _col("total_time_s", "float64", "s", "t_tot, sum of the timed blocks (JSON)"),
        _col("sigma_total_time_s", "float64", "s", "σ of t_tot (JSON)"),
        _col("time_s", "float64", "s", "t = t_tot / N, time per iteration (3.6)"),
        _col("sigma_time_s", "float64", "s", "σ_t = σ_t_tot / N (3.8)"),
        _col("window_s", "float64", "s", "timed_end_unix_s - timed_start_unix_s"),
        _col(
            "power_field",
            "str",
            "",
            "`power.draw.instant` or `power.draw`; null if none",
            "Power (NaN, or 0 for counts, for time-only measurements)",
        ),
        _col(
            "power_interval_ms", "Int64", "ms", "nvidia-smi polling interval (null if not recorded)"
        ),
        _col(
            "n_rows_total",
            "int64",
            "",
            "polls in the whole log (data lines, see `opcost.powerlog`)",
        ),
        _col("n_rows_dropped", "int64", "", "polls of the whole log dropped as unusable"),
        _col("n_power_samples", "int64", "", "n, usable rows in the timed window"),
        _col("n_power_updates", "int64", "", "distinct power readings in the window"),
        _col("n_filtered_out", "int64", "", "samples removed by the 3σ filter (3.3)"),
        _col("power_unfiltered_w", "float64", "W", "W̄, mean of all samples in the window (3.1)"),
        _col("sigma_power_unfiltered_w", "float64", "W", "σ_W, their sample std (3.2)"),
        _col("power_w", "float64", "W", "W̄_filtered, mean after the 3σ filter (3.3)"),
        _col("sigma_power_w", "float64", "W", "σ_W̄_filtered, sample std after the filter"),
        _col("sem_power_w", "float64", "W", "standard error of power_w (docs/method.md)"),
        _col(
            "low_power_samples",
            "bool",
            "",
            "n_power_updates < min_power_updates, or a hole in the window",
        ),
        _col(
            "energy_total_j",
            "float64",
            "J",
            "E_tot = power_w · total_time_s (3.4)",
            "Energy (NaN for time-only measurements)",
        ),
        _col("sigma_energy_total_j", "float64", "J", "σ_E = sigma_power_w · total_time_s (3.5)"),
        _col("energy_j", "float64", "J", "e = E_tot / N, energy per iteration (3.7)"),
        _col("sigma_energy_j", "float64", "J", "σ_e = σ_E / N (3.9)"),
        _col("energy_nvml_j", "float64", "J", "NVML counter difference over the window / N"),
        _col("energy_integrated_j", "float64", "J", "integral of power over the window / N"),
        _col(
            "sm_clock_mhz",
            "float64",
            "MHz",
            "measured SM clock (`clocks.sm`)",
            "Conditions, means over the samples in the window (NaN where not logged)",
        ),
        _col("mem_clock_mhz", "float64", "MHz", "measured memory clock (`clocks.mem`)"),
        _col("temperature_c", "float64", "°C", "GPU temperature (`temperature.gpu`)"),
        _col("power_limit_w", "float64", "W", "power limit (`power.limit`)"),
        _col("utilization_gpu_pct", "float64", "%", "GPU utilisation (`utilization.gpu`)"),
        _col(
            "peak_memory_bytes",
            "Int64",
            "B",
            "`torch.cuda.max_memory_allocated`",
            "Provenance (from the JSON)",
        ),
        _col("gpu_name", "str", "", "e.g. `NVIDIA H100 80GB HBM3`"),
        _col("gpu_uuid", "str", "", "the card's UUID"),
        _col("driver_version", "str", "", "NVIDIA driver"),
        _col("cuda_version", "str", "", "CUDA runtime of torch"),
        _col("torch_version", "str", "", "PyTorch version"),
        _col("host", "str", "", "host name"),
        _col(
            "timed_start_unix_s",
            "float64",
            "s",
            "wall clock at the start of the timed region (UTC)",
        ),
        _col("timed_end_unix_s", "float64", "s", "wall clock at its end (UTC)"),
        _col("json_path", "str", "", "the benchmark JSON the row comes from"),
        *TRACE_DATASET_COLUMNS,
    ),
)

#: The dataset columns training reads (``opcost.train``).
TRAIN_COLUMNS = (
    *("gpu", "setting", "mode", "kind", "op_id", "model_input", "op_type", "spec"),
    *("dtype", "tf32", "time_s", "power_w", "energy_j", "low_power_samples"),
    *("sm_clock_mhz", "mem_clock_mhz", "power_limit_w"),
)

FAILED = Table(
    "failed",
    "results/dataset/{gpu}.failed.parquet",
    (
        *(DATASET.columns[:6]),
        _col(
            "failure_reason",
            "str",
            "",
            "why the measurement failed (e.g. `CUDA out of memory: ...`)",
        ),
        _col("json_path", "str", "", "the benchmark JSON the row comes from"),
    ),
)

OPS = Table(
    "ops",
    "results/ops/{model_input}.parquet",
    (
        _col("model_input", "str", "", "the model-input set"),
        _col(
            "op_id",
            "str",
            "",
            "16 hex digits: the first 64 bits of SHA-256 of the canonical JSON spec",
        ),
        _col("kind", "str", "", "`module` or `function`"),
        _col(
            "type",
            "str",
            "",
            "qualified class name (`torch.nn.modules.conv.Conv2d`) or function name "
            "(`torch.add`, `torch.Tensor.__iadd__`)",
        ),
        _col(
            "spec",
            "str",
            "",
            "the canonical JSON spec (sorted keys, no spaces), enough to rebuild the op",
        ),
        _col("count", "int64", "", "how often the op runs in one forward pass of the network"),
        _col(
            "positions",
            "str",
            "",
            "its 0-based call positions in one forward pass, comma-separated: the "
            "network's call order is its ops sorted by position",
        ),
    ),
)

BREAKDOWN = Table(
    "breakdown",
    "results/dataset/{gpu}.breakdown.parquet",
    (
        *DATASET.columns[:3],
        _col("model_input", "str", "", "the network's model-input set"),
        _col("index", "int64", "", "the host span's place in the traced step"),
        _col("phase", "str", "", "`forward` or `backward`"),
        _col("label", "str", "", "`call#<k>`, a backward node's name, or `tail`"),
        _col("call", "Int64", "", "the op's call position (OPS `positions`); null: glue"),
        _col("op_id", "str", "", "the op that ran there (null for glue)"),
        _col("host_s", "float64", "s", "from the end of the span before to this one's end"),
        _col("gpu_s", "float64", "s", "kernel time launched in the span"),
        _col("gpu_busy_s", "float64", "s", "time the GPU is busy with it (union)"),
        _col("n_kernels", "float64", "", "device events launched in the span"),
    ),
)

UNIQUE_OPS = Table(
    "unique_ops",
    "results/ops/unique.parquet",
    (
        *(c for c in OPS.columns if c.name in ("op_id", "kind", "type", "spec")),
        _col("networks", "str", "", "the model-input sets the op occurs in, comma-separated"),
    ),
)


def _compared(quantity: str, unit: str, unit_name: str) -> tuple[Column, ...]:
    """The dataset validation's columns comparing the sum S of ``quantity`` with M."""
    q, u = quantity, unit_name
    return (
        _col(f"{q}_sum_{u}", "float64", unit, f"S: Σ count · `{q}_{u}` of the measured ops"),
        _col(f"sigma_{q}_sum_{u}", "float64", unit, "σ_S: sqrt(Σ (count · sigma)²)"),
        _col(f"{q}_measured_{u}", "float64", unit, f"M: the network's `{q}_{u}`"),
        _col(f"sigma_{q}_measured_{u}", "float64", unit, f"σ_M: its `sigma_{q}_{u}`"),
        _col(f"{q}_ratio", "float64", "", "S / M"),
        _col(f"{q}_rel_diff", "float64", "", "S / M − 1"),
        _col(f"{q}_z", "float64", "", "(S − M) / sqrt(σ_S² + σ_M²)"),
        _col(f"{q}_share_of_all", "float64", "", "S / S of all ops: 1 for `all`"),
    )


VALIDATION = Table(
    "validation",
    "results/validation/dataset_validation.parquet",
    (
        *DATASET.columns[:3],
        _col("model_input", "str", "", "the model-input set"),
        _col("ops_included", "str", "", "`all` or `module`: the ops summed"),
        _col("size_class", "str", "", "`small` or `large` (by measured network time)"),
        _col("n_ops", "int64", "", "distinct ops included"),
        _col("n_op_calls", "int64", "", "sum of their counts (ops run per forward pass)"),
        _col("n_ops_missing", "int64", "", "included ops without a measurement"),
        _col("n_ops_low_power_samples", "int64", "", "measured ops with `low_power_samples`"),
        _col("complete", "bool", "", "`n_ops_missing == 0`"),
        _col("network_measured", "bool", "", "the whole network has a measurement"),
        *_compared("time", "s", "s"),
        *_compared("energy", "J", "j"),
        _col("power_sum_w", "float64", "W", "`energy_sum_j` / `time_sum_s`"),
        _col("gpu_busy_sum_s", "float64", "s", "Σ count · `time_s` · utilization / 100"),
        _col("gpu_busy_measured_s", "float64", "s", "the network's `time_s` · utilization / 100"),
        _col("gpu_busy_rel_diff", "float64", "", "`gpu_busy_sum_s` / `gpu_busy_measured_s` − 1"),
        _col("time_overlap_sum_s", "float64", "s", "the overlap estimate (docs/validation.md)"),
        _col("time_overlap_rel_diff", "float64", "", "`time_overlap_sum_s` / M − 1"),
        _col("power_measured_w", "float64", "W", "the network's `power_w`"),
        _col("sigma_power_measured_w", "float64", "W", "the network's `sigma_power_w`"),
        _col("sm_clock_mhz", "float64", "MHz", "measured during the network measurement"),
        _col("power_limit_w", "float64", "W", "measured during the network measurement"),
        _col("requested_sm_clock_mhz", "float64", "MHz", "locked SM clock, null unless `sm{MHz}`"),
        _col("requested_power_limit_w", "float64", "W", "set power limit, null unless `pl{W}`"),
        _col("gpu_name", "str", "", "e.g. `NVIDIA H100 80GB HBM3`"),
        _col("measured_at_unix_s", "float64", "s", "start of the network's timed region (UTC)"),
    ),
)

HOLDOUT = Table(
    "holdout",
    "results/predictors/{gpu}/holdout_predictions.parquet",
    (
        *DATASET.columns[:3],
        _col("op_id", "str", "", "the operation"),
        _col("op_type", "str", "", "its type"),
        _col("time_s", "float64", "s", "measured time per iteration"),
        _col("time_pred_s", "float64", "s", "predicted by models trained without this op"),
        _col("power_w", "float64", "W", "measured power (NaN for time-only data)"),
        _col("power_pred_w", "float64", "W", "predicted power (NaN without a power model)"),
        _col("energy_j", "float64", "J", "measured energy per iteration"),
        _col("energy_pred_j", "float64", "J", "`time_pred_s` · `power_pred_w`"),
        _col("low_power_samples", "bool", "", "the measured power is flagged"),
        _col(
            "time_baseline_s",
            "float64",
            "s",
            "baseline: median time of the training ops of the same type and mode (of the "
            "mode, for a type not in training)",
        ),
        _col("power_baseline_w", "float64", "W", "the same baseline for power"),
    ),
)

NETWORK_PREDICTIONS = Table(
    "network_predictions",
    "results/predictors/{gpu}/network_predictions.parquet",
    (
        _col("gpu", "str", "", "GPU configuration"),
        _col("model_input", "str", "", "the network left out of training"),
        *DATASET.columns[1:3],
        _col("time_pred_s", "float64", "s", "Σ count · predicted op time"),
        _col("energy_pred_j", "float64", "J", "Σ count · predicted op energy"),
        _col("power_pred_w", "float64", "W", "`energy_pred_j` / `time_pred_s`"),
        _col("time_s", "float64", "s", "the measured whole network (NaN if not measured)"),
        _col("energy_j", "float64", "J", "the measured whole network (NaN if not measured)"),
        _col("power_w", "float64", "W", "the measured whole network's power"),
        _col(
            "time_sum_ops_s", "float64", "s", "Σ count · measured op time (NaN unless all measured)"
        ),
        _col("energy_sum_ops_j", "float64", "J", "Σ count · measured op energy (likewise)"),
        _col("n_ops", "int64", "", "distinct operations of the network"),
        _col("n_ops_measured", "int64", "", "of which measured at this setting and mode"),
        _col("n_ops_unseen", "int64", "", "of which of a type absent from the training data"),
        _col("n_calls", "int64", "", "Σ count"),
    ),
)

TABLES = (DATASET, FAILED, BREAKDOWN, OPS, UNIQUE_OPS, VALIDATION, HOLDOUT, NETWORK_PREDICTIONS)
