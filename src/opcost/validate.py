"""Validation: summed operations against whole networks, predictions against measurements.

Two questions (thesis chapter 5), each a table under ``results/validation/``:

* :func:`dataset_validation` (5.1): is the sum of a network's measured operations, each
  times how often it occurs, close to the measurement of the whole network? Per GPU
  configuration, setting, mode and model-input set, over all its ops and over its module
  ops only: the sum ``S = Σ c_i x_i``, its spread ``σ_S = sqrt(Σ (c_i σ_i)²)``, the
  ratio to the measured network, ``z``, the GPU-busy share and the overlap estimate.
  :func:`validation_summary` makes the report's CSV of it.
* :func:`prediction_ops`, :func:`prediction_networks`, :func:`prediction_metrics` (5.2):
  the held-out ops and left-out networks that training wrote, with their errors
  (:mod:`opcost.model.accuracy`), summarised per GPU configuration, mode, quantity and
  op type; :func:`configuration_choice`: whether the predictions pick the measured best
  GPU configuration and setting.

docs/validation.md gives the method (formulas, what the sigmas hold) and the current
findings; docs/formats.md the columns::

    table = dataset_validation(dataset, read_network_ops(op_table_paths))
    metrics = prediction_metrics(prediction_ops(holdouts), prediction_networks(networks))
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from opcost.errors import OpcostError
from opcost.io import read_parquet
from opcost.model.accuracy import error_summary, relative_error
from opcost.model.format import HOLDOUT_COLUMNS, NETWORK_COLUMNS

#: Which operations a sum includes: all of them, or module operations only.
OPS_INCLUDED = ("all", "module")
QUANTITIES = ("time", "power", "energy")
#: Measured and predicted column of each quantity in the predictors' tables.
QUANTITY_COLUMNS = {
    "time": ("time_s", "time_pred_s"),
    "power": ("power_w", "power_pred_w"),
    "energy": ("energy_j", "energy_pred_j"),
}
NETWORK_OPS_COLUMNS = ["model_input", "op_id", "kind", "count"]
#: The columns of the training stage's tables (:mod:`opcost.model.format`) that this
#: stage needs; it keeps the others. The baseline is not validated here, and the GPU of
#: a network prediction is the one whose directory holds the file.
HOLDOUT_NEEDED = [
    c
    for c in HOLDOUT_COLUMNS
    if c not in ("low_power_samples", "time_baseline_s", "power_baseline_w")
]
NETWORK_NEEDED = [
    c
    for c in NETWORK_COLUMNS
    if c
    not in ("gpu", "power_w", "time_sum_ops_s", "energy_sum_ops_j", "n_ops_measured", "n_calls")
]
_KEYS = ["gpu", "setting", "mode"]


class ValidationError(OpcostError, ValueError):
    """Validation inputs are inconsistent; the message names what to fix."""


def read_network_ops(paths: Iterable[str | Path]) -> pd.DataFrame:
    """The operations tables of model-input sets (``results/ops/{model_input}.parquet``).

    Returns:
        One row per (model_input, op_id): ``model_input``, ``op_id``, ``kind``
        (``module`` or ``function``), ``count``.
    """
    tables = [read_parquet(p, NETWORK_OPS_COLUMNS)[NETWORK_OPS_COLUMNS] for p in paths]
    if not tables:
        return pd.DataFrame(columns=NETWORK_OPS_COLUMNS)
    return pd.concat(tables, ignore_index=True)


def _weighted_sum(count: pd.Series, value: pd.Series) -> float:
    # NaN, not a partial sum, where a value is missing (time-only data has no energy) or
    # nothing was measured: a partial sum would look like a measurement.
    if value.empty or value.isna().any():
        return math.nan
    return float((count * value).sum())


def _quadrature(count: pd.Series, sigma: pd.Series) -> float:
    if sigma.isna().any():
        return math.nan
    return float(np.sqrt(((count * sigma) ** 2).sum()))


def _compare(sum_: float, sigma_sum: float, measured: float, sigma_measured: float) -> dict:
    ratio = sum_ / measured if measured > 0 else math.nan
    spread = math.hypot(sigma_sum, sigma_measured)
    z = (sum_ - measured) / spread if spread > 0 else math.nan
    return {"ratio": ratio, "rel_diff": ratio - 1, "z": z}


def dataset_validation(dataset: pd.DataFrame, network_ops: pd.DataFrame) -> pd.DataFrame:
    """Summed operation measurements against measured whole networks (thesis 5.1).

    Args:
        dataset: Rows of ``results/dataset/{gpu}.parquet`` (one or more GPU
            configurations): ``kind``, ``gpu``, ``setting``, ``mode``, ``op_id``,
            ``model_input``, ``time_s``, ``sigma_time_s``, ``energy_j``, ``sigma_energy_j``,
            ``power_w``, ``sigma_power_w``, ``low_power_samples`` and the conditions.
        network_ops: :func:`read_network_ops` of the study's model-input sets.

    Returns:
        The table described in the module docstring, sorted by gpu, setting, mode,
        model_input and ops_included.

    Raises:
        ValidationError: a column is missing, or an operations table lists an op twice.
    """
    needed = {
        "kind",
        "gpu",
        "setting",
        "mode",
        "op_id",
        "model_input",
        "time_s",
        "sigma_time_s",
        "energy_j",
        "sigma_energy_j",
        "power_w",
        "sigma_power_w",
        "low_power_samples",
    }
    missing = sorted(needed - set(dataset.columns))
    if missing:
        raise ValidationError(
            f"the dataset lacks columns {missing}; rerun the evaluate stage (opcost.evaluate)"
        )
    if network_ops.duplicated(["model_input", "op_id"]).any():
        raise ValidationError("an operations table lists an op_id twice; rerun the extract stage")
    ops = dataset[dataset["kind"] == "op"]
    nets = dataset[dataset["kind"] == "network"]
    rows = []
    combos = dataset[_KEYS].drop_duplicates().sort_values(_KEYS).itertuples(index=False)
    model_inputs = sorted(network_ops["model_input"].unique())
    for gpu, setting, mode in combos:
        here = ops[(ops["gpu"] == gpu) & (ops["setting"] == setting) & (ops["mode"] == mode)]
        measured_ops = here.drop_duplicates("op_id").set_index("op_id")
        net_here = nets[
            (nets["gpu"] == gpu) & (nets["setting"] == setting) & (nets["mode"] == mode)
        ]
        for model_input in model_inputs:
            net = net_here[net_here["model_input"] == model_input]
            net_row = net.iloc[0] if len(net) else None
            table = network_ops[network_ops["model_input"] == model_input]
            all_sum = None
            for included in OPS_INCLUDED:
                part = table if included == "all" else table[table["kind"] == "module"]
                row = _validation_row(part, measured_ops, net_row)
                if included == "all":
                    all_sum = (row["time_sum_s"], row["energy_sum_j"])
                row["time_share_of_all"] = _ratio(row["time_sum_s"], all_sum[0])
                row["energy_share_of_all"] = _ratio(row["energy_sum_j"], all_sum[1])
                rows.append(
                    {
                        "gpu": gpu,
                        "setting": setting,
                        "mode": mode,
                        "model_input": model_input,
                        "ops_included": included,
                        **row,
                    }
                )
    table = pd.DataFrame(rows, columns=list(_VALIDATION_DTYPES))
    table = table.astype(_VALIDATION_DTYPES)
    table["size_class"] = table["model_input"].map(size_classes(table)).astype(_STR)
    return (
        table[VALIDATION_COLUMNS]
        .sort_values(["gpu", "setting", "mode", "model_input", "ops_included"])
        .reset_index(drop=True)
    )


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) and b > 0 else math.nan


def _validation_row(part: pd.DataFrame, measured_ops: pd.DataFrame, net: pd.Series | None) -> dict:
    found = part[part["op_id"].isin(measured_ops.index)]
    m = measured_ops.loc[found["op_id"]]
    count = found["count"].to_numpy(dtype=float)
    c = pd.Series(count, index=m.index)
    row = {
        "n_ops": len(part),
        "n_op_calls": int(part["count"].sum()),
        "n_ops_missing": len(part) - len(found),
        "n_ops_low_power_samples": int(m["low_power_samples"].fillna(False).astype(bool).sum()),
        "complete": len(found) == len(part),
        "network_measured": net is not None,
        "time_sum_s": _weighted_sum(c, m["time_s"]),
        "sigma_time_sum_s": _quadrature(c, m["sigma_time_s"]),
        "energy_sum_j": _weighted_sum(c, m["energy_j"]),
        "sigma_energy_sum_j": _quadrature(c, m["sigma_energy_j"]),
    }
    row["power_sum_w"] = _ratio(row["energy_sum_j"], row["time_sum_s"])
    if "utilization_gpu_pct" in m.columns:
        row["gpu_busy_sum_s"] = _weighted_sum(c, m["time_s"] * m["utilization_gpu_pct"] / 100)
    else:
        row["gpu_busy_sum_s"] = math.nan
    row["gpu_busy_measured_s"] = (
        _net_value(net, "time_s") * _net_value(net, "utilization_gpu_pct") / 100
    )
    row["gpu_busy_rel_diff"] = _ratio(row["gpu_busy_sum_s"], row["gpu_busy_measured_s"]) - 1
    for quantity, unit in (("time", "s"), ("energy", "j")):
        measured = _net_value(net, f"{quantity}_{unit}")
        sigma_measured = _net_value(net, f"sigma_{quantity}_{unit}")
        row[f"{quantity}_measured_{unit}"] = measured
        row[f"sigma_{quantity}_measured_{unit}"] = sigma_measured
        compared = _compare(
            row[f"{quantity}_sum_{unit}"],
            row[f"sigma_{quantity}_sum_{unit}"],
            measured,
            sigma_measured,
        )
        for k, v in compared.items():
            row[f"{quantity}_{k}"] = v
    host_only = row["time_sum_s"] - row["gpu_busy_sum_s"]
    row["time_overlap_sum_s"] = max(row["gpu_busy_sum_s"], host_only)  # NaN without utilization
    row["time_overlap_rel_diff"] = _ratio(row["time_overlap_sum_s"], row["time_measured_s"]) - 1
    row["power_measured_w"] = _net_value(net, "power_w")
    row["sigma_power_measured_w"] = _net_value(net, "sigma_power_w")
    for column in (
        "sm_clock_mhz",
        "power_limit_w",
        "requested_sm_clock_mhz",
        "requested_power_limit_w",
    ):
        row[column] = _net_value(net, column)
    row["measured_at_unix_s"] = _net_value(net, "timed_start_unix_s")
    name = net.get("gpu_name") if net is not None else None
    row["gpu_name"] = name if isinstance(name, str) else None
    return row


def _net_value(net: pd.Series | None, key: str) -> float:
    """A number of the network's dataset row; NaN where there is no row or value."""
    if net is None or key not in net.index or pd.isna(net[key]):
        return math.nan
    return float(net[key])


