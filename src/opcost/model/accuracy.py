"""Prediction errors: relative error, APE, MAPE, and the scores of ``metrics.json``.

One definition for every stage: the relative error of a prediction is
``predicted / measured - 1``, its absolute percentage error (APE) ``|relative error| ·
100``, and the MAPE the mean APE, in percent, over the pairs where both are finite and
the measured value is positive. Power and energy are scored only on rows with usable
power (:func:`usable_power`)::

    mape_pct([110.0, 90.0], [100.0, 100.0])     # 10.0
    error_summary(measured, predicted)["p90_ape_pct"]
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from opcost import __version__


def _pairs(predicted: Any, measured: Any) -> tuple[np.ndarray, np.ndarray]:
    """The comparable pairs: both finite, measured positive."""
    p = np.asarray(predicted, dtype=np.float64)
    m = np.asarray(measured, dtype=np.float64)
    ok = np.isfinite(p) & np.isfinite(m) & (m > 0)
    return p[ok], m[ok]


def relative_error(predicted: Any, measured: Any) -> Any:
    """``predicted / measured - 1`` (NaN where ``measured`` is not positive), elementwise;
    keeps a Series' index."""
    if isinstance(measured, pd.Series):
        m = measured.astype(float)
        return predicted.astype(float) / m.where(m > 0) - 1
    m = np.asarray(measured, dtype=np.float64)
    return np.asarray(predicted, dtype=np.float64) / np.where(m > 0, m, np.nan) - 1


def mape_pct(predicted: Any, measured: Any) -> float:
    """Mean absolute percentage error, percent; NaN where nothing is comparable."""
    p, m = _pairs(predicted, measured)
    if not len(m):
        return math.nan
    return float(np.mean(np.abs(p / m - 1) * 100))


def _r2_log10(measured: np.ndarray, pred: np.ndarray) -> float:
    ok = (measured > 0) & (pred > 0)
    if ok.sum() < 2:
        return math.nan
    y, p = np.log10(measured[ok]), np.log10(pred[ok])
    ss_tot = ((y - y.mean()) ** 2).sum()
    return float(1 - ((y - p) ** 2).sum() / ss_tot) if ss_tot > 0 else math.nan


def error_summary(measured: Any, pred: Any) -> dict[str, float]:
    """Accuracy of predictions ``pred`` of ``measured`` (pairs with a NaN are left out).

    Returns:
        ``n``; ``mape_pct`` (:func:`mape_pct`), ``median_ape_pct``, ``p90_ape_pct``;
        ``median_rel_err_pct`` (signed: > 0 overestimates); ``r2_log10``, the coefficient
        of determination of log10(pred) against log10(measured) (values span orders of
        magnitude, so a plain R² would only reflect the largest ones).
    """
    pred, measured = _pairs(pred, measured)
    if not len(measured):
        return {
            "n": 0,
            "mape_pct": math.nan,
            "median_ape_pct": math.nan,
            "p90_ape_pct": math.nan,
            "median_rel_err_pct": math.nan,
            "r2_log10": math.nan,
        }
    rel = pred / measured - 1
    ape = np.abs(rel) * 100
    return {
        "n": len(measured),
        "mape_pct": float(ape.mean()),
        "median_ape_pct": float(np.median(ape)),
        "p90_ape_pct": float(np.percentile(ape, 90)),
        "median_rel_err_pct": float(np.median(rel) * 100),
        "r2_log10": _r2_log10(measured, pred),
    }


def usable_power(rows: pd.DataFrame) -> pd.Series:
    """Rows whose measured power may be used: finite and not ``low_power_samples``."""
    return np.isfinite(rows["power_w"].astype("float64")) & ~rows["low_power_samples"].astype(bool)


def baseline_predictions(train: pd.DataFrame, test: pd.DataFrame) -> pd.DataFrame:
    """Naive baseline: median time and power of the training rows of the same type and mode.

    A type not in training falls back to the median of its mode.
    """
    power_rows = train[usable_power(train)]
    out = pd.DataFrame(index=test.index)
    for column, source, name in (
        ("time_s", train, "time_baseline_s"),
        ("power_w", power_rows, "power_baseline_w"),
    ):
        by_type = source.groupby(["op_type", "mode"])[column].median()
        by_mode = source.groupby("mode")[column].median()
        keys = pd.MultiIndex.from_arrays([test["op_type"], test["mode"]])
        values = by_type.reindex(keys).to_numpy()
        fallback = by_mode.reindex(test["mode"]).to_numpy()
        out[name] = np.where(np.isnan(values), fallback, values)
    return out


