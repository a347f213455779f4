"""The time and power models of one GPU configuration, and what they predict.

A :class:`Predictor` predicts ``time_pred_s``, ``power_pred_w`` and ``energy_pred_j``
(time · power, thesis 4.1) per op at each trained setting and mode
(:meth:`Predictor.predict_ops`), flags ops outside its training data
(:meth:`Predictor.extrapolation`), and :func:`sum_by_count` sums op predictions to
networks (thesis 4.3). :mod:`opcost.train` builds one, :mod:`opcost.model.format`
saves and loads it::

    pred = predictor.predict_ops(ops)              # ops: op_id, spec
    totals = sum_by_count(pred.merge(ops[["op_id", "count"]]), ["setting", "mode"])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from opcost.model import PredictorError
from opcost.model.features import CONDITIONS, FeatureSchema, encode_features, encode_grid, op_counts
from opcost.names import MODES

#: Counts compared against the training range of an op's type.
RANGE_KEYS = ("flops", "input_numel", "output_numel")
UNSEEN_TYPE = "op type not in the training data"


@dataclass(frozen=True)
class TimeReference:
    """A roofline estimate of an op's time, which a time model can be relative to.

    ``estimate_s = max(flops / flops_per_s, bytes_moved / bytes_per_s) + launch_s``, from
    an encoded feature frame with the derived counts (``opcost.train``, ``time_target``).
    """

    flops_per_s: float
    bytes_per_s: float
    launch_s: float

    def estimate_s(self, x: pd.DataFrame) -> np.ndarray:
        compute_s = x["flops"].to_numpy(dtype=np.float64) / self.flops_per_s
        memory_s = x["bytes_moved"].to_numpy(dtype=np.float64) / self.bytes_per_s
        return np.maximum(compute_s, memory_s) + self.launch_s


@dataclass
class Predictor:
    """The time and power models of one GPU configuration, with their encoding.

    Attributes:
        gpu: GPU configuration name.
        schema: feature encoding the models were trained with.
        time_model: regressor of ``log(time_s)``, or of ``log(time_s / t_ref)`` with a
            ``time_reference``.
        power_model: regressor of ``power_w``, or None without power data.
        conditions: one row per trained (setting, mode): ``setting``, ``mode``,
            ``dtype``, ``tf32``, ``sm_clock_mhz``, ``mem_clock_mhz``, ``power_limit_w``.
        ranges: op type -> count name -> [min, max] over the training data.
        meta: everything else written to ``features.json``.
        time_reference: the roofline estimate ``t_ref`` the time model is relative to,
            or None.
        lono_mape_pct: mode -> criterion (``time``, ``energy``) -> the
            leave-one-network-out mean absolute percentage error of whole networks from
            ``metrics.json``; empty where training recorded none.
    """

    gpu: str
    schema: FeatureSchema
    time_model: Any
    power_model: Any | None
    conditions: pd.DataFrame
    ranges: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    lono_mape_pct: dict[str, dict[str, float]] = field(default_factory=dict)
    time_reference: TimeReference | None = None

    @property
    def settings(self) -> list[str]:
        return sorted(set(self.conditions["setting"]))

    @property
    def modes(self) -> list[str]:
        return [m for m in MODES if m in set(self.conditions["mode"])]

    def predict_rows(self, rows: pd.DataFrame) -> pd.DataFrame:
        """Predictions for rows that carry their own conditions (see ``encode_features``).

        Returns:
            A frame with ``rows``'s index and ``time_pred_s``, ``power_pred_w`` (NaN
            without a power model) and ``energy_pred_j`` = time · power (thesis 4.1).
        """
        return self._predict_features(encode_features(rows, self.schema))

    def predict_at_settings(self, rows: pd.DataFrame) -> pd.DataFrame:
        """Predict measured rows at their setting's trained conditions, as ``opcost
        predict`` does (:meth:`predict_rows`' columns).

        A row whose (setting, mode) this predictor was not trained on keeps its own
        measured conditions.
        """
        columns = ["dtype", "tf32", *CONDITIONS]
        cond = self.conditions.set_index(["setting", "mode"])[columns]
        keys = pd.MultiIndex.from_arrays([rows["setting"], rows["mode"]])
        known = keys.isin(cond.index)
        at = rows.copy()
        for c in columns:
            at[c] = np.where(known, cond[c].reindex(keys).to_numpy(), rows[c].to_numpy())
        at["tf32"] = at["tf32"].astype(bool)
        return self.predict_rows(at)

    def _predict_features(self, x: pd.DataFrame) -> pd.DataFrame:
        """Time, power and energy predictions for a feature frame, with its index."""
        out = pd.DataFrame(index=x.index)
        if len(x) == 0:
            out["time_pred_s"] = out["power_pred_w"] = out["energy_pred_j"] = []
            return out
        out["time_pred_s"] = np.exp(self.time_model.predict(x))
        if self.time_reference is not None:
            out["time_pred_s"] *= self.time_reference.estimate_s(x)
        if self.power_model is not None:
            out["power_pred_w"] = self.power_model.predict(x)
        else:
            out["power_pred_w"] = np.nan
        out["energy_pred_j"] = out["time_pred_s"] * out["power_pred_w"]
        return out

    def predict_ops(
        self,
        ops: pd.DataFrame,
        modes: Sequence[str] | None = None,
        settings: Sequence[str] | None = None,
    ) -> pd.DataFrame:
        """Predict each op at every trained setting (in ``modes``, default all trained).

        Args:
            ops: one row per op, with ``op_id`` and ``spec`` (duplicates are predicted once).
            modes: modes to predict; each must be trained.
            settings: settings to predict (default every trained one).

        Returns:
            One row per op, setting and mode (all conditions of the first op, then the
            second's, ...): ``gpu``, ``op_id``, ``setting``, ``mode``, ``time_pred_s``,
            ``power_pred_w``, ``energy_pred_j``.

        Raises:
            PredictorError: a mode or setting this predictor was not trained for.
        """
        conditions = self.select_conditions(modes, settings)
        unique = ops.drop_duplicates("op_id")
        n_ops, n_conditions = len(unique), len(conditions)
        # Each op and each condition encoded once, then every pair: not a cross join of
        # frames encoded row by row.
        x = encode_grid(unique["spec"].tolist(), conditions, self.schema)
        columns = self.schema.columns()
        features = pd.DataFrame(x.reshape(n_ops * n_conditions, len(columns)), columns=columns)
        op_at = np.repeat(np.arange(n_ops), n_conditions)
        condition_at = np.tile(np.arange(n_conditions), n_ops)
        out = pd.concat(
            [
                unique[["op_id"]].iloc[op_at].reset_index(drop=True),
                conditions[["setting", "mode"]].iloc[condition_at].reset_index(drop=True),
                self._predict_features(features),
            ],
            axis=1,
        )
        out.insert(0, "gpu", self.gpu)
        return out

    def select_conditions(
        self, modes: Sequence[str] | None = None, settings: Sequence[str] | None = None
    ) -> pd.DataFrame:
        """The trained conditions for these modes and settings (all by default)."""
        cond = self.conditions
        for what, wanted, have in (
            ("mode", modes, self.modes),
            ("setting", settings, self.settings),
        ):
            if wanted is None:
                continue
            unknown = sorted(set(wanted) - set(have))
            if unknown:
                raise PredictorError(
                    f"predictor {self.gpu!r} has no {what} {unknown[0]!r} in its training data "
                    f"(trained: {', '.join(have)}); profile it, retrain, or choose another {what}"
                )
            cond = cond[cond[what].isin(list(wanted))]
        return cond.reset_index(drop=True)

    def extrapolation(self, ops: pd.DataFrame) -> pd.DataFrame:
        """Ops whose prediction extrapolates: an unseen type, or counts outside its range.

        Returns:
            One row per flagged op: ``gpu``, ``op_id``, ``type``, ``reason``.
        """
        rows = []
        for op in ops.drop_duplicates("op_id").itertuples(index=False):
            spec_type = _spec_type(op.spec)
            if spec_type not in self.ranges:
                rows.append((self.gpu, op.op_id, spec_type, UNSEEN_TYPE))
                continue
            counts = op_counts(op.spec)
            reasons = []
            for key in RANGE_KEYS:
                lo, hi = self.ranges[spec_type][key]
                value = counts[key]
                if value > hi:
                    reasons.append(f"{key} {value:.3g} > trained max {hi:.3g}")
                elif value < lo:
                    reasons.append(f"{key} {value:.3g} < trained min {lo:.3g}")
            if reasons:
                rows.append((self.gpu, op.op_id, spec_type, "; ".join(reasons)))
        return pd.DataFrame(rows, columns=["gpu", "op_id", "type", "reason"])


@lru_cache(maxsize=65536)
def _spec_type(spec: str) -> str:
    """An op's type; cached, as every GPU configuration asks for the same ops."""
    return json.loads(spec)["type"]


def training_ranges(rows: pd.DataFrame) -> dict[str, dict[str, list[float]]]:
    """Per op type, [min, max] of each of :data:`RANGE_KEYS` over ``rows``.

    ``rows`` needs ``spec`` and ``op_type``.
    """
    ranges: dict[str, dict[str, list[float]]] = {}
    unique = rows.drop_duplicates("spec")
    for spec_type, group in unique.groupby("op_type"):
        counts = pd.DataFrame([op_counts(s) for s in group["spec"]])
        ranges[str(spec_type)] = {
            k: [float(counts[k].min()), float(counts[k].max())] for k in RANGE_KEYS
        }
    return ranges


def sum_by_count(pred: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Network totals from op predictions with a ``count`` column (thesis 4.3).

    ``time_pred_s`` and ``energy_pred_j`` are count-weighted sums, NaN if any op's value
    is NaN (a sum of the known part would understate the network); ``power_pred_w`` is
    their ratio (the time-weighted mean power).
    """
    columns = ["time_pred_s", "energy_pred_j"]
    weighted = pred[list(keys)].copy()
    for c in columns:
        weighted[c] = pred[c] * pred["count"]
    grouped = weighted.groupby(list(keys), sort=False)[columns]
    out = grouped.sum().mask(grouped.agg(lambda s: s.isna().any()).astype(bool))
    out["power_pred_w"] = out["energy_pred_j"] / out["time_pred_s"]
    return out.reset_index()
