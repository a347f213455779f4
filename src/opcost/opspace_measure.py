"""Cheap measurements of sampled op configurations: kernel time, host time, some power.

An op-space job (:func:`measure_chunk`) measures one chunk of the sampled configurations
(:mod:`opcost.opspace`) on one GPU configuration, in both modes, in one process:

* **GPU time and kernels** of every configuration, from ``TRACE_STEPS`` steps under
  ``torch.profiler`` after ``WARMUP_STEPS`` untraced ones (:mod:`opcost.kineto`): the
  sum of a step's kernel durations on the device, which needs no 1-s window;
* **host time**: the untraced time to issue one step (:func:`opcost.tracing._host_times`,
  ``HOST_REPEATS`` bursts);
* **time from a CUDA graph** (``graph_time_s``, CUDA only): per call, the step captured
  in a graph of :func:`graph_repeats` steps and replayed for at least ``GRAPH_TIMED_S``
  (:func:`graph_time_s`). A graph may run kernels of a call at once that eager launches
  leave apart (cuDNN's per-group kernels of a grouped convolution); the op models learn
  the share from it (:func:`opcost.model.shares.graph_share`);
* a *long* step (its second warm-up step's wall time at least ``LONG_STEP_S``) repeats
  least: ``LONG_REPEATS`` (:func:`repeats`) gives its warm-up steps, traced steps and
  host bursts. Its kernel times vary by a few tenths of a per cent from step to step,
  and its host time is small beside its GPU time, while its repeats are most of what
  the study's GPU time buys;
* **power**, for the configurations the samples mark ``power`` (spread evenly over each
  family's sequence): the NVML energy counter over a timed loop of ``POWER_WINDOW_S``,
  between the first and the last change of the counter in it (it changes about every
  100 ms: :mod:`opcost.power_window`), with the time per call between the two, so
  that an op's busy power follows as in :mod:`opcost.validate.replay`. The loop replays a CUDA graph
  of the op's steps (:func:`graph_repeats`), so that the GPU is busy through the window
  whatever the host time: an op of microsecond kernels, host-bound when issued eagerly,
  shows its busy power too. A step that cannot be captured runs eagerly
  (``power_graphed`` false);
* per chunk: the host-speed probe (:func:`opcost.host_probe.host_probe_s`), the host
  time of a trivial backward node (:func:`opcost.host_probe.backward_node_s`), a
  synchronisation's cost, the idle power before the chunk, and the device's peak
  matrix-product and memory rates (:func:`opcost.peaks.measure_peaks`, the roofline's
  ceilings) under the configuration's numerics.

A configuration that cannot run here (out of memory, unsupported) is a row with
``status: failed`` and the reason; the chunk goes on. The table is written whole, or
not at all. Rows carry the provenance (GPU, driver, torch, host, host CPU, time).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from opcost import harness, host_probe, kineto, opspace_split, power_window, profile, tracing
from opcost.errors import OpcostError
from opcost.io import read_parquet, write_parquet_atomic
from opcost.peaks import measure_peaks

#: A step's warm-up steps, a short step's traced steps (median) and host bursts
#: (median). Two warm-up steps are too few, for a long step too: after them nearly half
#: of the short training steps traced other kernel counts than after three (H100,
#: docs/results.md).
WARMUP_STEPS = 3
TRACE_STEPS = 3
HOST_REPEATS = 3
#: A step at least this long (wall time, warm) is measured with ``LONG_REPEATS``: a
#: trace's long step (:func:`opcost.tracing.repeats`).
LONG_STEP_S = tracing.LONG_STEP_S
#: (warm-up steps, traced steps, host bursts) of a long step: as many warm-up steps.
LONG_REPEATS = (WARMUP_STEPS, tracing.LONG_TRACE_STEPS, tracing.LONG_HOST_REPEATS)
POWER_WINDOW_S = 1.0
#: GPU time of one CUDA-graph replay in a power window, and the most steps one holds.
GRAPH_REPLAY_GPU_S = 1e-3
GRAPH_MAX_REPEATS = 256
#: The least time the replays of :func:`graph_time_s` run for (at least two replays).
GRAPH_TIMED_S = 5e-3
IDLE_WINDOW_S = 1.0
MODES = ("inference", "training")
#: Columns of a chunk's table, in order: every chunk has all of them (a configuration
#: without a power window, or a failed one, has nulls there), an empty chunk too.
COLUMNS = (
    *("op_id", "family", "op_type", "spec", "mode", "status", "failure_reason"),
    *("calls_per_step", "gpu_time_s", "sigma_gpu_time_s", "forward_gpu_time_s"),
    *("gpu_busy_time_s", "forward_gpu_busy_time_s"),
    *("n_kernels", "forward_n_kernels", "host_time_s", "sigma_host_time_s"),
    *("forward_host_time_s", "block_size", "inplace_substituted"),
    *("power_w", "power_window_s", "power_time_s", "power_graphed", "graph_time_s"),
    *("measure_s",),
    *("finished_unix_s",),
    *("gpu", "device", "dtype", "tf32", "gpu_name", "gpu_uuid", "torch_version"),
    *("cudnn_benchmark",),
    *("cuda_version", "host", "started_unix_s", "driver_version", "host_cpu", "sync_s"),
    *("host_probe_s", "backward_node_s", "idle_power_w"),
    *("peak_matmul_flops_per_s", "peak_memory_bytes_per_s"),
)


def _power_window(
    workload: harness.Workload,
    device: torch.device,
    counter: Any,
    step_gpu_s: float,
    window_s: float | None = None,
) -> dict[str, Any]:
    """Mean power (W) and time per call (s) over a loop of about ``window_s``
    (``POWER_WINDOW_S``), between the first and the last change of the energy counter in
    it (:func:`opcost.power_window.counter_window`), run from a CUDA graph of as many
    steps as keep the GPU busy (:func:`graph_repeats`) where the step can be captured,
    else eagerly (``power_graphed`` says which)."""
    try:
        run = harness.graphed(workload, device, graph_repeats(step_gpu_s))
        graphed = True
    except harness.GraphCaptureFailed:
        run, graphed = workload, False
    with run.context(), harness._no_cyclic_gc():
        window = power_window.counter_window(
            run, device, counter.read_mj, POWER_WINDOW_S if window_s is None else window_s
        )
    return {
        "power_w": window.power_w,
        "power_window_s": window.window_s,
        "power_time_s": window.step_s / run.calls_per_step,
        "power_graphed": graphed,
    }


def graph_time_s(
    workload: harness.Workload, device: torch.device, step_gpu_s: float
) -> float | None:
    """Time per call of ``workload``'s step replayed from a CUDA graph of
    :func:`graph_repeats` steps: the wall time of as many replays as run for
    ``GRAPH_TIMED_S`` (at least two, after one untimed), synchronised once at the end so
    that the host's launch of one replay hides behind the GPU's work of the last (as a
    network's graph runs step after step; :func:`opcost.harness.measure` synchronises each
    of its blocks, and a block here would be a replay or two); None where the step cannot
    be captured or the device is no GPU."""
    repeats = graph_repeats(step_gpu_s)
    try:
        run = harness.graphed(workload, device, repeats)
    except harness.GraphCaptureFailed:
        return None
    replay_s = max(step_gpu_s, 0.0) * repeats
    n = max(2, math.ceil(GRAPH_TIMED_S / replay_s)) if replay_s > 0 else 2
    with run.context(), harness._no_cyclic_gc():
        run.step()
        harness._sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            run.step()
        harness._sync(device)
        elapsed = time.perf_counter() - t0
    return elapsed / (n * run.calls_per_step)


def repeats(warm_step_s: float) -> tuple[int, int, int]:
    """(warm-up steps, traced steps, host bursts) of a step whose second warm-up step took
    ``warm_step_s`` of wall time: ``LONG_REPEATS`` from ``LONG_STEP_S`` up, else
    ``WARMUP_STEPS``, ``TRACE_STEPS`` and ``HOST_REPEATS``."""
    if warm_step_s >= LONG_STEP_S:
        return LONG_REPEATS
    return WARMUP_STEPS, TRACE_STEPS, HOST_REPEATS


def graph_repeats(step_gpu_s: float) -> int:
    """Steps per CUDA graph of a power window: enough for a replay to keep the GPU busy
    for ``GRAPH_REPLAY_GPU_S`` (the host issues a replay in a few microseconds, so the
    kernels of microsecond-short ops then run back to back), at most
    ``GRAPH_MAX_REPEATS``."""
    if not step_gpu_s > 0:
        return 1
    return max(1, min(GRAPH_MAX_REPEATS, math.ceil(GRAPH_REPLAY_GPU_S / step_gpu_s)))


def idle_power_w(device: torch.device, counter: Any) -> float:
    """The GPU's mean power while nothing runs on it, over ``IDLE_WINDOW_S``."""
    harness._sync(device)
    t0, e0 = time.perf_counter(), counter.read_mj()
    time.sleep(IDLE_WINDOW_S)
    e1, t1 = counter.read_mj(), time.perf_counter()
    return (e1 - e0) / 1e3 / (t1 - t0)


