"""A step's time from its ops: a host thread and a GPU stream, replayed.

The host issues the ops of a step in order, spending ``host_s[i]`` on op *i*; the GPU
stream starts op *i*'s kernels once the host has issued them and the kernels before them
are done, and is busy for ``gpu_s[i]`` plus ``kernel_gap_s`` per kernel (the device's own
gap between queued kernels). Kernels that run at once on several streams share their gaps
(:func:`gapped_kernels`). A timed loop of ``repeats`` steps ends at its last kernel or
its last host work, whichever is later, plus one synchronisation (``sync_s``); the time
per step is that over ``repeats``. With no kernels at all (a CPU), the time is the host's.

The thesis's plain sum (formula 5.1) is the other extreme: every op's isolated wall time
added up, as if neither overlapped the other.

With CUDA graphs (:func:`graph_replay`) the host issues no op: a step is one graph launch,
and the GPU runs every op's kernels back to back, ``GRAPH_KERNEL_GAP_S`` apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The device's idle gap between two kernels of a CUDA graph (median of 176 traced graph
#: replays of the Hopper studies' networks, 0.416 µs on the H100 and the H200 alike,
#: TF32 on and off, 2026-11-25: ``tests/data/graph_networks``). Kernels queued by the
#: host in eager mode stand 1.2 to 1.5 µs apart (the traces' ``launch_gap_s``).
GRAPH_KERNEL_GAP_S = 4.16e-7


@dataclass(frozen=True)
class Replay:
    """One replayed step: its time, and how it splits between the host and the GPU."""

    time_s: float  # per step
    host_s: float  # host work per step
    gpu_busy_s: float  # GPU stream busy per step (kernels and their gaps)

    @property
    def gpu_wait_s(self) -> float:
        """GPU idle per step while the host issues work."""
        return max(self.time_s - self.gpu_busy_s, 0.0)

    @property
    def bound(self) -> str:
        """``gpu`` where the stream is busy for more of the step than the host, else ``host``."""
        return "gpu" if self.gpu_busy_s >= self.host_s else "host"


def gapped_kernels(n_kernels: Any, busy_s: Any, summed_s: Any) -> np.ndarray:
    """How many of ``n_kernels`` kernels each take the device's gap between kernels in a
    replay: all of them where they run one after another, fewer where they run at once
    on several streams (cuDNN's grouped convolutions), whose gaps the other streams'
    kernels fill. The device is then busy for the union of their intervals (``busy_s``),
    less than their durations summed (``summed_s``), and the kernels that take a gap are
    ``n_kernels`` times that share (at most 1; all where ``summed_s`` is 0 or unknown)."""
    n = np.asarray(n_kernels, dtype=float)
    busy = np.asarray(busy_s, dtype=float)
    summed = np.asarray(summed_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(summed > 0, busy / summed, 1.0)
    return n * np.clip(np.nan_to_num(share, nan=1.0), 0.0, 1.0)


def replay(
    host_s: Sequence[float],
    gpu_s: Sequence[float],
    n_kernels: Sequence[float] | None = None,
    *,
    kernel_gap_s: float = 0.0,
    sync_s: float = 0.0,
    repeats: int = 1,
) -> Replay:
    """Replay ``repeats`` steps of ops with these host and GPU times (module docstring)."""
    if len(host_s) != len(gpu_s) or (n_kernels is not None and len(n_kernels) != len(host_s)):
        raise ValueError("host_s, gpu_s and n_kernels must have one value per op")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, not {repeats}")
    kernels = n_kernels if n_kernels is not None else [1.0 if g > 0 else 0.0 for g in gpu_s]
    busy = [
        g + k * kernel_gap_s if g > 0 or k > 0 else 0.0 for g, k in zip(gpu_s, kernels, strict=True)
    ]
    host_t = 0.0
    gpu_t = 0.0
    for _ in range(repeats):
        for h, b in zip(host_s, busy, strict=True):
            host_t += h
            if b > 0:
                gpu_t = max(gpu_t, host_t) + b
    end = max(host_t, gpu_t) + sync_s
    return Replay(end / repeats, sum(host_s), sum(busy))


def graph_replay(
    gpu_s: Sequence[float],
    n_kernels: Sequence[float] | None = None,
    *,
    kernel_gap_s: float = GRAPH_KERNEL_GAP_S,
) -> Replay:
    """A step replayed from a CUDA graph: the ops' kernels run back to back on one stream,
    ``kernel_gap_s`` apart, with no host time between them (the graph's launch and the
    loop's synchronisation spread over many steps)."""
    return replay([0.0] * len(gpu_s), gpu_s, n_kernels, kernel_gap_s=kernel_gap_s)


def step_energy_j(busy_j: float, wait_power_w: float, time_s: float, gpu_s: float) -> float:
    """A replayed step's energy: its kernels' busy energy ``busy_j`` (each op's busy power
    times its GPU time, summed), plus ``wait_power_w`` over the rest of the step
    (``time_s`` less the kernels' ``gpu_s``; none where the kernels fill it)."""
    return busy_j + wait_power_w * max(time_s - gpu_s, 0.0)
