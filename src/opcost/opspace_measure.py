"""Cheap measurements of sampled op configurations: kernel time, host time, some power.

An op-space job (:func:`measure_chunk`) measures one chunk of the sampled configurations
(:mod:`opcost.opspace`) on one GPU configuration, in both modes, in one process:

* **GPU time and kernels** of every configuration, from ``TRACE_STEPS`` steps under
  ``torch.profiler`` after ``WARMUP_STEPS`` untraced ones (:mod:`opcost.kineto`): the
  sum of a step's kernel durations on the device, which needs no 1-s window;
* **host time**: the untraced time to issue one step (:func:`opcost.tracing._host_times`,
  ``HOST_REPEATS`` bursts);
* **power**, for as many configurations of each family as the chunk marks ``power``
  (:class:`PowerPlan`): the NVML energy counter over a timed loop of at least
  ``POWER_WINDOW_S`` (the counter and the power reading update about every 100 ms: a
  1-s window holds about ten updates), with the loop's time per step, so that an op's
  busy power follows as in :mod:`opcost.validate.replay`. The windows go to the
  family's GPU-bound configurations first (kernel time at least the host time: the GPU
  is busy through the window), which carry its busy power; a family whose chunk has
  too few of those gets its windows on the last configurations;
* per chunk: the host-speed probe (:func:`opcost.tracing.host_probe_s`), the host
  time of a trivial backward node (:func:`opcost.tracing.backward_node_s`), a
  synchronisation's cost, the idle power before the chunk, and the device's peak
  matrix-product and memory rates (:func:`opcost.peaks.measure_peaks`, the roofline's
  ceilings) under the configuration's numerics.

A configuration that cannot run here (out of memory, unsupported) is a row with
``status: failed`` and the reason; the chunk goes on. The table is written whole, or
not at all. Rows carry the provenance (GPU, driver, torch, host, host CPU, time).
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from opcost import harness, kineto, profile, tracing
from opcost.io import read_parquet, write_parquet_atomic
from opcost.peaks import measure_peaks

WARMUP_STEPS = 3
HOST_REPEATS = 5
POWER_WINDOW_S = 1.0
IDLE_WINDOW_S = 1.0
MODES = ("inference", "training")
#: Columns of a chunk's table, in order: every chunk has all of them (a configuration
#: without a power window, or a failed one, has nulls there), an empty chunk too.
COLUMNS = (
    *("op_id", "family", "op_type", "spec", "mode", "status", "failure_reason"),
    *("calls_per_step", "gpu_time_s", "sigma_gpu_time_s", "forward_gpu_time_s"),
    *("n_kernels", "forward_n_kernels", "host_time_s", "sigma_host_time_s"),
    *("forward_host_time_s", "block_size", "inplace_substituted"),
    *("power_w", "power_window_s", "power_time_s", "measure_s", "finished_unix_s"),
    *("gpu", "device", "dtype", "tf32", "gpu_name", "gpu_uuid", "torch_version"),
    *("cuda_version", "host", "started_unix_s", "driver_version", "host_cpu", "sync_s"),
    *("host_probe_s", "backward_node_s", "idle_power_w"),
    *("peak_matmul_flops_per_s", "peak_memory_bytes_per_s"),
)


def _power_window(
    workload: harness.Workload, device: torch.device, counter: Any
) -> dict[str, float]:
    """Mean power (W) and time per call (s) over a loop of at least ``POWER_WINDOW_S``."""
    calls = workload.calls_per_step
    with workload.context(), harness._no_cyclic_gc():
        harness._sync(device)
        t0 = time.perf_counter()
        e0 = counter.read_mj()
        steps = 0
        while time.perf_counter() - t0 < POWER_WINDOW_S:
            for _ in range(8):
                workload.step()
            steps += 8
            harness._sync(device)
        e1 = counter.read_mj()
        t1 = time.perf_counter()
    return {
        "power_w": (e1 - e0) / 1e3 / (t1 - t0),
        "power_window_s": t1 - t0,
        "power_time_s": (t1 - t0) / (steps * calls),
    }


def idle_power_w(device: torch.device, counter: Any) -> float:
    """The GPU's mean power while nothing runs on it, over ``IDLE_WINDOW_S``."""
    harness._sync(device)
    t0, e0 = time.perf_counter(), counter.read_mj()
    time.sleep(IDLE_WINDOW_S)
    e1, t1 = counter.read_mj(), time.perf_counter()
    return (e1 - e0) / 1e3 / (t1 - t0)