def _op_scores(table: pd.DataFrame, time_col: str, power_col: str) -> dict[str, Any]:
    power_ok = usable_power(table)
    energy_pred = table[time_col] * table[power_col]
    return {
        "n": len(table),
        "n_power": int(power_ok.sum()),
        "time_mape_pct": mape_pct(table[time_col], table["time_s"]),
        "power_mape_pct": mape_pct(table.loc[power_ok, power_col], table.loc[power_ok, "power_w"]),
        "energy_mape_pct": mape_pct(energy_pred[power_ok], table.loc[power_ok, "energy_j"]),
    }


def op_scores(table: pd.DataFrame, *, baseline: bool = False) -> dict[str, Any]:
    """Op-level MAPE of time, power and energy per mode and over all modes (a table of
    ``holdout_predictions.parquet``'s columns; ``baseline``: score the baseline)."""
    cols = ("time_baseline_s", "power_baseline_w") if baseline else ("time_pred_s", "power_pred_w")
    out = {mode: _op_scores(g, *cols) for mode, g in table.groupby("mode", sort=True)}
    out["all"] = _op_scores(table, *cols)
    return out


def network_scores(table: pd.DataFrame, time_col: str, energy_col: str) -> dict[str, Any]:
    """Network-level MAPE of predicted sums against ``time_col``/``energy_col``, per mode
    (a table of ``network_predictions.parquet``'s columns)."""

    def score(g: pd.DataFrame) -> dict[str, Any]:
        power = g[energy_col] / g[time_col]
        return {
            "n": int(g[time_col].notna().sum()),
            "time_mape_pct": mape_pct(g["time_pred_s"], g[time_col]),
            "energy_mape_pct": mape_pct(g["energy_pred_j"], g[energy_col]),
            "power_mape_pct": mape_pct(g["power_pred_w"], power),
        }

    out = {mode: score(g) for mode, g in table.groupby("mode", sort=True)}
    out["all"] = score(table)
    return out


def build_metrics(
    gpu: str,
    rows: pd.DataFrame,
    cfg: Any,
    holdout: pd.DataFrame,
    lono_networks: pd.DataFrame,
    lono_ops: pd.DataFrame,
) -> dict[str, Any]:
    """The content of ``metrics.json``: the scores of :func:`op_scores` and
    :func:`network_scores` on the hold-out and the leave-one-network-out predictions
    (``cfg``: the :class:`opcost.train.TrainConfig` trained with)."""
    return {
        "gpu": gpu,
        "created_unix_s": time.time(),
        "opcost_version": __version__,
        "n_rows": len(rows),
        "n_ops": int(rows["op_id"].nunique()),
        "settings": sorted(set(rows["setting"])),
        "modes": sorted(set(rows["mode"])),
        "regressor": cfg.regressor,
        "train_config": asdict(cfg),
        "time_target": "log(time_s)",
        "mape": "mean(|predicted - measured| / measured) * 100, percent; power and energy "
        "only over rows with usable power (finite, not low_power_samples)",
        "holdout": {
            "n_ops_held_out": int(holdout["op_id"].nunique()),
            "op": op_scores(holdout),
            "baseline_op": op_scores(holdout, baseline=True),
        },
        "lono": {
            "networks": sorted(set(lono_networks["model_input"])),
            "op": op_scores(lono_ops) if len(lono_ops) else {},
            "baseline_op": op_scores(lono_ops, baseline=True) if len(lono_ops) else {},
            "network": network_scores(lono_networks, "time_s", "energy_j"),
            "network_vs_summed_ops": network_scores(
                lono_networks, "time_sum_ops_s", "energy_sum_ops_j"
            ),
        },
    }


def json_safe(obj: Any) -> Any:
    """``obj`` with NaN and infinities as None and NumPy scalars as Python ones."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if isinstance(obj, np.generic):
        return json_safe(obj.item())
    return obj
