"""The host's facts and its speed, as a trace or an op-space chunk records them.

A host issues a network's ops as fast as its CPU allows, and that speed varies between
hosts and, on one host, over seconds to minutes. Host times are therefore learnt and
predicted relative to a fixed probe of the host's speed (:func:`host_probe_s`),
measured beside them; :func:`backward_node_s` gives what one trivial node adds to a
backward pass, :func:`sync_s` what a synchronisation with an idle device costs, and
:func:`host_facts` the CPU model and that cost for a record.
"""

from __future__ import annotations

import functools
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from opcost import harness

#: Dispatches of the host-speed probe.
PROBE_DISPATCHES = 200
PROBE_REPEATS = 3
#: Repeats of :func:`backward_node_s` (op-space chunks measure it once each).
BACKWARD_NODE_REPEATS = 5


def host_cpu_model() -> str:
    """The host CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_probe_s(device: str) -> float:
    """The host's speed now: seconds to issue ``PROBE_DISPATCHES`` in-place adds on a
    one-element tensor of ``device`` (median of ``PROBE_REPEATS``, without waiting for
    the device); a fixed sequence of small dispatches, like a host-bound network's.
    Measured in each job right after its host bursts, as the host's speed varies."""
    dev = torch.device(device)
    x = torch.zeros(1, device=dev)
    times = []
    for _ in range(PROBE_REPEATS):
        harness._sync(dev)
        t0 = time.perf_counter()
        for _ in range(PROBE_DISPATCHES):
            x.add_(1.0)
        times.append(time.perf_counter() - t0)
    harness._sync(dev)
    return statistics.median(times)


#: Chain depths whose backward passes :func:`backward_node_s` compares.
BACKWARD_NODE_DEPTHS = (1, 65)


def backward_node_s(device: str) -> float:
    """The host time one trivial node adds to a backward pass, as each op of a network
    does: a chain of ``view`` calls on one tensor, its backward pass timed at the depths
    of ``BACKWARD_NODE_DEPTHS``, the difference per node (median of ``BACKWARD_NODE_REPEATS``,
    each a median of 5). An op measured alone has its inputs as leaves: its backward host
    time also holds their gradients' accumulation, which this separates."""
    dev = torch.device(device)
    x = torch.zeros(8, device=dev, requires_grad=True)
    grad = torch.ones(8, device=dev)

    def backward_s(depth: int) -> float:
        y = x
        for _ in range(depth):
            y = y.view(-1)
        harness._sync(dev)
        t0 = time.perf_counter()
        torch.autograd.backward([y], [grad])
        elapsed = time.perf_counter() - t0
        x.grad = None
        return elapsed

    lo, hi = BACKWARD_NODE_DEPTHS
    slopes = []
    for _ in range(BACKWARD_NODE_REPEATS):
        short = statistics.median(backward_s(lo) for _ in range(5))
        long = statistics.median(backward_s(hi) for _ in range(5))
        slopes.append((long - short) / (hi - lo))
    harness._sync(dev)
    return max(statistics.median(slopes), 0.0)


@functools.cache
def sync_s(device: str) -> float:
    """What a synchronisation with an idle device costs the host (median of 51)."""
    dev = torch.device(device)
    harness._sync(dev)
    times = []
    for _ in range(51):
        t0 = time.perf_counter()
        harness._sync(dev)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def host_facts(device: str) -> dict[str, Any]:
    """The host's CPU and a synchronisation's cost, for a trace record (the probe of its
    speed is measured with each workload: :func:`trace_workload`)."""
    return {"host_cpu": host_cpu_model(), "sync_s": sync_s(device)}