def measure_one(
    spec: dict[str, Any],
    opts: harness.HarnessOptions,
    counter: Any = None,
) -> dict[str, Any]:
    """One configuration in one mode: GPU time, kernels, host time, and power with a
    ``counter``; per call, as the module docstring says."""
    device = torch.device(opts.device)
    t0 = time.perf_counter()
    row: dict[str, Any] = {}
    try:
        # An op that cannot run here (its type does not import, its inputs do not fit it,
        # out of memory) is a failed row, as in a profiling job; the chunk goes on.
        with profile.failure_recorded(row):
            row.update(_measure(spec, opts, device, counter))
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
) -> dict[str, Any]:
    workload = harness.prepare_op(spec, opts)
    try:
        calls = workload.calls_per_step
        with workload.context(), harness._no_cyclic_gc():
            workload.step()
            harness._sync(device)
            t0 = time.perf_counter()
            workload.step()
            harness._sync(device)
            warmup, traced, host_repeats = repeats(time.perf_counter() - t0)
            for _ in range(warmup - 2):
                workload.step()
            harness._sync(device)
        steps = kineto.steps(tracing._profile(workload, device, None, traced))
        burst = tracing.host_burst_steps(statistics.median(s.n_kernels for s in steps))
        if statistics.median(s.gpu_s for s in steps) > 2e-3:
            burst = 1  # a long step: its host time is small beside it, keep it cheap
        bursts = tracing._host_times(workload, device, burst, host_repeats)
        row: dict[str, Any] = {
            "status": "ok",
            "failure_reason": None,
            "calls_per_step": calls,
            **tracing.kernel_figures(steps, calls),
            **tracing.host_figures(bursts.host, bursts.host_fwd, calls),
            "block_size": workload.block_size,
            "inplace_substituted": workload.inplace_substituted,
            "graph_time_s": None,
        }
        if device.type == "cuda":
            row["graph_time_s"] = graph_time_s(workload, device, row["gpu_time_s"] * calls)
        if counter is not None:
            row.update(_power_window(workload, device, counter, row["gpu_time_s"] * calls))
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
    A configuration marked ``power`` gets a power window in each mode."""
    from opcost import nvml

    if samples.empty:  # nothing of this chunk to measure here: no device work
        table = pd.DataFrame(columns=list(COLUMNS))
        write_parquet_atomic(table, out_path)
        return table
    opts0 = profile.options_for(gpu, modes[0], profile_config)
    device = torch.device(opts0.device)
    rows = []
    with profile.device_to_itself(opts0.device):
        profile.check_gpu_name(gpu)
        header = profile.record_header("op-space", gpu.name, "default", opts0, 1)
        facts = host_probe.host_facts(opts0.device)
        counter = None
        idle_w = math.nan
        if device.type == "cuda":
            uuid, _, _ = profile.gpu_identity(header)  # UUID, name and driver
            counter = nvml.EnergyCounter(uuid)
            if not counter.available:
                counter = None
        probe_start = host_probe.host_probe_s(opts0.device)
        node_s = host_probe.backward_node_s(opts0.device)
        if counter is not None:
            idle_w = idle_power_w(device, counter)
        peak = measure_peaks(opts0.device, opts0.dtype, tf32=opts0.tf32)
        for mode in modes:
            opts = profile.options_for(gpu, mode, profile_config)
            harness.configure_numerics(opts)
            for sample in samples.itertuples(index=False):
                spec = json.loads(sample.spec)
                row = measure_one(spec, opts, counter if sample.power else None)
                row.update(
                    op_id=sample.op_id,
                    family=sample.family,
                    op_type=spec["type"],
                    spec=sample.spec,
                    mode=mode,
                    finished_unix_s=time.time(),
                )
                rows.append(row)
        probe_end = host_probe.host_probe_s(opts0.device)
        if counter is not None:
            counter.close()
    table = pd.DataFrame(rows)
    for key in ("gpu", "device", "dtype", "tf32", "gpu_name", "gpu_uuid", "torch_version"):
        table[key] = header.get(key)
    for key in ("cudnn_benchmark", "cuda_version", "host", "started_unix_s", "driver_version"):
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
    split: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """:func:`measure_chunk` of one chunk of a samples file (of its configurations in
    ``families`` only, if given); of a round split between peers, ``split = (index,
    members)``, a chunk of the configurations that member measures
    (:func:`opcost.opspace_split.takes`). A summary for the job log."""
    samples = read_parquet(samples_path)
    if split is not None:
        if "split_rank" not in samples:
            raise OpcostError(
                f"{samples_path}: no split_rank column: sampled without split_peers, "
                "while the config splits this round between peers; sample it again"
            )
        samples = samples[opspace_split.takes(samples["split_rank"], *split)]
    samples = chunk_of(samples, chunk, chunk_size)
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
