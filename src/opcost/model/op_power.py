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
from opcost.model.shares import busy_share
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
    predicted = model.predict(p[["spec", "mode", "op_type"]], isolated=True)["busy_power_w"]
    predicted = predicted.to_numpy()
    return pd.DataFrame(
        {
            "family": p["family"].to_numpy(),
            "mode": p["mode"].to_numpy(),
            "measured_w": measured,
            "predicted_w": predicted,
            "err": predicted / measured - 1.0,
        }
    )


def _busy_windows(rows: pd.DataFrame, wait_w: float | None = None) -> pd.DataFrame:
    """The power windows of ``rows`` (:func:`power_windows`) with their ``busy_power_w``
    (:func:`window_busy_power_w`; ``wait_w``, else the rows' own :func:`wait_power_w`)."""
    p = power_windows(rows)
    wait_w = wait_power_w(rows) if wait_w is None else wait_w
    return p.assign(busy_power_w=window_busy_power_w(p, wait_w).to_numpy(float))


def _ratios(mine: pd.DataFrame, theirs: pd.DataFrame) -> tuple[dict[str, float], float, int]:
    """:func:`peer_ratios` of two GPUs' windows of :func:`_busy_windows`."""
    a = pd.Series(mine["busy_power_w"].to_numpy(float), index=sample_keys(mine).to_numpy())
    a = a[~a.index.duplicated()]
    keys = sample_keys(theirs).to_numpy()
    both = np.isin(keys, a.index)
    b = theirs["busy_power_w"].to_numpy(float)[both]
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


def _carried(mine: pd.DataFrame, theirs: pd.DataFrame) -> pd.DataFrame:
    """:func:`peer_windows` of two GPUs' windows of :func:`_busy_windows`."""
    fresh = theirs[~sample_keys(theirs).isin(set(sample_keys(mine)))]
    fresh = fresh[~sample_keys(fresh).duplicated()]
    if fresh.empty:
        return fresh
    ratios, overall, _ = _ratios(mine, theirs)
    scale = fresh["family"].map(lambda f: ratios.get(str(f), overall)).to_numpy(float)
    return fresh.assign(busy_power_w=fresh["busy_power_w"].to_numpy(float) * scale)


def peer_ratios(own: pd.DataFrame, peer: pd.DataFrame) -> tuple[dict[str, float], float, int]:
    """Per family, the median ratio of busy power, own over peer, of the power windows
    (:func:`power_windows`) both ``own`` and ``peer`` measured (same op id and mode), each
    side's busy power with its own wait power; the median over all families; the number of
    such pairs. A family with fewer than :data:`MIN_POWER_PAIRS` takes the median over all
    (1.0 with no pairs at all)."""
    return _ratios(_busy_windows(own), _busy_windows(peer))


def peer_windows(own: pd.DataFrame, peer: pd.DataFrame) -> pd.DataFrame:
    """The power windows of ``peer`` (another GPU's rows, :func:`power_windows`) whose
    configuration and mode ``own`` has no window of, carried over to ``own``'s GPU: column
    ``busy_power_w`` the peer's busy power (with its wait power) times the family's ratio
    of :func:`peer_ratios`."""
    return _carried(_busy_windows(own), _busy_windows(peer))


def fit(
    model: Any, rows: pd.DataFrame, make: Any, peer: pd.DataFrame | None = None
) -> TreeEnsemble | None:
    """The busy-power model of ``model`` (an :class:`~opcost.model.opmodel.OpModel`, its
    time models fitted) from the power windows of ``rows`` and, with ``peer`` (the rows
    another GPU measured), those only the peer has (:func:`peer_windows`); None with
    fewer than 5."""
    p = _busy_windows(rows, model.wait_power_w)
    if peer is not None and len(peer):
        p = pd.concat([p, _carried(p, _busy_windows(peer))], ignore_index=True)
    if len(p) < 5:
        return None
    # The windows measured the ops alone: their features are the isolated predictions.
    pred = model.predict(p[["spec", "mode", "op_type"]], isolated=True)
    x = features(p["family"], p, pred, model.power_families)
    # Learnt as its log: trees average relative deviations alike, from near-idle power to
    # the limit, and their mean is not pulled up by the highest windows.
    busy = np.log(np.clip(p["busy_power_w"].to_numpy(float), 1.0, None))
    return TreeEnsemble.from_sklearn(make().fit(x, busy))
