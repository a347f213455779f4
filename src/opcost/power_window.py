"""Mean power over a loop of steps, between two changes of NVML's energy counter.

NVML's total-energy counter (:class:`opcost.nvml.EnergyCounter`) changes about every
100 ms and holds the energy up to its last update (``experiments/energy_counter_interval.py``).
Two reads at arbitrary times therefore miss or add up to an update interval of energy at
each end of a window, and a first read taken as a loop starts holds energy from before
it. :func:`counter_window` runs the loop for about ``window_s`` and takes the window
from the first change of the counter it sees to the last: energy and time between two
updates, each end placed within a block of steps. On an H100 (2026-11-28,
``tests/data/power_window_edges``) such 1-s windows agree with 2-s ones within 0.4 %
(median) and repeat within 2.8 % (90th percentile), where windows between two arbitrary
reads read 2 % low and repeat within 6.3 %.

The counter is read after every block of steps (:func:`block_steps`), while the GPU still
runs the block: a read takes about 3 ms on an H100, and a GPU left idle meanwhile would
draw less.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from opcost import harness
from opcost.nvml import NvmlError

#: Wall time of the steps run between two reads of the counter (:func:`block_steps`, at
#: most ``BLOCK_MAX_STEPS``), long beside a read, and how much longer than the window a
#: loop may wait for the counter to change.
BLOCK_S = 20e-3
BLOCK_MAX_STEPS = 1000
TIMEOUT_S = 2.0


@dataclass(frozen=True)
class CounterWindow:
    """A window between two changes of the counter: its energy (J), its length (s), the
    steps run in it, and the wall time of each of its blocks of ``block`` steps."""

    energy_j: float
    window_s: float
    steps: int
    block: int
    block_times_s: tuple[float, ...]

    @property
    def power_w(self) -> float:
        return self.energy_j / self.window_s

    @property
    def step_s(self) -> float:
        """Time per step."""
        return self.window_s / self.steps

    @property
    def sigma_step_s(self) -> float:
        """Sample standard deviation of the time per step over the blocks (0 for one)."""
        if len(self.block_times_s) < 2:
            return 0.0
        return statistics.stdev(b / self.block for b in self.block_times_s)


def block_steps(step_s: float) -> int:
    """Steps run between two reads of the counter: as many as fill ``BLOCK_S`` of wall
    time (a step taking ``step_s``), 1 to ``BLOCK_MAX_STEPS``."""
    if step_s <= 0:
        return BLOCK_MAX_STEPS
    return max(1, min(BLOCK_MAX_STEPS, round(BLOCK_S / step_s)))


def counter_window(
    run: harness.Workload,
    device: torch.device,
    read_mj: Callable[[], Any],
    window_s: float,
) -> CounterWindow:
    """Run ``run`` for about ``window_s`` (inside its context, steps already warm), and on
    until the counter (``read_mj``, mJ) has changed twice ``window_s / 2`` apart: the
    window from the first change seen to the last.

    Raises:
        NvmlError: the counter did not change twice within ``TIMEOUT_S`` more.
    """
    t = time.perf_counter()
    run.step()
    harness._sync(device)
    block = block_steps(time.perf_counter() - t)
    started = time.perf_counter()
    last_mj = read_mj()
    # (time of the read, reading, blocks run by then) at each change seen
    changes: list[tuple[float, int, int]] = []
    synced = [started]  # the time after each block's synchronisation
    while True:
        for _ in range(block):
            run.step()
        mj, now = read_mj(), time.perf_counter()  # the GPU still runs the block
        harness._sync(device)
        synced.append(time.perf_counter())
        if mj != last_mj:
            changes.append((now, mj, len(synced) - 1))
            last_mj = mj
        if now - started < window_s:
            continue
        if len(changes) >= 2 and changes[-1][0] - changes[0][0] >= window_s / 2:
            (t0, e0, b0), (t1, e1, b1) = changes[0], changes[-1]
            ends = synced[b0 : b1 + 1]
            blocks = tuple(b - a for a, b in zip(ends, ends[1:], strict=False))
            return CounterWindow((e1 - e0) / 1e3, t1 - t0, (b1 - b0) * block, block, blocks)
        if now - started > window_s + TIMEOUT_S:
            raise NvmlError(
                f"the GPU's energy counter changed {len(changes)} times in "
                f"{now - started:.1f} s of work: no power window can be measured on it"
            )