_STR = "str" if int(pd.__version__.split(".")[0]) >= 3 else object
_VALIDATION_DTYPES = {
    "gpu": _STR,
    "setting": _STR,
    "mode": _STR,
    "model_input": _STR,
    "ops_included": _STR,
    "n_ops": "int64",
    "n_op_calls": "int64",
    "n_ops_missing": "int64",
    "n_ops_low_power_samples": "int64",
    "complete": "bool",
    "network_measured": "bool",
    "time_sum_s": "float64",
    "sigma_time_sum_s": "float64",
    "time_measured_s": "float64",
    "sigma_time_measured_s": "float64",
    "time_ratio": "float64",
    "time_rel_diff": "float64",
    "time_z": "float64",
    "time_share_of_all": "float64",
    "energy_sum_j": "float64",
    "sigma_energy_sum_j": "float64",
    "energy_measured_j": "float64",
    "sigma_energy_measured_j": "float64",
    "energy_ratio": "float64",
    "energy_rel_diff": "float64",
    "energy_z": "float64",
    "energy_share_of_all": "float64",
    "power_sum_w": "float64",
    "gpu_busy_sum_s": "float64",
    "gpu_busy_measured_s": "float64",
    "gpu_busy_rel_diff": "float64",
    "time_overlap_sum_s": "float64",
    "time_overlap_rel_diff": "float64",
    "power_measured_w": "float64",
    "sigma_power_measured_w": "float64",
    "sm_clock_mhz": "float64",
    "power_limit_w": "float64",
    "requested_sm_clock_mhz": "float64",
    "requested_power_limit_w": "float64",
    "gpu_name": _STR,
    "measured_at_unix_s": "float64",
}
VALIDATION_COLUMNS = [*list(_VALIDATION_DTYPES)[:5], "size_class", *list(_VALIDATION_DTYPES)[5:]]


