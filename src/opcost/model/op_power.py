"""The op models' busy power: which power windows teach it, what each window's kernels
draw while they run, and the model's features and fit (:mod:`opcost.model.opmodel`).

A window's busy power is ``(P t - P_wait (t - g)) / g`` (:func:`window_busy_power_w`),
``g`` the time its kernels keep the GPU busy and ``P_wait`` (:func:`wait_power_w`) the
power the GPU draws while it waits. One model over all families learns its log from the
windows busy at least :data:`BUSY_SHARE` of the time (:func:`power_windows`), on the
family, the mode, the log arithmetic intensity, the predicted efficiency, the predicted
time per kernel and the op's shape features (:func:`features`).

A configuration also learns busy power from the windows only a *peer* on another GPU
measured (:func:`peer_windows`): each enters at the peer's busy power times the median
ratio, own over peer, of the family's windows both GPUs measured (:func:`peer_ratios`),
so that a power round measured on one GPU teaches the other too.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from opcost.model import roofline as rl
from opcost.model import shapes
from opcost.model.op_tables import sample_keys
from opcost.model.trees import TreeEnsemble
from opcost.validate.replay import WAIT_SHARE

#: The least share of a power window its kernels keep the GPU busy for the window to teach
#: busy power: below it, the busy power derived from the window's mean power amplifies
#: that power's noise more than twice.
BUSY_SHARE = 0.5
#: Features of the power model besides the family's one-hot and the shape features.
POWER_FEATURES = ("training", "log_intensity", "efficiency", "log_kernel_s")
#: Windows both GPUs measured that a family needs for a ratio of its own; with fewer, the
#: family's peer windows take the median ratio over all families.
MIN_POWER_PAIRS = 20


def busy_share(rows: pd.DataFrame) -> np.ndarray:
    """Each sample's busy time over its summed kernel time; NaN where not recorded."""
    if "gpu_busy_time_s" not in rows:
        return np.full(len(rows), np.nan)
    g = rows["gpu_time_s"].to_numpy(dtype=float)
    busy = pd.to_numeric(rows["gpu_busy_time_s"], errors="coerce").to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((g > 0) & (busy > 0), busy / g, np.nan)


def power_columns(families: tuple[str, ...]) -> list[str]:
    """The power model's feature columns, in order, for a model of ``families``."""
    return [f"family[{f}]" for f in families] + list(POWER_FEATURES) + list(shapes.SHAPE_FEATURES)


def features(
    family: pd.Series, rows: pd.DataFrame, pred: pd.DataFrame, families: tuple[str, ...]
) -> pd.DataFrame:
    """The power model's features of ``rows`` (``spec``, ``mode``) of ``family``, with
    their predicted ``efficiency``, ``gpu_time_s`` and ``n_kernels`` (``pred``), in the
    columns of :func:`power_columns`."""
    works = [rl.op_work(json.loads(s), m) for s, m in zip(rows["spec"], rows["mode"], strict=True)]
    intensity = np.array([w.flops / w.bytes if w.bytes > 0 else 0.0 for w in works])
    kernel_s = pred["gpu_time_s"] / pred["n_kernels"].clip(lower=1.0)
    x = pd.get_dummies(family.to_numpy(), prefix="family", prefix_sep="[").astype(float)
    x.columns = [f"{c}]" for c in x.columns]
    x["training"] = (rows["mode"].to_numpy() == "training").astype(float)
    x["log_intensity"] = np.log1p(intensity)
    x["efficiency"] = pred["efficiency"].to_numpy()
    # A kernel of a few microseconds ends before the GPU's power rises as far as a long
    # one's.
    x["log_kernel_s"] = np.log(np.clip(kernel_s.to_numpy(dtype=float), 1e-7, None))
    # How much of the GPU a kernel's grid fills: a convolution of one image in float32
    # runs on few SMs and draws little more than idle power for as long as it runs.
    x[list(shapes.SHAPE_FEATURES)] = shapes.shape_matrix(rows["spec"])
    return x.reindex(columns=power_columns(families), fill_value=0.0)


def wait_power_w(rows: pd.DataFrame) -> float:
    """``P_wait``: the median window power of samples busy less than ``WAIT_SHARE`` of
    their window, else the idle power."""
    p = rows[rows["power_w"].notna()] if "power_w" in rows else rows.iloc[:0]
    if len(p):
        share = p["gpu_time_s"] / p["power_time_s"]
        low = p.loc[share < WAIT_SHARE, "power_w"]
        if len(low):
            return float(low.median())
    return float(rows["idle_power_w"].median()) if "idle_power_w" in rows else math.nan


def window_busy_power_w(rows: pd.DataFrame, wait_power_w: float) -> pd.Series:
    """The power of each power window's kernels while they run, ``(P t - P_wait (t - g))
    / g``: ``g`` the time they keep the GPU busy (their union where recorded, else their
    summed durations; at most the window), ``t`` the window per call."""
    share = np.nan_to_num(busy_share(rows), nan=1.0)
    t = rows["power_time_s"]
    g = (rows["gpu_time_s"] * share).clip(upper=t)
    return (rows["power_w"] * t - wait_power_w * (t - g)) / g


