"""One profiling job: measure one operation or one network, write the raw CSV and JSON.

A job (thesis 3.2-3.3):

1. applies the GPU setting (locked SM clock or power limit) through the privileged
   script, and always restores the card afterwards (:mod:`opcost.gpu_setting`);
2. starts ``nvidia-smi`` logging power of *this job's* GPU, identified by UUID, before
   the warm-up (:mod:`opcost.nvsmi_logger`);
3. measures with the harness (:mod:`opcost.harness`), reading NVML's energy counter at the
   start and end of the timed region (:mod:`opcost.nvml`);
4. stops the log and writes the CSV (untouched nvidia-smi output) and the benchmark JSON
   (``docs/formats.md``) under temporary names, then makes both read-only and renames
   them into place, the JSON last (:mod:`opcost.publish`), so an interrupted job leaves
   nothing that looks complete, and a complete pair is always protected.

An operation that runs out of memory or cannot be built or run here is recorded with
``status: failed`` and its reason; the job still succeeds. Any other error fails the job.
On the CPU (``device: cpu``, or ``auto`` without a GPU) only time is measured.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from opcost import device_lock, harness
from opcost.config import GpuConfig, traced_in_job
from opcost.errors import OpcostError
from opcost.io import staged_path
from opcost.names import ModelInput, Setting
from opcost.publish import collecting_own_garbage, publish_read_only, write_synced
from opcost.record_schema import RECORD_SCHEMA_VERSION

SCHEMA_VERSION = RECORD_SCHEMA_VERSION


class ProfileError(OpcostError, RuntimeError):
    """A profiling job cannot run as configured."""


def resolve_device(requested: str) -> str:
    """``auto`` is the local CUDA GPU if there is one, else the CPU."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ProfileError(
            "device: cuda, but torch sees no CUDA GPU here; set the GPU configuration's "
            "device to cpu (time only) or auto, or run on a GPU node"
        )
    return requested


@functools.cache
def profile_defaults() -> dict[str, Any]:
    """The defaults of the config's ``profile`` section, from the config schema."""
    from opcost.config import schema_defaults

    return schema_defaults("profile")


def _profile_option(profile_config: dict[str, Any], key: str) -> Any:
    """``profile_config[key]``, else its default in the config schema."""
    return profile_config[key] if key in profile_config else profile_defaults()[key]


def options_for(
    gpu: GpuConfig, mode: str, profile_config: dict[str, Any]
) -> harness.HarnessOptions:
    """Harness options of GPU configuration ``gpu`` in ``mode``; ``profile_config`` is the
    config's ``profile`` section (missing keys take the schema's defaults)."""
    option = functools.partial(_profile_option, profile_config)
    return harness.HarnessOptions(
        mode=mode,
        device=resolve_device(gpu.device),
        dtype=gpu.dtype,
        tf32=gpu.tf32,
        cudnn_benchmark=gpu.cudnn_benchmark,
        min_run_time_s=float(option("min_run_time_s")),
        warmup_s=float(option("warmup_s")),
        block_size=int(option("block_size")),
        max_block_size=int(option("max_block_size")),
    )


def record_header(
    kind: str, gpu: str, setting: str, opts: harness.HarnessOptions, schema_version: int
) -> dict[str, Any]:
    """The keys every measurement record starts with (a profiling job's, a sweep's).

    What was measured where and how (``kind``, GPU configuration, setting, mode, device,
    numerics, warm-up), the clock (``utc_offset_s``, ``started_unix_s``) and the
    provenance (:func:`provenance`); docs/formats.md lists the profiling job's.
    """
    return {
        "schema_version": schema_version,
        "kind": kind,
        "gpu": gpu,
        "setting": setting,
        "mode": opts.mode,
        "device": opts.device,
        "dtype": opts.dtype,
        "tf32": opts.tf32,
        "cudnn_benchmark": opts.cudnn_benchmark,
        "warmup_s": opts.warmup_s,
        "utc_offset_s": time.localtime().tm_gmtoff,
        "started_unix_s": time.time(),
        **provenance(opts.device),
    }


def provenance(device: str) -> dict[str, Any]:
    """The software and host a measurement ran with, for its record (the GPU's UUID and
    driver are filled in once the power log knows the GPU)."""
    info: dict[str, Any] = {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "host": socket.gethostname(),
        "python_version": platform.python_version(),
        "gpu_name": None,
        "gpu_uuid": None,
        "driver_version": None,
    }
    if device == "cuda":
        info["gpu_name"] = torch.cuda.get_device_name()
    return info