def size_classes(table: pd.DataFrame) -> dict[str, str]:
    """Split model-input sets into ``small`` and ``large`` by measured network time.

    A set's size is the geometric mean of its measured whole-network ``time_s`` over every
    GPU configuration, setting and mode it was measured in. Sets at or above the median
    size of the study's sets are ``large``, the rest ``small`` (a set never measured as a
    whole network is ``small``). Time, not input shape, because the same input shape
    makes a light and a heavy network (squeezenet1_1 and vgg11 at one shape), and because
    the thesis's small/large split (tables I and II) follows how long a network runs.

    Args:
        table: Rows with ``model_input`` and ``time_measured_s`` (the validation table) or
            ``time_s`` (network rows of the dataset).
    """
    column = "time_measured_s" if "time_measured_s" in table.columns else "time_s"
    times = table[["model_input", column]].drop_duplicates()
    positive = times[times[column] > 0]
    size = np.exp(np.log(positive[column]).groupby(positive["model_input"]).mean())
    names = sorted(table["model_input"].unique())
    if size.empty:
        return dict.fromkeys(names, "small")
    median = float(np.median(size.to_numpy()))
    return {mi: "large" if size.get(mi, -math.inf) >= median else "small" for mi in names}


def with_errors(table: pd.DataFrame, quantities: Sequence[str] = QUANTITIES) -> pd.DataFrame:
    """``table`` plus ``{q}_rel_err`` (pred / measured - 1) and ``{q}_ape_pct`` per quantity."""
    out = table.copy()
    for q in quantities:
        measured, pred = QUANTITY_COLUMNS[q]
        if measured not in out.columns or pred not in out.columns:
            continue
        rel = relative_error(out[pred], out[measured])
        out[f"{q}_rel_err"] = rel
        out[f"{q}_ape_pct"] = rel.abs() * 100
    return out