def power_windows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows whose power window the busy-power model learns from: a window whose
    kernels keep the GPU busy at least :data:`BUSY_SHARE` of it."""
    if "power_w" not in rows:
        return rows.iloc[:0]
    return rows[rows["power_w"].notna() & rows["gpu_time_s"].ge(BUSY_SHARE * rows["power_time_s"])]


def busy_power_errors(model: Any, rows: pd.DataFrame) -> pd.DataFrame:
    """Per power window of ``rows`` (:func:`power_windows`): its ``family``, the busy
    power measured (:func:`window_busy_power_w`, with the model's ``P_wait``) and the
    busy power ``model`` (an :class:`~opcost.model.opmodel.OpModel`) predicts for its
    configuration, and the relative error."""
    p = power_windows(rows)
    measured = window_busy_power_w(p, model.wait_power_w).to_numpy(dtype=float)
    predicted = model.predict(p[["spec", "mode", "op_type"]])["busy_power_w"].to_numpy()
    return pd.DataFrame(
        {
            "family": p["family"].to_numpy(),
            "mode": p["mode"].to_numpy(),
            "measured_w": measured,
            "predicted_w": predicted,
            "err": predicted / measured - 1.0,
        }
    )


def peer_ratios(own: pd.DataFrame, peer: pd.DataFrame) -> tuple[dict[str, float], float, int]:
    """Per family, the median ratio of busy power, own over peer, of the power windows
    (:func:`power_windows`) both ``own`` and ``peer`` measured (same op id and mode), each
    side's busy power with its own wait power; the median over all families; the number of
    such pairs. A family with fewer than :data:`MIN_POWER_PAIRS` takes the median over all
    (1.0 with no pairs at all)."""
    mine, theirs = power_windows(own), power_windows(peer)
    a = pd.Series(
        window_busy_power_w(mine, wait_power_w(own)).to_numpy(float),
        index=sample_keys(mine).to_numpy(),
    )
    a = a[~a.index.duplicated()]
    keys = sample_keys(theirs).to_numpy()
    both = np.isin(keys, a.index)
    b = window_busy_power_w(theirs, wait_power_w(peer)).to_numpy(float)[both]
    log_ratio = pd.Series(np.log(a.loc[keys[both]].to_numpy() / b)).replace(
        [np.inf, -np.inf], np.nan
    )
    family = theirs["family"].to_numpy()[both]
    ok = log_ratio.notna().to_numpy()
    log_ratio, family = log_ratio[ok], family[ok]
    overall = float(np.exp(log_ratio.median())) if len(log_ratio) else 1.0
    per = log_ratio.groupby(family).agg(["size", "median"])
    ratios = {
        str(f): float(np.exp(r["median"]))
        for f, r in per.iterrows()
        if r["size"] >= MIN_POWER_PAIRS
    }
    return ratios, overall, int(len(log_ratio))


def peer_windows(own: pd.DataFrame, peer: pd.DataFrame) -> pd.DataFrame:
    """The power windows of ``peer`` (another GPU's rows, :func:`power_windows`) whose
    configuration and mode ``own`` has no window of, carried over to ``own``'s GPU: column
    ``busy_power_w`` the peer's busy power (with its wait power) times the family's ratio
    of :func:`peer_ratios`."""
    theirs = power_windows(peer)
    theirs = theirs[~sample_keys(theirs).isin(set(sample_keys(power_windows(own))))]
    theirs = theirs[~sample_keys(theirs).duplicated()]
    if theirs.empty:
        return theirs.assign(busy_power_w=pd.Series(dtype=float))
    ratios, overall, _ = peer_ratios(own, peer)
    scale = theirs["family"].map(lambda f: ratios.get(str(f), overall)).to_numpy(float)
    busy = window_busy_power_w(theirs, wait_power_w(peer)).to_numpy(float) * scale
    return theirs.assign(busy_power_w=busy)


def fit(
    model: Any, rows: pd.DataFrame, make: Any, peer: pd.DataFrame | None = None
) -> TreeEnsemble | None:
    """The busy-power model of ``model`` (an :class:`~opcost.model.opmodel.OpModel`, its
    time models fitted) from the power windows of ``rows`` and, with ``peer`` (the rows
    another GPU measured), those only the peer has (:func:`peer_windows`); None with
    fewer than 5."""
    p = power_windows(rows)
    p = p.assign(busy_power_w=window_busy_power_w(p, model.wait_power_w).to_numpy(float))
    if peer is not None and len(peer):
        p = pd.concat([p, peer_windows(rows, peer)], ignore_index=True)
    if len(p) < 5:
        return None
    pred = model.predict(p[["spec", "mode", "op_type"]])
    x = features(p["family"], p, pred, model.power_families)
    # Learnt as its log: trees average relative deviations alike, from near-idle power to
    # the limit, and their mean is not pulled up by the highest windows.
    busy = np.log(np.clip(p["busy_power_w"].to_numpy(float), 1.0, None))
    return TreeEnsemble.from_sklearn(make().fit(x, busy))