@functools.cache
def _gpu_facts(uuid: str) -> tuple[Any, tuple[str, ...]]:
    """Name, driver, limits and loggable fields of a GPU: asked once per process."""
    from opcost import nvsmi

    return nvsmi.gpu_info(uuid), tuple(nvsmi.supported_fields(uuid, nvsmi.DEFAULT_FIELDS))


def check_setting_applicable(device: str, setting: Setting) -> None:
    """Raise ``ProfileError`` for a setting other than ``default`` off a CUDA GPU."""
    if device != "cuda" and setting.kind != "default":
        # Nothing here can apply it: measuring anyway would record the card as it is
        # under the setting's name.
        raise ProfileError(
            f"GPU setting {setting.name!r} cannot be applied: the job runs on the {device}, "
            "not a CUDA GPU; run it on a GPU node, or profile only the setting 'default'"
        )


def gpu_identity(record: dict[str, Any]) -> tuple[str, Any, tuple[str, ...]]:
    """The current CUDA GPU's UUID, facts and loggable fields; its UUID, name and driver
    into ``record``."""
    from opcost import nvml

    uuid = nvml.cuda_device_uuid(torch.cuda.current_device())
    info, fields = _gpu_facts(uuid)
    record.update(gpu_uuid=uuid, gpu_name=info.name, driver_version=info.driver_version)
    return uuid, info, fields


def check_gpu_name(gpu: GpuConfig) -> None:
    """Raise ``ProfileError`` where ``gpu.gpu_name`` is set and the current CUDA GPU's
    name does not contain it (case ignored): the job runs on another GPU than its
    configuration's, and measuring would file that GPU's figures under its name."""
    if gpu.gpu_name is None or gpu.device != "cuda":
        return
    from opcost import nvml

    uuid = nvml.cuda_device_uuid(torch.cuda.current_device())
    name = _gpu_facts(uuid)[0].name
    if gpu.gpu_name.lower() not in name.lower():
        raise ProfileError(
            f"gpus.{gpu.name}.gpu_name is {gpu.gpu_name!r}, but this job runs on {name!r} "
            f"({uuid}): nothing was measured; run it on a host with that GPU (on a "
            f"cluster, gpus.{gpu.name}.slurm_gpu_model picks the GPU type)"
        )


def setting_command(profile_config: dict[str, Any]) -> tuple[str, ...]:
    """The command that applies and restores a GPU setting (``opcost.gpu_setting``)."""
    return tuple(_profile_option(profile_config, "setting_command"))


@contextlib.contextmanager
def power_log(
    csv_path: Path,
    device: str,
    setting: Setting,
    profile_config: dict[str, Any],
    record: dict,
    job_log_path: Path | None = None,
    *,
    publish: bool = True,
) -> Iterator[Any]:
    """Setting applied, nvidia-smi logging to a temporary file, the energy counter open.

    With ``job_log_path``, a second nvidia-smi log covers the whole job, the setting's
    change and restoration included (thesis 3.3: for investigating anomalies later).
    At the end the log is renamed to ``csv_path``; with ``publish=False`` it stays under
    its temporary name (``opcost.io.staged_path(csv_path)``) for the caller to publish. A
    setting other than ``default`` off a CUDA GPU raises ``ProfileError``: nothing could
    apply it.
    """
    check_setting_applicable(device, setting)
    tmp_csv = staged_path(csv_path)
    try:
        if device == "cuda":
            with _gpu_power_log(tmp_csv, setting, profile_config, record, job_log_path) as read_mj:
                yield read_mj
        else:
            record.update(power_available=False, power_fields=[])
            tmp_csv.parent.mkdir(parents=True, exist_ok=True)
            tmp_csv.write_text(f"# no power log: device is {device}, time only\n")
            yield lambda: None
    except BaseException:
        # A job cut off leaves no log under its final name.
        tmp_csv.unlink(missing_ok=True)
        raise
    if publish:
        os.replace(tmp_csv, csv_path)


