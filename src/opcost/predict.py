"""Prediction: time, power and energy of any network on every trained GPU configuration.

:func:`predict_networks` predicts every op of an op table (``opcost extract``) on every
predictor, sums each network over its ops, each counted as often as it runs (thesis
4.3: ``time = Σ count·t_op``, ``energy = Σ count·e_op``, power = energy / time), and
names the best GPU configuration and setting per network, mode and criterion (time,
energy, energy-delay product), with the runner-up and whether the margin lies within
the predictors' leave-one-network-out error. It also reports the energy of choosing a
setting per op, and ops that extrapolate beyond the training data::

    predictors = load_predictors("results/predictors")
    result = predict_networks(predictors, read_ops_table("ops.parquet"))
    result.table, result.best

Importing this module needs neither torch nor scikit-learn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opcost.io import read_parquet
from opcost.model import PredictorError
from opcost.model.format import load_predictor, load_predictors
from opcost.model.predictor import UNSEEN_TYPE, Predictor, sum_by_count
from opcost.names import MODES

NEEDS_SETTINGS = "needs more than one setting"
NO_POWER = "no power model (time-only data)"


@dataclass
class NetworkPrediction:
    """Predictions for one or more networks over every GPU configuration and setting.

    Attributes:
        table: one row per network, GPU, setting and mode: ``network``, ``gpu``,
            ``setting``, ``mode``, ``time_s``, ``power_w``, ``energy_j``, ``edp_js``
            (energy-delay product, J·s), ``n_ops`` (distinct), ``n_calls``,
            ``n_extrapolated`` (distinct ops flagged), and ``best_time``,
            ``best_energy``, ``best_edp`` (bool, per network and mode).
        best: one row per network, mode and criterion (``time``, ``energy``, ``edp``):
            ``gpu``, ``setting``, ``value`` (NaN-free rows only); the runner-up
            (``runner_up_gpu``, ``runner_up_setting``, ``runner_up_value``), ``margin``
            (runner-up / best - 1), ``lono_mape_pct`` (the larger leave-one-network-out
            error of the two predictors for this mode and criterion; NaN for ``edp`` or
            where training recorded none) and ``within_error`` (``margin`` below it:
            the predictors cannot tell the two apart; None where unknown).
        per_op: one row per network, GPU and mode: the energy of choosing the best setting
            for each op against the best single setting (``status`` says why not).
        extrapolation: flagged ops: ``network``, ``gpu``, ``op_id``, ``type``,
            ``count``, ``reason``.
        op_predictions: every op's prediction (``network``, ``gpu``, ``op_id``,
            ``setting``, ``mode``, ``count``, ``time_pred_s``, ``power_pred_w``,
            ``energy_pred_j``).
    """

    table: pd.DataFrame
    best: pd.DataFrame
    per_op: pd.DataFrame
    extrapolation: pd.DataFrame
    op_predictions: pd.DataFrame


def _per_op_choice(pred: pd.DataFrame, predictor: Predictor, network: str) -> list[dict]:
    rows = []
    for mode, group in pred.groupby("mode", sort=False):
        row: dict[str, Any] = {"network": network, "gpu": predictor.gpu, "mode": mode}
        settings = sorted(set(group["setting"]))
        energy = group["energy_pred_j"] * group["count"]
        if predictor.power_model is None:
            row["status"] = NO_POWER
        elif len(settings) < 2:
            row["status"] = f"{NEEDS_SETTINGS} (trained: {', '.join(settings)})"
        else:
            totals = energy.groupby(group["setting"]).sum()
            best_single = str(totals.idxmin())
            per_op = energy.groupby(group["op_id"]).min().sum()
            row.update(
                status="ok",
                best_single_setting=best_single,
                best_single_energy_j=float(totals.min()),
                per_op_energy_j=float(per_op),
                saving_pct=float(100.0 * (totals.min() - per_op) / totals.min()),
            )
        rows.append(row)
    return rows


PER_OP_COLUMNS = [
    "network",
    "gpu",
    "mode",
    "status",
    "best_single_setting",
    "best_single_energy_j",
    "per_op_energy_j",
    "saving_pct",
]


def predict_networks(
    predictors: dict[str, Predictor],
    ops: pd.DataFrame,
    modes: Sequence[str] | None = None,
    progress: bool = False,
) -> NetworkPrediction:
    """Predict networks from their op tables on every predictor.

    Args:
        predictors: GPU configuration -> predictor (:func:`load_predictors`).
        ops: op table(s) as ``opcost extract`` writes them: ``op_id``, ``spec``,
            ``count``, and ``model_input`` (the network; one network if absent).
        modes: modes to predict (default: every mode some predictor was trained for).
        progress: show a progress bar over the GPU configurations (stderr).

    Raises:
        PredictorError: a requested mode that no predictor was trained for, or an empty
            op table.
    """
    if ops.empty:
        raise PredictorError("the network has no operations to predict")
    ops = ops.copy()
    if "model_input" not in ops.columns:
        ops["model_input"] = "network"
    trained_modes = {m for p in predictors.values() for m in p.modes}
    if modes is None:
        modes = [m for m in MODES if m in trained_modes]
    unknown = sorted(set(modes) - trained_modes)
    if unknown:
        raise PredictorError(
            f"no predictor was trained for mode {unknown[0]!r} "
            f"(trained: {', '.join(sorted(trained_modes))})"
        )
    gpus = sorted(predictors)
    if progress:  # tqdm only when asked for: its import alone takes about 30 ms
        from tqdm import tqdm

        gpus = tqdm(gpus, desc="predict", unit="gpu")
    preds, per_op, flagged = [], [], []
    for gpu in gpus:
        p = predictors[gpu]
        gpu_modes = [m for m in modes if m in p.modes]
        if not gpu_modes:
            continue
        op_pred = p.predict_ops(ops, modes=gpu_modes)
        flags = p.extrapolation(ops)
        for network, net_ops in ops.groupby("model_input", sort=False):
            merged = net_ops[["op_id", "count"]].merge(op_pred, on="op_id")
            merged.insert(0, "network", network)
            preds.append(merged)
            per_op += _per_op_choice(merged, p, str(network))
            f = net_ops[["op_id", "count"]].merge(flags, on="op_id")
            f.insert(0, "network", network)
            # Unseen types first, then by calls: the least trustworthy, most weighty first.
            order = np.lexsort((-f["count"].to_numpy(), f["reason"].to_numpy() != UNSEEN_TYPE))
            flagged.append(f.iloc[order])
    op_predictions = pd.concat(preds, ignore_index=True)
    totals = sum_by_count(op_predictions, ["network", "gpu", "setting", "mode"])
    shape = ops.groupby("model_input", sort=False).agg(
        n_ops=("op_id", "nunique"), n_calls=("count", "sum")
    )
    extrapolation = pd.concat(flagged, ignore_index=True)[
        ["network", "gpu", "op_id", "type", "count", "reason"]
    ]
    n_flagged = extrapolation.groupby(["network", "gpu"])["op_id"].nunique()
    table = totals.rename(
        columns={"time_pred_s": "time_s", "energy_pred_j": "energy_j", "power_pred_w": "power_w"}
    )[["network", "gpu", "setting", "mode", "time_s", "power_w", "energy_j"]]
    table["edp_js"] = table["energy_j"] * table["time_s"]
    table = table.join(shape, on="network")
    table["n_extrapolated"] = [
        int(n_flagged.get((n, g), 0)) for n, g in zip(table["network"], table["gpu"], strict=True)
    ]
    best = best_choices(
        table, lambda gpu, mode, c: predictors[gpu].lono_mape_pct.get(mode, {}).get(c)
    )
    return NetworkPrediction(
        table=table.sort_values(["network", "mode", "gpu", "setting"], ignore_index=True),
        best=best,
        per_op=pd.DataFrame(per_op).reindex(columns=PER_OP_COLUMNS),
        extrapolation=extrapolation,
        op_predictions=op_predictions,
    )


def best_choices(
    table: pd.DataFrame, lono_pct: Callable[[str, str, str], float | None]
) -> pd.DataFrame:
    """The best GPU configuration and setting per network, mode and criterion (time,
    energy, energy-delay product) of a prediction table, with the runner-up; marks the
    best rows (``best_time``, ``best_energy``, ``best_edp``) in ``table``.
    ``lono_pct(gpu, mode, criterion)`` is a predictor's leave-one-network-out error (%), or
    None where unknown."""
    best_rows = []
    for criterion, column in (("time", "time_s"), ("energy", "energy_j"), ("edp", "edp_js")):
        flag = f"best_{criterion}"
        table[flag] = False
        for (network, mode), group in table.groupby(["network", "mode"], sort=False):
            values = group[column].dropna().sort_values(kind="stable")
            if values.empty:
                continue
            i = values.index[0]
            table.loc[i, flag] = True
            best_rows.append(
                {
                    "network": network,
                    "mode": mode,
                    "criterion": criterion,
                    "gpu": table.loc[i, "gpu"],
                    "setting": table.loc[i, "setting"],
                    "value": float(values.iloc[0]),
                    **_runner_up(table, values, lono_pct, str(mode), criterion),
                }
            )
    return pd.DataFrame(best_rows, columns=BEST_COLUMNS)


BEST_COLUMNS = [
    "network",
    "mode",
    "criterion",
    "gpu",
    "setting",
    "value",
    "runner_up_gpu",
    "runner_up_setting",
    "runner_up_value",
    "margin",
    "lono_mape_pct",
    "within_error",
]


def _runner_up(
    table: pd.DataFrame,
    values: pd.Series,
    lono_pct: Callable[[str, str, str], float | None],
    mode: str,
    criterion: str,
) -> dict[str, Any]:
    """The second-best choice of ``values`` (sorted, best first), by how much the best
    wins, and whether that lies within the predictors' leave-one-network-out error."""
    if len(values) < 2:
        return {"margin": np.nan, "lono_mape_pct": np.nan, "within_error": None}
    best, second = values.index[0], values.index[1]
    margin = float(values.iloc[1] / values.iloc[0] - 1.0)
    errors = [lono_pct(table.loc[i, "gpu"], mode, criterion) for i in (best, second)]
    known = None not in errors
    lono = max(errors) if known else np.nan
    return {
        "runner_up_gpu": table.loc[second, "gpu"],
        "runner_up_setting": table.loc[second, "setting"],
        "runner_up_value": float(values.iloc[1]),
        "margin": margin,
        "lono_mape_pct": lono,
        "within_error": bool(100.0 * margin < lono) if known else None,
    }


def read_ops_table(path: str | Path) -> pd.DataFrame:
    """An op table from ``opcost extract --out`` or the extract stage (needs ``op_id``, ``spec``,
    ``count``; ``model_input`` names the network)."""
    return read_parquet(path, columns=["op_id", "spec", "count"])


__all__ = [
    "NetworkPrediction",
    "PredictorError",
    "load_predictor",
    "load_predictors",
    "predict_networks",
    "read_ops_table",
]