class PowerPlan:
    """Which configurations of a chunk get a power window, per family and mode.

    A family has ``quota`` windows among its ``left`` configurations of the chunk; a
    configuration gets one when it is GPU-bound and windows are left, or when no more
    configurations than windows are left (so the quota is always spent)."""

    def __init__(self, samples: pd.DataFrame) -> None:
        self.quota = samples.groupby("family")["power"].sum().astype(int).to_dict()
        self.left = samples.groupby("family").size().to_dict()
        self._asked = False

    def take(self, family: str, gpu_bound: bool) -> bool:
        """Whether this configuration (the next of ``family``) gets a window."""
        quota, left = self.quota.get(family, 0), self.left.get(family, 0)
        self.left[family] = left - 1
        if quota > 0 and (gpu_bound or left <= quota):
            self.quota[family] = quota - 1
            return True
        return False

    def wants(self, family: str, row: dict[str, Any]) -> bool:
        """:meth:`take` for a configuration measured as ``row``."""
        self._asked = True
        return self.take(family, gpu_bound(row))

    def settle(self, family: str) -> None:
        """After a configuration: one that failed before :meth:`wants` is counted too."""
        if not self._asked:
            self.take(family, gpu_bound=False)
        self._asked = False


def gpu_bound(row: dict[str, Any]) -> bool:
    """Whether a measured configuration keeps the GPU busy: its kernel time per call is
    at least its host time per call."""
    gpu, host = row.get("gpu_time_s"), row.get("host_time_s")
    return row.get("status") == "ok" and gpu is not None and host is not None and gpu >= host


def measure_one(
    spec: dict[str, Any],
    opts: harness.HarnessOptions,
    counter: Any = None,
    wants_power: Any = None,
) -> dict[str, Any]:
    """One configuration in one mode: GPU time, kernels, host time (and power with a
    ``counter``, if ``wants_power(row)`` says so given the time figures, or always
    without it); per call, as the module docstring says."""
    device = torch.device(opts.device)
    t0 = time.perf_counter()
    row: dict[str, Any] = {}
    try:
        # An op that cannot run here (its type does not import, its inputs do not fit it,
        # out of memory) is a failed row, as in a profiling job; the chunk goes on.
        with profile.failure_recorded(row):
            row.update(_measure(spec, opts, device, counter, wants_power))
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    row["measure_s"] = time.perf_counter() - t0
    return row


def _measure(
    spec: dict[str, Any],
    opts: harness.HarnessOptions,
    device: torch.device,
    counter: Any,
    wants_power: Any,
) -> dict[str, Any]:
    workload = harness.prepare_op(spec, opts)
    try:
        calls = workload.calls_per_step
        with workload.context(), harness._no_cyclic_gc():
            for _ in range(WARMUP_STEPS):
                workload.step()
            harness._sync(device)
        steps = kineto.steps(tracing._profile(workload, device, None))
        burst = tracing.host_burst_steps(statistics.median(s.n_kernels for s in steps))
        if statistics.median(s.gpu_s for s in steps) > 2e-3:
            burst = 1  # a long step: its host time is small beside it, keep it cheap
        host, host_fwd = tracing._host_times(workload, device, burst, HOST_REPEATS)
        row: dict[str, Any] = {
            "status": "ok",
            "failure_reason": None,
            "calls_per_step": calls,
            **tracing.kernel_figures(steps, calls),
            **tracing.host_figures(host, host_fwd, calls),
            "block_size": workload.block_size,
            "inplace_substituted": workload.inplace_substituted,
        }
        if counter is not None and (wants_power is None or wants_power(row)):
            row.update(_power_window(workload, device, counter))
    finally:
        del workload
    return row