@contextlib.contextmanager
def _gpu_power_log(
    tmp_csv: Path,
    setting: Setting,
    profile_config: dict[str, Any],
    record: dict,
    job_log_path: Path | None,
) -> Iterator[Any]:
    """:func:`power_log` on a GPU: logging into ``tmp_csv``, yields the counter's reader."""
    from opcost import gpu_setting, nvml
    from opcost.nvsmi_logger import PowerLogger

    uuid, info, fields = gpu_identity(record)
    record.update(
        power_available=True,
        power_fields=list(fields),
        power_interval_ms=int(_profile_option(profile_config, "power_interval_ms")),
        power_limit_default_w=info.power_default_limit_w,
    )
    command = setting_command(profile_config)
    job_log = (
        PowerLogger(job_log_path, uuid, fields, record["power_interval_ms"], start_grace_s=0)
        if job_log_path is not None
        else contextlib.nullcontext()
    )
    with (
        nvml.EnergyCounter(uuid) as counter,
        job_log,
        gpu_setting.applied_setting(setting, uuid, command),
        # No start-up grace: the warm-up covers nvidia-smi's start, and a logger that
        # died is still caught when it is stopped (0.25 s per job saved).
        PowerLogger(tmp_csv, uuid, fields, record["power_interval_ms"], start_grace_s=0),
    ):
        yield counter.read_mj


def job_record(
    kind: str,
    gpu: GpuConfig,
    setting: Setting,
    opts: harness.HarnessOptions,
    schema_version: int,
    *,
    spec: dict[str, Any] | None,
    model_input: ModelInput | None,
    op_id: str | None,
) -> dict[str, Any]:
    """A measuring job's record before it measures: :func:`record_header`, what it
    measures, the setting's request, and ``status: ok`` until something fails."""
    record = record_header(kind, gpu.name, setting.name, opts, schema_version)
    record.update(
        status="ok",
        failure_reason=None,
        op_id=op_id,
        model_input=model_input.name if model_input else None,
        spec=spec,
        requested_sm_clock_mhz=setting.sm_clock_mhz,
        requested_power_limit_w=setting.power_limit_w,
    )
    return record


def profile_job(
    *,
    kind: str,
    gpu: GpuConfig,
    setting: Setting,
    mode: str,
    profile_config: dict[str, Any],
    csv_path: str | Path,
    json_path: str | Path,
    spec: dict[str, Any] | None = None,
    model_input: ModelInput | None = None,
    op_id: str | None = None,
    job_log_path: str | Path | None = None,
) -> dict[str, Any]:
    """Measure one op (``kind="op"``, with ``spec``) or network (``kind="network"``).

    ``job_log_path``: where the whole-job nvidia-smi log goes (GPU only; under ``logs/``).
    Returns the record written to ``json_path``.
    """
    csv_path, json_path = Path(csv_path), Path(json_path)
    opts = options_for(gpu, mode, profile_config)
    job_log = Path(job_log_path) if job_log_path else None
    # The device to itself for the whole job, whatever the caller's resources say.
    with device_to_itself(opts.device) as lock_wait_s:
        # A second job for the same raw pair (a duplicate submission) waited for the lock
        # while the first measured: it finds the pair complete and measures nothing.
        existing = measured_pair(csv_path, json_path)
        if existing is not None:
            return existing
        check_gpu_name(gpu)
        record = job_record(
            kind,
            gpu,
            setting,
            opts,
            SCHEMA_VERSION,
            spec=spec,
            model_input=model_input,
            op_id=op_id,
        )
        record.update(min_run_time_s=opts.min_run_time_s, device_lock_wait_s=round(lock_wait_s, 3))
        if opts.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        harness.configure_numerics(opts)
        # Both files wait under temporary names until the record is complete; then they
        # are made read-only and renamed into place together (publish_read_only).
        staged_csv, staged_json = staged_path(csv_path), staged_path(json_path)
        try:
            try:
                with (
                    collecting_own_garbage(),
                    power_log(
                        csv_path,
                        opts.device,
                        setting,
                        profile_config,
                        record,
                        job_log,
                        publish=False,
                    ) as read_mj,
                ):
                    _measure_into(
                        record,
                        kind,
                        spec,
                        model_input,
                        opts,
                        read_mj,
                        traced=traced_in_job(profile_config, opts.device),
                    )
            finally:
                if opts.device == "cuda":
                    torch.cuda.empty_cache()
            record["finished_unix_s"] = time.time()
            write_synced(staged_json, json.dumps(record, indent=1, sort_keys=True) + "\n")
            # A duplicate on another device may have published the pair meanwhile: the
            # first complete pair stays, this one is dropped.
            existing = measured_pair(csv_path, json_path)
            if existing is not None:
                staged_csv.unlink(missing_ok=True)
                staged_json.unlink(missing_ok=True)
                return existing
            publish_read_only([(staged_csv, csv_path), (staged_json, json_path)])
        except BaseException:
            staged_csv.unlink(missing_ok=True)
            staged_json.unlink(missing_ok=True)
            raise
    return record


