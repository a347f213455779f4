"""A call's measured shares of its kernel time: how much of it the GPU is busy for, and
how much of that a CUDA graph takes. Read from a sample's op-space columns (or a row of
the same names); the op models learn the first two (:mod:`opcost.model.opmodel`), and
the power model takes a window's busy time from the first
(:func:`opcost.model.op_power.window_busy_power_w`).

* :func:`busy_share`: busy time (the union of the kernels' intervals,
  ``gpu_busy_time_s``) over the summed kernel durations (``gpu_time_s``); below 1 where
  kernels run at once (cuDNN's per-group kernels on several streams).
* :func:`graph_share`: the time per call replayed from a CUDA graph over the busy time;
  below 1 where a graph runs at once kernels that eager launches leave apart.
* :func:`kernels_per_pass`: a call's kernels in its longer pass, which decides whether
  the graph share can differ from 1 (:data:`GRAPH_MIN_KERNELS`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: The most kernels a pass of a call may run and keep its graph share at 1: of the samples
#: timed from a graph (H100, H200, TF32 on and off), those of at most 8 kernels a pass ran
#: a mean 1.00-1.09 of their busy time, those of more than 64 a mean 0.53-0.78.
GRAPH_MIN_KERNELS = 8


def _column(rows: pd.DataFrame, name: str) -> np.ndarray:
    return pd.to_numeric(rows[name], errors="coerce").to_numpy(dtype=float)


def busy_share(rows: pd.DataFrame) -> np.ndarray:
    """Each sample's busy time over its summed kernel time; NaN where not recorded."""
    if "gpu_busy_time_s" not in rows:
        return np.full(len(rows), np.nan)
    g, busy = _column(rows, "gpu_time_s"), _column(rows, "gpu_busy_time_s")
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((g > 0) & (busy > 0), busy / g, np.nan)


def graph_share(rows: pd.DataFrame) -> np.ndarray:
    """Each sample's time per call replayed from a CUDA graph (``graph_time_s``, else its
    power window's where that ran from a graph: ``power_graphed``) over its busy time;
    NaN where not measured so. A call of at most :data:`GRAPH_MIN_KERNELS` kernels a pass
    has 1: its kernels depend on each other, and what its time measures beyond them is a
    graph's gap, which a replay adds. A graph may run at once the many kernels of a call
    that eager launches leave apart (cuDNN's per-group kernels)."""
    if "gpu_busy_time_s" not in rows:
        return np.full(len(rows), np.nan)
    per_call = np.full(len(rows), np.nan)
    if "power_graphed" in rows and "power_time_s" in rows:
        graphed = rows["power_graphed"].fillna(False).astype(bool).to_numpy()
        per_call = np.where(graphed, _column(rows, "power_time_s"), np.nan)
    if "graph_time_s" in rows:
        timed = _column(rows, "graph_time_s")
        per_call = np.where(np.isfinite(timed), timed, per_call)
    busy = _column(rows, "gpu_busy_time_s")
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where((busy > 0) & (per_call > 0), per_call / busy, np.nan)
    if "n_kernels" in rows:
        few = kernels_per_pass(rows) <= GRAPH_MIN_KERNELS
        share = np.where(few & np.isfinite(share), 1.0, share)
    return share


def kernels_per_pass(rows: pd.DataFrame) -> np.ndarray:
    """A call's kernels in its longer pass: all of them in inference, the forward's or the
    backward's in training (``forward_n_kernels`` where given)."""
    total = rows["n_kernels"].to_numpy(dtype=float)
    if "mode" not in rows or "forward_n_kernels" not in rows:
        return total
    fwd = _column(rows, "forward_n_kernels")
    fwd = np.where(np.isfinite(fwd), fwd, total)
    training = rows["mode"].to_numpy() == "training"
    return np.where(training, np.maximum(fwd, total - fwd), total)
