"""The base time an op model learns GPU time against, and what a GPU's samples give it.

The trees of :mod:`opcost.model.opmodel` fit ``log(GPU time / base time)``, where the
base time (:func:`base_time_s`) is the op's roofline time
(:func:`opcost.model.roofline.roofline_time_s`) plus the shortest kernel the samples
ran, once per pass (twice in training). The roofline time is taken against the
configuration's *ceilings* (:func:`ceilings`): the measured peak rates
(:mod:`opcost.peaks`), raised to the highest FLOP and byte rate any sample achieved (a
tensor that stays in the L2 cache beats the DRAM rate), and the highest rate of a layer
norm's rows. For a large op the base is its roofline time, for a small one the floor
every kernel costs, so the trees learn a ratio near 1.
"""

from __future__ import annotations

import json
import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from opcost.model import roofline as rl

#: The percentile of the samples' time per kernel taken as the shortest kernel a call
#: costs (``OpModel.kernel_floor_s``): the 1st, which one stray fast sample cannot move.
KERNEL_FLOOR_PERCENTILE = 1.0


class GpuBase(NamedTuple):
    """What a GPU's samples give the base time: the peaks its chunks measured, the
    ceilings (:func:`ceilings`) and the shortest kernel (:func:`shortest_kernel_s`)."""

    peaks: rl.Peaks
    ceilings: rl.Peaks
    kernel_floor_s: float


def gpu_base(table: pd.DataFrame, measured: pd.DataFrame | None = None) -> GpuBase:
    """One GPU's :class:`GpuBase` from its samples ``table``: the peaks the median of the
    chunks' measured ones (of ``measured``, the rows it measured itself, where given)."""
    chunks = table if measured is None else measured
    peaks = rl.Peaks(
        float(chunks["peak_matmul_flops_per_s"].median()),
        float(chunks["peak_memory_bytes_per_s"].median()),
    )
    return GpuBase(peaks, ceilings(table, peaks), shortest_kernel_s(table))


def ceilings(table: pd.DataFrame, peaks: rl.Peaks) -> rl.Peaks:
    """The measured peaks, raised to the highest FLOP and byte rate any sample achieved,
    and the highest rate of a layer norm's rows (:mod:`opcost.model.roofline`, "Rows"; no
    bound without such samples)."""
    ok = table[(table["gpu_time_s"] > 0) & table["family"].ne("view")]
    works = [rl.op_work(json.loads(s), m) for s, m in zip(ok["spec"], ok["mode"], strict=True)]
    t = ok["gpu_time_s"].to_numpy()
    flops = max((w.flops / g for w, g in zip(works, t, strict=True)), default=0.0)
    moved = max((w.bytes / g for w, g in zip(works, t, strict=True)), default=0.0)
    rows = max((w.rows / g for w, g in zip(works, t, strict=True)), default=0.0)
    return rl.Peaks(
        max(peaks.matmul_flops_per_s, flops),
        max(peaks.memory_bytes_per_s, moved),
        rows if rows > 0 else math.inf,
    )


def base_time_s(roof: np.ndarray, training: np.ndarray, kernel_floor_s: float) -> np.ndarray:
    """The time GPU time is learnt against: the roofline time plus the shortest kernel,
    once per pass (the forward, and in training the backward)."""
    return np.asarray(roof, dtype=float) + kernel_floor_s * np.where(training, 2.0, 1.0)


def shortest_kernel_s(rows: pd.DataFrame) -> float:
    """The shortest kernel the samples ran: the :data:`KERNEL_FLOOR_PERCENTILE` th
    percentile of GPU time per kernel over the samples with kernels (0 if none)."""
    g, k = rows["gpu_time_s"].to_numpy(float), rows["n_kernels"].to_numpy(float)
    ok = (g > 0) & (k > 0)
    return float(np.percentile(g[ok] / k[ok], KERNEL_FLOOR_PERCENTILE)) if ok.any() else 0.0
