"""Dataset validation: summed operation measurements against measured whole networks.

Per GPU configuration, setting, mode and model-input set, over all its ops and over its
module ops only (thesis 5.1): the sum ``S = Σ c_i x_i``, its spread
``σ_S = sqrt(Σ (c_i σ_i)²)``, the ratio to the measured network, ``z``, the GPU-busy
share and the overlap estimate (:func:`dataset_validation`; its columns are
:data:`opcost.schemas.VALIDATION`). :func:`validation_summary` makes the report's CSV of
it. docs/validation.md gives the method (formulas, what the sigmas hold)::

    table = dataset_validation(dataset, read_network_ops(op_table_paths))
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from opcost.io import read_parquet
from opcost.schemas import VALIDATION
from opcost.validate import ValidationError

#: Which operations a sum includes: all of them, or module operations only.
OPS_INCLUDED = ("all", "module")
NETWORK_OPS_COLUMNS = ["model_input", "op_id", "kind", "count"]
_KEYS = ["gpu", "setting", "mode"]


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
        The table of :data:`opcost.schemas.VALIDATION`, sorted by gpu, setting, mode,
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
    dtypes = VALIDATION.dtypes()
    size_class = dtypes.pop("size_class")
    table = pd.DataFrame(rows, columns=list(dtypes)).astype(dtypes)
    table["size_class"] = table["model_input"].map(size_classes(table)).astype(size_class)
    return (
        table[list(VALIDATION.names)]
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