def measure_chunk(
    *,
    gpu: Any,
    profile_config: dict[str, Any],
    samples: pd.DataFrame,
    out_path: str | Path,
    modes: tuple[str, ...] = MODES,
) -> pd.DataFrame:
    """Measure ``samples`` (columns ``op_id``, ``family``, ``spec``, ``power``) on GPU
    configuration ``gpu`` in ``modes``; write the table to ``out_path`` and return it.
    Each family gets as many power windows per mode as it has ``power`` samples here
    (:class:`PowerPlan`)."""
    from opcost import nvml

    if samples.empty:  # nothing of this chunk to measure here: no device work
        table = pd.DataFrame(columns=list(COLUMNS))
        write_parquet_atomic(table, out_path)
        return table
    opts0 = profile.options_for(gpu, modes[0], profile_config)
    device = torch.device(opts0.device)
    rows = []
    with profile.device_to_itself(opts0.device):
        header = profile.record_header("op-space", gpu.name, "default", opts0, 1)
        facts = tracing.host_facts(opts0.device)
        counter = None
        idle_w = math.nan
        if device.type == "cuda":
            uuid, _, _ = profile.gpu_identity(header)  # UUID, name and driver
            counter = nvml.EnergyCounter(uuid)
            if not counter.available:
                counter = None
        probe_start = tracing.host_probe_s(opts0.device)
        node_s = tracing.backward_node_s(opts0.device)
        if counter is not None:
            idle_w = idle_power_w(device, counter)
        peak = measure_peaks(opts0.device, opts0.dtype, tf32=opts0.tf32)
        for mode in modes:
            opts = profile.options_for(gpu, mode, profile_config)
            harness.configure_numerics(opts)
            plan = PowerPlan(samples)
            for sample in samples.itertuples(index=False):
                spec = json.loads(sample.spec)

                wants_power = functools.partial(plan.wants, sample.family)
                row = measure_one(spec, opts, counter, wants_power)
                plan.settle(sample.family)
                row.update(
                    op_id=sample.op_id,
                    family=sample.family,
                    op_type=spec["type"],
                    spec=sample.spec,
                    mode=mode,
                    finished_unix_s=time.time(),
                )
                rows.append(row)
        probe_end = tracing.host_probe_s(opts0.device)
        if counter is not None:
            counter.close()
    table = pd.DataFrame(rows)
    for key in ("gpu", "device", "dtype", "tf32", "gpu_name", "gpu_uuid", "torch_version"):
        table[key] = header.get(key)
    for key in ("cuda_version", "host", "started_unix_s", "driver_version"):
        table[key] = header.get(key)
    table["host_cpu"] = facts["host_cpu"]
    table["sync_s"] = facts["sync_s"]
    table["host_probe_s"] = statistics.median([probe_start, probe_end])
    table["backward_node_s"] = node_s
    table["idle_power_w"] = idle_w
    table["peak_matmul_flops_per_s"] = peak["matmul_flops_per_s"]
    table["peak_memory_bytes_per_s"] = peak["memory_bytes_per_s"]
    table = table.reindex(columns=list(COLUMNS))
    write_parquet_atomic(table, out_path)
    return table


def chunk_of(samples: pd.DataFrame, chunk: int, chunk_size: int) -> pd.DataFrame:
    """The ``chunk``-th slice of ``chunk_size`` configurations (empty past the end)."""
    return samples.iloc[chunk * chunk_size : (chunk + 1) * chunk_size]


def measure_chunk_file(
    *,
    gpu: Any,
    profile_config: dict[str, Any],
    samples_path: str | Path,
    chunk: int,
    chunk_size: int,
    out_path: str | Path,
    families: list[str] | None = None,
) -> dict[str, Any]:
    """:func:`measure_chunk` of one chunk of a samples file (of its configurations in
    ``families`` only, if given); a summary for the job log."""
    samples = chunk_of(read_parquet(samples_path), chunk, chunk_size)
    if families is not None:
        samples = samples[samples["family"].isin(families)]
    table = measure_chunk(
        gpu=gpu, profile_config=profile_config, samples=samples, out_path=out_path
    )
    ok = table[table["status"] == "ok"] if len(table) else table
    return {
        "status": "ok",
        "configurations": len(samples),
        "measured": len(ok),
        "failed": len(table) - len(ok),
        "device": table["device"].iloc[0] if len(table) else None,
    }