def measured_pair(csv_path: Path, json_path: Path) -> dict[str, Any] | None:
    """The record of a raw pair that another job has already published, else None.

    A pair counts when both files exist and the JSON is a finished record. Snakemake
    deletes a job's old outputs before it starts the job, so a pair present here was
    written by a duplicate of this job while it ran: the job then measures nothing and
    overwrites nothing, and says so on stderr.
    """
    if not (csv_path.is_file() and json_path.is_file()):
        return None
    try:
        record = json.loads(json_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or "finished_unix_s" not in record:
        return None
    print(
        f"opcost: {json_path} and its CSV were already measured by another job; not measured again",
        file=sys.stderr,
        flush=True,
    )
    return record


def device_to_itself(device: str) -> contextlib.AbstractContextManager[float]:
    """The device's lock (:func:`opcost.device_lock.exclusive`), held by each profiling
    job and sweep so that one measures alone on its GPU; yields the seconds waited."""
    return device_lock.exclusive(_device_key(device))


def _device_key(device: str) -> str:
    """What names the device's lock: the GPU's UUID (a GPU has one name in every job)."""
    if device == "cuda":
        from opcost import nvml

        return nvml.cuda_device_uuid(torch.cuda.current_device())
    return device


def _measure_into(
    record: dict[str, Any],
    kind: str,
    spec: dict[str, Any] | None,
    model_input: ModelInput | None,
    opts: harness.HarnessOptions,
    read_mj: Any,
    traced: bool = False,
) -> None:
    """Build the op or network and measure it; its timing, or why it failed, into
    ``record``; ``traced``: then, after the timed window, its trace into
    ``record["trace"]`` (:func:`opcost.tracing.trace_after_window`)."""
    workload = net = None
    try:
        with failure_recorded(record):
            if kind == "op":
                workload = harness.prepare_op(spec, opts)
            else:
                from opcost.networks import build_model

                net = build_model(model_input.model)
                workload = harness.prepare_network(net, model_input.shape, opts)
            timing = harness.measure(workload, opts, read_mj)
            record.update(_timing_fields(timing))
        if traced and record["status"] == "ok":
            from opcost import tracing

            record["trace"] = tracing.trace_after_window(kind, workload, net, opts, timing)
    finally:
        # Unbound here, so the caller's empty_cache can free its memory even while an
        # exception (whose traceback holds this frame) propagates.
        del workload, net


@contextlib.contextmanager
def failure_recorded(record: dict[str, Any]) -> Iterator[None]:
    """Where the op cannot run here (:func:`_op_cannot_run`), ``status: failed`` and the
    reason into ``record`` instead of the error; any other error propagates."""
    try:
        yield
    except harness.OpCannotRun as e:
        record.update(status="failed", failure_reason=str(e))
    except (RuntimeError, ValueError, NotImplementedError) as e:
        if not _op_cannot_run(e):
            raise
        record.update(status="failed", failure_reason=f"{type(e).__name__}: {e}"[:2000])


def _op_cannot_run(error: BaseException) -> bool:
    """Whether an error raised while building or running the op means the op cannot run here.

    Out of memory, and the errors torch raises for an op that does not support this
    input, device or dtype (e.g. batch norm in training on one value per channel) are
    recorded as a failed measurement. The project's own errors (nvidia-smi, NVML, GPU
    setting) are not: they fail the job.
    """
    if type(error).__module__.startswith("opcost"):
        return False
    return harness.is_out_of_memory(error) or isinstance(
        error, RuntimeError | ValueError | NotImplementedError
    )


def _timing_fields(t: harness.Timing) -> dict[str, Any]:
    return {
        "block_size": t.block_size,
        "warmup_iterations": t.warmup_iterations,
        "number_per_run": t.number_per_run,
        "block_times_s": list(t.block_times_s),
        "iterations": t.iterations,
        "total_time_s": t.total_time_s,
        "sigma_total_time_s": t.sigma_total_time_s,
        "timed_start_unix_s": t.timed_start_unix_s,
        "timed_end_unix_s": t.timed_end_unix_s,
        "energy_counter_start_mj": t.energy_counter_start_mj,
        "energy_counter_end_mj": t.energy_counter_end_mj,
        "peak_memory_bytes": t.peak_memory_bytes,
        "backward": t.backward,
        "calls_per_backward": t.calls_per_backward,
        "inplace_substituted": t.inplace_substituted,
    }