def short_op_type(op_type: str) -> str:
    """A readable operation type: ``torch.nn.modules.conv.Conv2d`` -> ``Conv2d``."""
    if not isinstance(op_type, str):
        return "?"
    if op_type.startswith("torch.nn.modules."):
        return op_type.rsplit(".", 1)[-1]
    return op_type.removeprefix("torch.")


def prediction_ops(holdout: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Held-out operations of every GPU configuration with their prediction errors.

    Args:
        holdout: ``results/predictors/{gpu}/holdout_predictions.parquet`` tables (columns
            :data:`HOLDOUT_NEEDED`).

    Returns:
        The rows concatenated, plus ``op_name`` (:func:`short_op_type`) and, for each of
        time, power and energy, ``{q}_rel_err`` and ``{q}_ape_pct``.
    """
    frames = [_checked(h, HOLDOUT_NEEDED, "holdout predictions") for h in holdout]
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=HOLDOUT_NEEDED)
    table = with_errors(table)
    table["op_name"] = table["op_type"].map(short_op_type).astype(_STR)
    return table


def prediction_networks(network_predictions: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Leave-one-network-out predictions of every GPU configuration, with their errors.

    Args:
        network_predictions: GPU configuration -> its
            ``results/predictors/{gpu}/network_predictions.parquet`` (columns
            :data:`NETWORK_NEEDED`); its ``gpu`` is the key, the configuration whose
            directory holds the file.

    Returns:
        One row per (gpu, setting, mode, model_input), with ``gpu`` first and, for time,
        power and energy, ``{q}_rel_err`` and ``{q}_ape_pct``. ``power_w`` (measured) is
        ``energy_j / time_s``.
    """
    frames = []
    for gpu, frame in network_predictions.items():
        frame = _checked(frame, NETWORK_NEEDED, f"network predictions of {gpu}")
        frames.append(frame.assign(gpu=gpu))
    if not frames:
        return pd.DataFrame(columns=["gpu", *NETWORK_NEEDED])
    table = pd.concat(frames, ignore_index=True)
    table = table[["gpu", *[c for c in table.columns if c != "gpu"]]]
    if "power_w" not in table.columns:
        table["power_w"] = table["energy_j"] / table["time_s"].where(table["time_s"] > 0)
    return (
        with_errors(table)
        .sort_values(["gpu", "setting", "mode", "model_input"])
        .reset_index(drop=True)
    )


def _checked(frame: pd.DataFrame, columns: list[str], what: str) -> pd.DataFrame:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValidationError(
            f"the {what} lack columns {missing}; rerun the train stage (docs/formats.md)"
        )
    return frame


def prediction_metrics(pred_ops: pd.DataFrame, pred_networks: pd.DataFrame) -> pd.DataFrame:
    """Accuracy summary at the operation and the network level.

    Operation level: per gpu, mode, quantity, and operation type (``op_name``; ``all`` for
    every type together), settings pooled. Network level: per gpu, mode and quantity over
    all leave-one-network-out predictions (``op_name`` = ``network``), settings pooled.

    Returns:
        Columns ``level`` (``op`` or ``network``), ``gpu``, ``mode``, ``quantity``,
        ``op_name`` and those of :func:`error_summary`.
    """
    rows = []
    for level, table in (("op", pred_ops), ("network", pred_networks)):
        if table.empty:
            continue
        for (gpu, mode), group in table.groupby(["gpu", "mode"], sort=True):
            for q in QUANTITIES:
                measured, pred = QUANTITY_COLUMNS[q]
                if measured not in group or pred not in group:
                    continue
                parts = [("all" if level == "op" else "network", group)]
                if level == "op":
                    parts += list(group.groupby("op_name", sort=True))
                for name, part in parts:
                    summary = error_summary(part[measured].to_numpy(), part[pred].to_numpy())
                    rows.append(
                        {"level": level, "gpu": gpu, "mode": mode, "quantity": q, "op_name": name}
                        | summary
                    )
    columns = ["level", "gpu", "mode", "quantity", "op_name", *error_summary([], [])]
    return pd.DataFrame(rows, columns=columns)


def validation_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The dataset validation as a readable table (the report's CSV).

    Times in ms, energies in mJ, relative differences and shares in percent, 4 significant
    digits; one row per gpu, setting, mode, model-input set and ``ops_included``.
    """
    out = table[
        ["gpu", "setting", "mode", "model_input", "size_class", "ops_included", "n_op_calls"]
    ].copy()
    out["n_ops_missing"] = table["n_ops_missing"]
    for quantity, unit, scale in (("time", "s", 1e3), ("energy", "j", 1e3)):
        short = "ms" if quantity == "time" else "mj"
        out[f"{quantity}_sum_{short}"] = table[f"{quantity}_sum_{unit}"] * scale
        out[f"sigma_{quantity}_sum_{short}"] = table[f"sigma_{quantity}_sum_{unit}"] * scale
        out[f"{quantity}_measured_{short}"] = table[f"{quantity}_measured_{unit}"] * scale
        out[f"sigma_{quantity}_measured_{short}"] = (
            table[f"sigma_{quantity}_measured_{unit}"] * scale
        )
        out[f"{quantity}_rel_diff_pct"] = table[f"{quantity}_rel_diff"] * 100
        out[f"{quantity}_z"] = table[f"{quantity}_z"]
        out[f"{quantity}_share_of_all_pct"] = table[f"{quantity}_share_of_all"] * 100
    numeric = out.select_dtypes("float").columns
    out[numeric] = out[numeric].apply(lambda c: c.map(lambda v: float(f"{v:.4g}")))
    return out


#: What :func:`configuration_choice` compares: (measured column, predicted column, name).
CHOICE_QUANTITIES = (
    ("time_s", "time_pred_s", "fastest"),
    ("energy_j", "energy_pred_j", "least_energy"),
)


def _pick(values: pd.Series, label: pd.Series) -> tuple[str, float]:
    """The label of the smallest of at least two values (the first of equals), and its
    lead: the runner-up over it, less 1."""
    ranked = values.astype(float).sort_values(kind="stable")
    return label.loc[ranked.index[0]], ranked.iloc[1] / ranked.iloc[0] - 1.0


def configuration_choice(networks: pd.DataFrame) -> pd.DataFrame:
    """Which GPU configuration (and setting) runs each network fastest, and with least energy.

    Args:
        networks: :func:`prediction_networks`' table (leave-one-network-out predictions
            of every GPU configuration: each network predicted by a model that never saw
            its operations).

    Returns:
        One row per (model_input, mode) measured on at least two candidates (a candidate
        is a ``gpu``/``setting`` pair with a measured and a predicted value): ``candidates``,
        and for ``fastest`` and ``least_energy`` the candidate the measurements name
        (``measured_fastest``, as ``gpu/setting``), the one the predictions name
        (``predicted_fastest``), whether they agree (``fastest_agrees``), and by how much
        the measured best beats the measured runner-up (``fastest_margin``: runner-up over
        best, less 1; a margin inside the measurements' run-to-run spread is a tie, and
        a disagreement there costs little), and the same lead in the predictions
        (``fastest_predicted_margin``: how sure the predictions are of their pick).
        Ties go to the first candidate in ``gpu``, ``setting`` order.
    """
    rows = []
    table = networks.sort_values(["gpu", "setting"])
    for (model_input, mode), part in table.groupby(["model_input", "mode"], sort=True):
        row: dict = {"model_input": model_input, "mode": mode}
        for measured, predicted, name in CHOICE_QUANTITIES:
            known = part.dropna(subset=[measured, predicted])
            label = known["gpu"] + "/" + known["setting"]
            if len(known) < 2:
                row.update({f"measured_{name}": None, f"predicted_{name}": None})
                row[f"{name}_agrees"] = None
                row[f"{name}_margin"] = float("nan")
                row[f"{name}_predicted_margin"] = float("nan")
                continue
            row[f"measured_{name}"], row[f"{name}_margin"] = _pick(known[measured], label)
            row[f"predicted_{name}"], row[f"{name}_predicted_margin"] = _pick(
                known[predicted], label
            )
            row[f"{name}_agrees"] = row[f"measured_{name}"] == row[f"predicted_{name}"]
        row["candidates"] = int(part.dropna(subset=["time_s", "time_pred_s"]).shape[0])
        if row["fastest_agrees"] is not None or row["least_energy_agrees"] is not None:
            rows.append(row)
    columns = ["model_input", "mode", "candidates"] + [
        f"{kind}_{name}" for _, _, name in CHOICE_QUANTITIES for kind in ("measured", "predicted")
    ]
    columns += [f"{name}_agrees" for _, _, name in CHOICE_QUANTITIES]
    columns += [f"{name}_margin" for _, _, name in CHOICE_QUANTITIES]
    columns += [f"{name}_predicted_margin" for _, _, name in CHOICE_QUANTITIES]
    return pd.DataFrame(rows, columns=columns)
