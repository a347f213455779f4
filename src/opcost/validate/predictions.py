"""Prediction validation: the predictions training wrote against their measurements.

:func:`prediction_ops` and :func:`prediction_networks` read the held-out ops and the
left-out networks of every GPU configuration (``results/predictors/{gpu}/``) and add
their errors (:mod:`opcost.model.accuracy`); :func:`prediction_metrics` summarises them
per GPU configuration, mode, quantity and op type (thesis 5.2);
:func:`configuration_choice` says whether the predictions pick the measured best GPU
configuration and setting. docs/validation.md gives the method and the findings::

    metrics = prediction_metrics(prediction_ops(holdouts), prediction_networks(networks))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from opcost.model.accuracy import error_summary, relative_error
from opcost.model.format import HOLDOUT_COLUMNS, NETWORK_COLUMNS
from opcost.schemas import pandas_dtype
from opcost.validate import ValidationError

QUANTITIES = ("time", "power", "energy")
#: Measured and predicted column of each quantity in the predictors' tables.
QUANTITY_COLUMNS = {
    "time": ("time_s", "time_pred_s"),
    "power": ("power_w", "power_pred_w"),
    "energy": ("energy_j", "energy_pred_j"),
}
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

_STR = pandas_dtype("str")


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


def choice_scores(picks: pd.DataFrame, margin: float) -> dict[str, dict]:
    """How well :func:`configuration_choice`'s picks do, per criterion (``fastest``,
    ``least_energy``), over the cases whose measured best wins by more than ``margin``:
    ``clear`` (how many), ``right`` (predicted as measured), the constant baseline
    ``constant`` (the candidate most often best among them) and how often it is right
    (``constant_right``), and, in the ``missed`` cases it gets wrong, how often the
    prediction is right (``right_where_missed``). A criterion without a clear case is
    left out."""
    out = {}
    for _, _, name in CHOICE_QUANTITIES:
        clear = picks[picks[f"{name}_margin"] > margin]
        if clear.empty:
            continue
        constant = clear[f"measured_{name}"].value_counts().index[0]
        right = (clear[f"predicted_{name}"] == clear[f"measured_{name}"]).to_numpy()
        base = (clear[f"measured_{name}"] == constant).to_numpy()
        out[name] = {
            "clear": len(clear),
            "right": int(right.sum()),
            "constant": constant,
            "constant_right": int(base.sum()),
            "missed": int((~base).sum()),
            "right_where_missed": int(right[~base].sum()),
        }
    return out
