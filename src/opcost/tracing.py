"""Kernel-level truth for one op or network: host time, GPU kernel time and kernels.

A trace job (:func:`trace_job`) builds the same workload as the profiling job
(:mod:`opcost.harness`) and, with no power window, measures on this host:

1. **host time**: the time the host takes to issue one step, untraced: bursts of a few
   steps issued back to back right after a synchronisation, as few as keep the launch
   queue from filling (so the host never waits for the device), median of
   ``HOST_REPEATS`` (fewer of a long step or a training chain, :func:`repeats`); in
   training also the forward pass alone; and each burst's wall time up to the
   synchronisation that ends it (``burst_wall_time_s``), paired with its host time, so
   that a replay of the host and GPU times can be checked against the same steps,
   whatever the host's speed does between moments;
2. **wall time**: the time per step of a short timed loop (``WALL_WINDOW_S`` for a
   network, ``OP_WALL_WINDOW_S`` for an op), the profiling job's algorithm on a shorter
   window, so an op's and its network's wall, host and GPU times all come from one run
   on one host; it runs before the trace, so that the traced steps find the GPU at its
   clocks;
3. **a trace**: ``TRACE_STEPS`` steps (fewer of a long step or a training chain,
   :func:`repeats`) under ``torch.profiler`` (Kineto/CUPTI), each annotated
   (``opcost.step``, ``opcost.forward``, ``opcost.backward``), from which
   :mod:`opcost.kineto` takes each step's kernel time and kernels. A network is traced
   a second time with its op calls annotated (``opcost.call#<k>``, ``k`` the op's call
   position as extraction numbers it), which gives its own per-op breakdown, backward
   nodes mapped to their forward op; the annotation (a ``TorchFunctionMode``) turns off
   fused fast paths, so the kernel totals come from the first pass;
4. **the host's speed** (:mod:`opcost.host_probe`): a fixed probe right after the host
   bursts, the CPU model, and the cost of a synchronisation on an idle device;
5. a network on a GPU also **with CUDA graphs** (:func:`graph_figures`): its step captured
   once and replayed, so that the host no longer issues each op: time and energy per
   step over a window of about ``GRAPH_WINDOW_S`` between two changes of the NVML
   energy counter (:mod:`opcost.power_window`, about nine of its updates; without a
   counter, time over ``WALL_WINDOW_S``), and the kernels of ``TRACE_STEPS`` traced
   replays. A network that cannot be captured has ``graph_status: failed`` and the
   reason; the rest of its record stands.

A profiler that records no device work on a GPU fails the job (:class:`TraceFailed`).
Per-call figures divide a step by its calls (a training chain has up to 16).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import torch

from opcost import gpu_setting, harness, host_probe, kineto, power_window, profile, publish
from opcost.call_annotator import CallAnnotator, learn_calls
from opcost.errors import OpcostError
from opcost.io import staged_path

TRACE_STEPS = 4
HOST_REPEATS = 7
#: A step of at least ``LONG_STEP_S`` of wall time (its timed loop's, or a graph
#: replay's), or of at least ``LONG_STEP_CALLS`` op calls (a training chain), is traced
#: ``LONG_TRACE_STEPS`` times and issued in ``LONG_HOST_REPEATS`` bursts
#: (:func:`repeats`): a long step's kernel times vary by tenths of a per cent between
#: steps, a chain's steps already hold as many calls as a single call's repeats, and
#: the profiled steps of batch-64 networks and of training chains are most of what
#: tracing adds to a study.
LONG_STEP_S = 10e-3
LONG_STEP_CALLS = 8
LONG_TRACE_STEPS = 2
LONG_HOST_REPEATS = 3
#: Steps per host-time burst, and the kernel launches a burst may queue at most (CUDA's
#: launch queue holds about a thousand; a full one would make the host wait).
HOST_BURST_STEPS = 8
HOST_BURST_LAUNCHES = 512
#: Op calls a burst needs at most: a training chain's step of 16 calls is a burst alone.
HOST_BURST_CALLS = 8
#: Timed loop of a network, and of an op (which the profiling job of the same run times
#: over its power window: the trace job's loop warms the GPU up and gives the plain sum).
WALL_WINDOW_S = 0.1
OP_WALL_WINDOW_S = 0.01
#: The timed loop's warm-up, a share of its window (after ``WARMUP_STEPS`` steps).
WALL_WARMUP_SHARE = 0.2
WARMUP_STEPS = 3
#: Window of a CUDA-graph network where there is an energy counter (else WALL_WINDOW_S).
GRAPH_WINDOW_S = 1.0


class TraceFailed(OpcostError, RuntimeError):
    """The profiler could not trace the workload (no device work recorded)."""


@functools.cache
def check_profiler_sees_kernels(device: str) -> None:
    """Raise :class:`TraceFailed` unless the profiler records the kernel of an add."""
    dev = torch.device(device)
    x = torch.zeros(1024, device=dev)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        with torch.autograd.profiler.record_function(kineto.STEP):
            x.add_(1.0)
        harness._sync(dev)
    steps = kineto.steps(_exported(prof))
    if not any(s.n_kernels for s in steps):
        raise TraceFailed(
            "torch.profiler recorded no GPU kernel for a plain add on this device: CUPTI "
            "is not available to it here, so no trace can give kernel times"
        )


def repeats(step_s: float, calls: int = 1) -> tuple[int, int]:
    """(traced steps, host bursts) of a step of ``step_s`` of wall time and ``calls`` op
    calls: ``LONG_TRACE_STEPS`` and ``LONG_HOST_REPEATS`` from ``LONG_STEP_S`` or
    ``LONG_STEP_CALLS`` up, else ``TRACE_STEPS`` and ``HOST_REPEATS``."""
    if step_s >= LONG_STEP_S or calls >= LONG_STEP_CALLS:
        return LONG_TRACE_STEPS, LONG_HOST_REPEATS
    return TRACE_STEPS, HOST_REPEATS


def _spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def trace_workload(
    workload: harness.Workload,
    opts: harness.HarnessOptions,
    annotator: CallAnnotator | None = None,
    keep_trace: Path | None = None,
    wall_window_s: float = WALL_WINDOW_S,
    wall: harness.Timing | None = None,
) -> dict[str, Any]:
    """Host, wall and kernel times of ``workload`` on this host (module docstring);
    ``keep_trace``: where to write the profiler's trace too (gzipped JSON);
    ``wall_window_s``: the timed loop's window; ``wall``: the timing of a window that
    has just run (a profiling job's), which stands for the loop: the workload is then
    warm and the GPU at its clocks, so neither warm-up steps nor a loop run."""
    device = torch.device(opts.device)
    calls = workload.calls_per_step
    t0 = time.perf_counter()
    if wall is None:
        with workload.context(), harness._no_cyclic_gc():
            for _ in range(WARMUP_STEPS):
                workload.step()
            harness._sync(device)
        # The timed loop first: it also brings the GPU to its clocks for the traced steps.
        warmup_s = WALL_WARMUP_SHARE * wall_window_s
        t0 = time.perf_counter()
        loop = replace(opts, min_run_time_s=wall_window_s, warmup_s=warmup_s)
        wall = harness.measure(workload, loop)
    t1 = time.perf_counter()
    traced, host_repeats = repeats(wall.total_time_s / wall.iterations * calls, calls)
    # Kernel time and kernels from steps run as the network runs. A network's calls are
    # annotated in a second pass: its TorchFunctionMode makes modules with a fused fast
    # path (nn.MultiheadAttention in inference) take their slow path, so that pass gives
    # only the breakdown and the host spans it is scaled by.
    trace = _profile(workload, device, None, traced)
    annotated = trace if annotator is None else _profile(workload, device, annotator, traced)
    t2 = time.perf_counter()
    if keep_trace is not None:
        with gzip.open(keep_trace, "wt") as f:
            json.dump(annotated, f)
    # Each trace parsed once for all that read it.
    plain = kineto.parse(trace)
    marked = plain if annotator is None else kineto.parse(annotated)
    steps = kineto.steps(plain)
    spans = steps if annotator is None else kineto.steps(marked)
    if device.type == "cuda" and not any(s.n_kernels for s in steps):
        check_profiler_sees_kernels(opts.device)  # no kernels: a view, or a blind profiler
    launch_gap = kineto.launch_gap_s(plain)
    breakdown = _breakdown(marked, annotator) if annotator is not None else None
    burst = host_burst_steps(statistics.median(s.n_kernels for s in steps), calls)
    t3 = time.perf_counter()
    bursts = _host_times(workload, device, burst, host_repeats)
    probe = host_probe.host_probe_s(opts.device)
    t4 = time.perf_counter()
    record: dict[str, Any] = {
        "trace_steps": len(steps),
        "calls_per_step": calls,
        **host_figures(bursts.host, bursts.host_fwd, calls),
        "burst_wall_time_s": statistics.median(bursts.wall) / calls,
        "sigma_burst_wall_time_s": _spread(bursts.wall) / calls,
        **kernel_figures(steps, calls),
        "traced_host_time_s": statistics.median(s.host_s for s in spans) / calls,
        "traced_forward_host_time_s": statistics.median(s.forward_host_s for s in spans) / calls,
        "wall_time_s": wall.total_time_s / wall.iterations,
        "wall_number_per_run": wall.number_per_run,
        "launch_gap_s": launch_gap,
        "host_burst_steps": burst,
        "host_probe_s": probe,
        "host_probe_dispatches": host_probe.PROBE_DISPATCHES,
        # Where a trace job's time goes: the short timed loop, the profiled steps, their
        # parsing, the host bursts and probe (seconds).
        "trace_cost_s": {
            "wall": t1 - t0,
            "profile": t2 - t1,
            "parse": t3 - t2,
            "host": t4 - t3,
        },
        "backward": workload.backward,
    }
    if breakdown is not None:
        record["breakdown"] = breakdown
    return record


def graph_figures(
    workload: harness.Workload,
    opts: harness.HarnessOptions,
    read_energy_mj: Callable[[], int | None] | None = None,
) -> dict[str, Any]:
    """Per call of ``workload`` replayed from a CUDA graph (:func:`harness.graphed`):
    where ``read_energy_mj`` reads an energy counter (mJ), time (and its σ over blocks),
    power and energy over a window of about ``GRAPH_WINDOW_S`` between two changes of
    the counter (:func:`opcost.power_window.counter_window`), else time over one of
    ``WALL_WINDOW_S`` and no energy; GPU kernel time, kernels and the device's gap
    between them from ``TRACE_STEPS`` traced replays (fewer of a long step:
    :func:`repeats`). ``graph_status`` is ``failed`` with ``graph_failure_reason``
    where the step cannot be captured."""
    device = torch.device(opts.device)
    try:
        graph = harness.graphed(workload, device)
    except harness.GraphCaptureFailed as e:
        return {"graph_status": "failed", "graph_failure_reason": str(e)}
    calls = graph.calls_per_step
    figures: dict[str, Any] = {"graph_status": "ok", "graph_failure_reason": None}
    if read_energy_mj is not None and read_energy_mj() is not None:
        with graph.context(), harness._no_cyclic_gc():
            window = power_window.counter_window(graph, device, read_energy_mj, GRAPH_WINDOW_S)
        figures.update(
            graph_time_s=window.step_s / calls,
            sigma_graph_time_s=window.sigma_step_s / calls,
            graph_energy_j=window.energy_j / (window.steps * calls),
            graph_power_w=window.power_w,
            graph_window_s=window.window_s,
        )
    else:
        timing = harness.measure(graph, replace(opts, min_run_time_s=WALL_WINDOW_S, warmup_s=0.05))
        per_call = timing.iterations * calls
        figures.update(
            graph_time_s=timing.total_time_s / per_call,
            sigma_graph_time_s=timing.sigma_total_time_s / per_call,
            graph_energy_j=None,
            graph_power_w=None,
            graph_window_s=timing.total_time_s,
        )
    traced, _ = repeats(figures["graph_time_s"] * calls, calls)
    trace = kineto.parse(_profile(graph, device, None, traced))
    steps = kineto.steps(trace)
    figures.update(
        graph_gpu_time_s=statistics.median(s.gpu_s for s in steps) / calls,
        graph_n_kernels=statistics.median(s.n_kernels for s in steps) / calls,
        graph_launch_gap_s=kineto.launch_gap_s(trace),
    )
    return figures


def host_burst_steps(kernels_per_step: float, calls_per_step: int | None = None) -> int:
    """Steps per host-time burst: up to ``HOST_BURST_STEPS``, as many as keep the burst's
    launches within ``HOST_BURST_LAUNCHES``, and with ``calls_per_step`` given, no more
    than hold ``HOST_BURST_CALLS`` calls (at least 1)."""
    steps = min(HOST_BURST_STEPS, int(HOST_BURST_LAUNCHES // max(kernels_per_step, 1)))
    if calls_per_step is not None:
        steps = min(steps, -(-HOST_BURST_CALLS // max(calls_per_step, 1)))
    return max(1, steps)


def kernel_figures(steps: list[kineto.StepSummary], calls: int) -> dict[str, float]:
    """Per call, from traced steps: GPU kernel time (median, spread, forward pass), the
    time the device was busy with those kernels (the union of their intervals, less than
    their sum where they overlap) and kernels (median, forward pass)."""
    gpu = [s.gpu_s for s in steps]
    return {
        "gpu_time_s": statistics.median(gpu) / calls,
        "sigma_gpu_time_s": _spread(gpu) / calls,
        "forward_gpu_time_s": statistics.median(s.forward_gpu_s for s in steps) / calls,
        "gpu_busy_time_s": statistics.median(s.gpu_busy_s for s in steps) / calls,
        "forward_gpu_busy_time_s": statistics.median(s.forward_gpu_busy_s for s in steps) / calls,
        "n_kernels": statistics.median(s.n_kernels for s in steps) / calls,
        "forward_n_kernels": statistics.median(s.forward_n_kernels for s in steps) / calls,
    }


def host_figures(host: list[float], host_fwd: list[float], calls: int) -> dict[str, float]:
    """Per call, from :func:`_host_times`: host time (median, spread, forward pass)."""
    return {
        "host_time_s": statistics.median(host) / calls,
        "sigma_host_time_s": _spread(host) / calls,
        "forward_host_time_s": statistics.median(host_fwd) / calls,
    }


class Bursts(NamedTuple):
    """Per step of each host burst (:func:`_host_times`): the host's time to issue it,
    its forward pass's share, and the burst's wall time (from its start on an idle device
    to its last kernel's end, synchronised), so that host and wall time are paired."""

    host: list[float]
    host_fwd: list[float]
    wall: list[float]


def _host_times(
    workload: harness.Workload, device: torch.device, burst: int, repeats: int = HOST_REPEATS
) -> Bursts:
    """Untraced host time per step, whole and its forward pass: ``HOST_REPEATS`` bursts of
    ``burst`` steps, each right after a synchronisation, so that the host issues them
    back to back and the launch queue never fills; and each burst's wall time, up to the
    synchronisation that ends it (the same steps: the host's speed cancels between the
    two)."""
    fwd, bwd = workload.forward_pass, workload.backward_pass
    host, host_fwd, wall = [], [], []
    with workload.context(), harness._no_cyclic_gc():
        harness._sync(device)
        for _ in range(repeats):
            forward_s = 0.0
            t0 = time.perf_counter()
            for _ in range(burst):
                if fwd is not None:
                    t1 = time.perf_counter()
                    out = fwd()
                    forward_s += time.perf_counter() - t1
                    bwd(out)
                    out = None
                else:
                    workload.step()
            total = time.perf_counter() - t0
            harness._sync(device)
            wall.append((time.perf_counter() - t0) / burst)
            host.append(total / burst)
            host_fwd.append((forward_s if fwd is not None else total) / burst)
    return Bursts(host, host_fwd, wall)


def _profile(
    workload: harness.Workload,
    device: torch.device,
    annotator: CallAnnotator | None,
    steps: int = TRACE_STEPS,
) -> dict[str, Any]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    rf = torch.autograd.profiler.record_function
    annotate = annotator.active if annotator is not None else contextlib.nullcontext
    with workload.context(), harness._no_cyclic_gc():
        harness._sync(device)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(steps):
                with rf(kineto.STEP):
                    if workload.forward_pass is not None:
                        with rf(kineto.FORWARD), annotate():
                            out = workload.forward_pass()
                        with rf(kineto.BACKWARD):
                            workload.backward_pass(out)
                        del out
                    else:
                        with rf(kineto.FORWARD), annotate():
                            workload.step()
            harness._sync(device)
    return _exported(prof)


def _exported(prof: torch.profiler.profile) -> dict[str, Any]:
    """The profiler's Chrome trace, read back from the file it can only export to."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())


def _breakdown(trace: kineto.Parsed, annotator: CallAnnotator) -> list[dict[str, Any]]:
    """The trace's mean step as rows; ``call`` renumbered to the op's call position as
    extraction gives it (the rank among the calls it keeps), None for glue."""
    kept = sorted(k for k, op_id in annotator.calls.items() if op_id is not None)
    position = {k: i for i, k in enumerate(kept)}
    rows = kineto.mean_breakdown(kineto.breakdown(trace))
    for row in rows:
        k = row["call"]
        row["op_id"] = annotator.calls.get(k) if k is not None else None
        row["call"] = position.get(k) if k is not None else None
    return rows


#: Version of the trace record's layout (docs/formats.md).
TRACE_SCHEMA_VERSION = 1


def trace_job(
    *,
    kind: str,
    gpu: Any,
    setting: Any,
    mode: str,
    profile_config: dict[str, Any],
    json_path: str | Path,
    spec: dict[str, Any] | None = None,
    model_input: Any = None,
    op_id: str | None = None,
) -> dict[str, Any]:
    """Trace one op (``kind="op"``, with ``spec``) or network into ``json_path``.

    The record holds the profiling job's header (what, where, with which software), the
    host's facts (:func:`opcost.host_probe.host_facts`) and the trace's figures
    (:func:`trace_workload`), or ``status: failed`` with the reason where the op cannot
    run here. It is written whole and read-only, or not at all. The GPU setting is
    applied as for profiling.
    """
    json_path = Path(json_path)
    opts = profile.options_for(gpu, mode, profile_config)
    with profile.device_to_itself(opts.device):
        profile.check_gpu_name(gpu)
        record = profile.job_record(
            kind,
            gpu,
            setting,
            opts,
            TRACE_SCHEMA_VERSION,
            spec=spec,
            model_input=model_input,
            op_id=op_id,
        )
        record.update(host_probe.host_facts(opts.device))
        harness.configure_numerics(opts)
        with _setting_applied(opts.device, setting, profile_config, record):
            try:
                with profile.failure_recorded(record):
                    record.update(_trace(kind, spec, model_input, opts))
            finally:
                if opts.device == "cuda":
                    torch.cuda.empty_cache()
        record["finished_unix_s"] = time.time()
        staged = staged_path(json_path)
        try:
            publish.write_synced(staged, json.dumps(record, indent=1, sort_keys=True) + "\n")
            publish.publish_read_only([(staged, json_path)])
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
    return record


@contextlib.contextmanager
def _setting_applied(
    device: str, setting: Any, profile_config: dict[str, Any], record: dict[str, Any]
) -> Iterator[None]:
    """The GPU setting applied, and the GPU's identity in ``record``, as for profiling."""
    profile.check_setting_applicable(device, setting)
    if device != "cuda":
        yield
        return
    uuid, _, _ = profile.gpu_identity(record)
    with gpu_setting.applied_setting(setting, uuid, profile.setting_command(profile_config)):
        yield


def _trace(
    kind: str, spec: dict[str, Any] | None, model_input: Any, opts: harness.HarnessOptions
) -> dict[str, Any]:
    if kind == "op":
        return trace_workload(harness.prepare_op(spec, opts), opts, wall_window_s=OP_WALL_WINDOW_S)
    from opcost.networks import build_model

    # Built on the device: the same initialisation, drawn there rather than by the
    # host's CPU (seconds for the larger networks).
    with torch.device(opts.device):
        net = build_model(model_input.model)
    return trace_network(harness.prepare_network(net, model_input.shape, opts), net, opts)


def trace_network(
    workload: harness.Workload,
    net: torch.nn.Module,
    opts: harness.HarnessOptions,
    wall: harness.Timing | None = None,
) -> dict[str, Any]:
    """:func:`trace_workload` of network ``net`` with its own breakdown, and on a GPU its
    figures from a CUDA graph (:func:`graph_figures`); ``wall`` as there."""
    record = trace_workload(workload, opts, learn_calls(workload, net), wall=wall)
    if opts.device == "cuda":
        from opcost import nvml

        t0 = time.perf_counter()
        with nvml.EnergyCounter(nvml.cuda_device_uuid(torch.cuda.current_device())) as counter:
            record.update(graph_figures(workload, opts, counter.read_mj))
        record["trace_cost_s"]["graph"] = time.perf_counter() - t0
    return record


def trace_after_window(
    kind: str,
    workload: harness.Workload,
    net: torch.nn.Module | None,
    opts: harness.HarnessOptions,
    wall: harness.Timing,
) -> dict[str, Any]:
    """The trace a profiling job records of ``workload`` right after its timed window
    (``wall``, that window's timing): the figures of a trace job
    (:func:`trace_workload`, :func:`trace_network` for a network ``net``) and the
    host's facts, with ``status`` and ``failure_reason``; its wall time is the
    window's. ``trace_cost_s["total"]`` is what it added to the job, set-up included.
    A profiler that records no device work raises :class:`TraceFailed`."""
    t0 = time.perf_counter()
    trace: dict[str, Any] = {"status": "ok", "failure_reason": None}
    trace.update(host_probe.host_facts(opts.device))
    with profile.failure_recorded(trace):
        if kind == "op":
            trace.update(trace_workload(workload, opts, wall=wall))
        else:
            trace.update(trace_network(workload, net, opts, wall=wall))
    if trace["status"] == "ok":
        trace["trace_cost_s"]["total"] = time.perf_counter() - t0
    return trace
