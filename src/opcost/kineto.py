"""Adapter for the PyTorch profiler's trace (Kineto's Chrome trace JSON): no torch needed.

:mod:`opcost.tracing` runs a few steps of an op or a network under ``torch.profiler``,
with user annotations around each step (``opcost.step``), its forward and backward pass
(``opcost.forward``, ``opcost.backward``) and, in a network, each op call
(``opcost.call#<k>``). This module reads the exported trace and splits it into

* **host spans**: consecutive stretches of the host timeline that partition a step, one
  per op call (the span from the previous call's end to this call's end, so the glue
  between calls belongs to the call it leads to) and, in training, one per backward node
  the autograd engine runs (``autograd::engine::evaluate_function: ...``), mapped to the
  forward call that created it through the autograd sequence number;
* **GPU work**: each kernel, memcpy and memset on the device, attributed to the host span
  in which the host launched it (the runtime call with the same ``correlation``).

A span's ``gpu_s`` is the sum of its device events' durations: kernel time, with no gaps
between kernels. Its ``gpu_busy_s`` is the union of their intervals: the time the device
was busy with them. The two differ where kernels overlap: cuDNN runs a grouped
convolution's kernels on several streams at once (regnet_x_400mf at 8x3x224x224 on an
H100 with TF32 off: 611 kernels a step on 9 streams, busy 0.71 of their summed time).
``launch_gap_s`` is the median idle gap between two consecutive device
events of one stream when the second was already queued: what the device itself needs
between kernels. Times are seconds.
"""

from __future__ import annotations

import bisect
import gzip
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opcost.errors import OpcostError

STEP = "opcost.step"
FORWARD = "opcost.forward"
BACKWARD = "opcost.backward"
CALL_PREFIX = "opcost.call#"
BACKWARD_NODE_PREFIX = "autograd::engine::evaluate_function: "
#: Device events that occupy the stream.
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
US = 1e-6


class TraceError(OpcostError, ValueError):
    """A profiler trace that cannot be read or lacks what a summary needs."""


@dataclass(frozen=True)
class Event:
    name: str
    category: str
    start_us: float
    dur_us: float
    tid: Any
    args: dict[str, Any]

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass
class Span:
    """A stretch of the host timeline and the device work launched in it."""

    phase: str  # "forward" or "backward"
    label: str  # "call#<k>", a backward node's name, "tail"
    call: int | None  # the forward call it belongs to (None: glue)
    start_us: float
    end_us: float
    device: list[Event] = field(default_factory=list)  # launched in it, in launch order

    @property
    def host_s(self) -> float:
        return (self.end_us - self.start_us) * US

    @property
    def gpu_us(self) -> float:
        """Its device events' durations summed (µs)."""
        return sum(ev.dur_us for ev in self.device)

    @property
    def n_kernels(self) -> int:
        return len(self.device)

    @property
    def busy_us(self) -> float:
        """The union of its device events' intervals (µs)."""
        return busy_us((ev.start_us, ev.end_us) for ev in self.device)


def busy_us(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals: the time a device was busy
    with events that may overlap (kernels of several streams)."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


def load(path: str | Path) -> dict[str, Any]:
    """A Chrome trace from ``path`` (``.json`` or ``.json.gz``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            trace = json.load(f)
    except (OSError, ValueError, EOFError) as e:
        raise TraceError(f"{path}: not a readable profiler trace ({e})") from e
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TraceError(f"{path}: no traceEvents list: not a Chrome trace")
    return trace


def events(trace: dict[str, Any]) -> list[Event]:
    """The trace's complete events (``ph`` ``X``), in start order."""
    out = []
    for e in trace.get("traceEvents", []):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        try:
            out.append(
                Event(
                    str(e.get("name", "")),
                    str(e.get("cat", "")),
                    float(e["ts"]),
                    float(e.get("dur", 0.0)),
                    e.get("tid"),
                    e.get("args") or {},
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    out.sort(key=lambda ev: ev.start_us)
    return out


@dataclass
class Parsed:
    """A trace's annotations, device events and their launches."""

    annotations: list[Event]
    device: list[Event]
    launch_us: dict[int, float]  # correlation -> start of the runtime call
    launch_end_us: dict[int, float]
    cpu_ops: list[Event]

    def named(self, name: str) -> list[Event]:
        return [a for a in self.annotations if a.name == name]

    def device_events(self) -> list[tuple[float, Event]]:
        """Device events with the host time they were launched at, by launch time."""
        out = []
        for ev in self.device:
            corr = ev.args.get("correlation")
            if corr in self.launch_us:
                out.append((self.launch_us[corr], ev))
        out.sort(key=lambda pair: pair[0])
        return out


def parse(trace: dict[str, Any] | Parsed) -> Parsed:
    """The trace's events sorted into :class:`Parsed` (a trace already parsed is kept)."""
    if isinstance(trace, Parsed):
        return trace
    evs = events(trace)
    annotations = [e for e in evs if e.category == "user_annotation"]
    device = [e for e in evs if e.category in DEVICE_CATEGORIES]
    launch_us: dict[int, float] = {}
    launch_end_us: dict[int, float] = {}
    for e in evs:
        if e.category in RUNTIME_CATEGORIES and "correlation" in e.args:
            launch_us[e.args["correlation"]] = e.start_us
            launch_end_us[e.args["correlation"]] = e.end_us
    cpu_ops = [e for e in evs if e.category == "cpu_op"]
    return Parsed(annotations, device, launch_us, launch_end_us, cpu_ops)


def _assign(spans: list[Span], device: list[tuple[float, Event]]) -> None:
    """Give each device event to the span whose host stretch holds its launch."""
    starts = [s.start_us for s in spans]
    for launched, ev in device:
        i = bisect.bisect_right(starts, launched) - 1
        if 0 <= i < len(spans) and launched <= spans[i].end_us:
            spans[i].device.append(ev)


@dataclass(frozen=True)
class StepSummary:
    """One traced step: host span, kernel time and kernels, whole and per pass."""

    host_s: float
    gpu_s: float
    n_kernels: int
    forward_host_s: float
    forward_gpu_s: float
    forward_n_kernels: int
    gpu_busy_s: float
    forward_gpu_busy_s: float


def steps(trace: dict[str, Any] | Parsed) -> list[StepSummary]:
    """Each ``opcost.step`` annotation's host span and the device work launched in it
    (``trace`` as loaded, or parsed once by :func:`parse` for several readers)."""
    p = parse(trace)
    step_marks = p.named(STEP)
    if not step_marks:
        raise TraceError(f"the trace has no {STEP!r} annotation")
    forwards = p.named(FORWARD)
    device = p.device_events()
    out = []
    for mark in step_marks:
        fwd = next((f for f in forwards if mark.start_us <= f.start_us <= mark.end_us), None)
        inside = [ev for t, ev in device if mark.start_us <= t <= mark.end_us]
        fwd_inside = [ev for t, ev in device if fwd.start_us <= t <= fwd.end_us] if fwd else inside
        out.append(
            StepSummary(
                host_s=mark.dur_us * US,
                gpu_s=sum(ev.dur_us for ev in inside) * US,
                n_kernels=len(inside),
                forward_host_s=(fwd.dur_us if fwd else mark.dur_us) * US,
                forward_gpu_s=sum(ev.dur_us for ev in fwd_inside) * US,
                forward_n_kernels=len(fwd_inside),
                gpu_busy_s=busy_us((ev.start_us, ev.end_us) for ev in inside) * US,
                forward_gpu_busy_s=busy_us((ev.start_us, ev.end_us) for ev in fwd_inside) * US,
            )
        )
    return out


def launch_gap_s(trace: dict[str, Any] | Parsed) -> float | None:
    """Median idle gap between consecutive device events of a stream, the second of which
    was already launched when the first ended (so the gap is the device's own)."""
    p = parse(trace)
    by_stream: dict[Any, list[Event]] = {}
    for ev in p.device:
        by_stream.setdefault((ev.tid, ev.args.get("stream")), []).append(ev)
    gaps = []
    for evs in by_stream.values():
        evs.sort(key=lambda ev: ev.start_us)
        for a, b in zip(evs, evs[1:], strict=False):
            launched_end = p.launch_end_us.get(b.args.get("correlation"))
            if launched_end is not None and launched_end <= a.end_us and b.start_us >= a.end_us:
                gaps.append(b.start_us - a.end_us)
    return statistics.median(gaps) * US if gaps else None


def call_index(name: str) -> int | None:
    if name.startswith(CALL_PREFIX):
        try:
            return int(name[len(CALL_PREFIX) :])
        except ValueError:
            return None
    return None


def _forward_spans(p: Parsed, fwd: Event) -> list[Span]:
    calls = [
        a
        for a in p.annotations
        if a.tid == fwd.tid
        and fwd.start_us <= a.start_us
        and a.end_us <= fwd.end_us
        and call_index(a.name) is not None
    ]
    spans = []
    prev = fwd.start_us
    for a in calls:
        spans.append(Span("forward", a.name[len("opcost.") :], call_index(a.name), prev, a.end_us))
        prev = a.end_us
    spans.append(Span("forward", "tail", None, prev, fwd.end_us))
    return spans


def _sequence_owner(p: Parsed, fwd: Event, spans: list[Span]) -> dict[int, int]:
    """Autograd sequence number -> the forward call that recorded it."""
    owner: dict[int, int] = {}
    call_spans = [s for s in spans if s.call is not None]
    ends = [s.end_us for s in call_spans]
    for op in p.cpu_ops:
        seq = op.args.get("Sequence number")
        if seq is None or op.tid != fwd.tid or not (fwd.start_us <= op.start_us <= fwd.end_us):
            continue
        i = bisect.bisect_left(ends, op.start_us)
        if i < len(call_spans) and call_spans[i].start_us <= op.start_us:
            owner.setdefault(int(seq), call_spans[i].call)
    return owner


def _backward_spans(p: Parsed, bwd: Event, owner: dict[int, int]) -> list[Span]:
    nodes = [
        op
        for op in p.cpu_ops
        if op.name.startswith(BACKWARD_NODE_PREFIX)
        and bwd.start_us <= op.start_us
        and op.end_us <= bwd.end_us
    ]
    nodes.sort(key=lambda op: op.start_us)
    spans = []
    prev = bwd.start_us
    for op in nodes:
        if op.end_us <= prev:  # nested in the previous node
            continue
        seq = op.args.get("Sequence number")
        call = owner.get(int(seq)) if seq is not None else None
        spans.append(Span("backward", op.name[len(BACKWARD_NODE_PREFIX) :], call, prev, op.end_us))
        prev = op.end_us
    spans.append(Span("backward", "tail", None, prev, bwd.end_us))
    return spans


def breakdown(trace: dict[str, Any] | Parsed) -> list[list[Span]]:
    """Per traced step, its host spans in order (forward calls, then backward nodes) with
    the device work launched in each."""
    p = parse(trace)
    device = p.device_events()
    out = []
    for mark in p.named(STEP):
        fwd = next(
            (f for f in p.named(FORWARD) if mark.start_us <= f.start_us <= mark.end_us), mark
        )
        spans = _forward_spans(p, fwd)
        bwd = next(
            (b for b in p.named(BACKWARD) if mark.start_us <= b.start_us <= mark.end_us), None
        )
        if bwd is not None:
            spans += _backward_spans(p, bwd, _sequence_owner(p, fwd, spans))
        spans.sort(key=lambda s: s.start_us)
        _assign(spans, [(t, ev) for t, ev in device if mark.start_us <= t <= mark.end_us])
        out.append(spans)
    if not out:
        raise TraceError(f"the trace has no {STEP!r} annotation")
    return out


def mean_breakdown(per_step: Iterable[list[Span]]) -> list[dict[str, Any]]:
    """The spans of identical steps averaged position by position (host, GPU, kernels);
    steps whose spans differ in number from the first's are left out."""
    per_step = list(per_step)
    same = [s for s in per_step if len(s) == len(per_step[0])]
    rows = []
    for i in range(len(same[0])):
        group = [s[i] for s in same]
        first = group[0]
        rows.append(
            {
                "phase": first.phase,
                "label": first.label,
                "call": first.call,
                "host_s": statistics.fmean(s.host_s for s in group),
                "gpu_s": statistics.fmean(s.gpu_us for s in group) * US,
                "gpu_busy_s": statistics.fmean(s.busy_us for s in group) * US,
                "n_kernels": statistics.fmean(s.n_kernels for s in group),
            }
        )
    return rows
