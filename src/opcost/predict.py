"""Prediction: time, power and energy of any network on every trained GPU configuration.

A predictor (one per GPU configuration, ``results/predictors/{gpu}/``) is

* ``time.npz``: a regressor of ``log(time_s)``, time per iteration in seconds. Time
  spans orders of magnitude (microseconds for a ReLU, tens of milliseconds for a large
  convolution in training); on the log scale a tree's leaf averages ratios, not
  absolute seconds, so small operations are not drowned by large ones.
* ``power.npz``: a regressor of ``power_w`` (mean GPU power while the op runs, W); absent
  when the dataset has no power (a CPU, time-only study).

  Both hold a :class:`TreeEnsemble`: the fitted scikit-learn ensemble flattened into
  arrays, which predicts the same numbers without importing scikit-learn. They are
  NumPy ``.npz`` archives of plain numeric and string arrays, read with
  ``allow_pickle=False``: loading a predictor never runs code from its files.
* ``features.json``: the feature schema (:class:`opcost.features.FeatureSchema`), the
  training columns, the conditions of each trained GPU setting (median measured SM and
  memory clock and power limit per setting and mode), the training ranges of each op
  type (for extrapolation flags) and provenance.
* ``manifest.json``, written last: the format version, the GPU configuration, the dataset
  the models were trained from (path and SHA-256) and the SHA-256 and size of every other
  file of the predictor. :func:`load_predictor` checks every listed file against it before
  parsing any, and refuses a directory without one.

Energy per iteration is predicted time times predicted power (thesis 4.1). A network's
prediction is the sum over its operations, each counted as often as it runs (thesis 4.3):
``time = Σ count·t_op``, ``energy = Σ count·e_op``, and its power is ``energy / time``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opcost.errors import OpcostError
from opcost.features import (
    CONDITIONS,
    FeatureSchema,
    SchemaError,
    check_schema,
    encode_features,
    encode_grid,
    op_counts,
)
from opcost.names import MODES

FEATURES_FILE = "features.json"
TIME_FILE = "time.npz"
POWER_FILE = "power.npz"
#: Written by ``opcost train`` beside the models: its leave-one-network-out errors tell
#: how far a predicted margin between two choices can be trusted.
METRICS_FILE = "metrics.json"
#: Validation tables written by ``opcost train`` beside the models (not read to predict).
HOLDOUT_FILE = "holdout_predictions.parquet"
NETWORKS_FILE = "network_predictions.parquet"
#: Written last: the SHA-256 of every other file of the predictor.
MANIFEST_FILE = "manifest.json"
#: The predictor directory's format (the manifest and the model files); another is refused.
FORMAT_VERSION = 1
#: What to do about a predictor whose files do not match its manifest (Snakemake does
#: not rerun a job whose outputs exist unless forced).
RETRAIN = f"retrain it (snakemake -f results/predictors/<gpu>/{MANIFEST_FILE})"
#: Files a manifest may list, in the order they are checked.
PREDICTOR_FILES = (FEATURES_FILE, TIME_FILE, POWER_FILE, METRICS_FILE, HOLDOUT_FILE, NETWORKS_FILE)
#: Counts compared against the training range of an op's type.
RANGE_KEYS = ("flops", "input_numel", "output_numel")
NEEDS_SETTINGS = "needs more than one setting"
NO_POWER = "no power model (time-only data)"
UNSEEN_TYPE = "op type not in the training data"


class PredictorError(OpcostError, ValueError):
    """A predictor directory is missing, incomplete or incompatible; the message names it."""


#: Rows predicted at once: bounds the (rows, trees) matrix of leaf values (8192 rows of
#: 300 trees: 20 MB).
_CHUNK_ROWS = 8192
#: Walkers (one per row and tree) started at once: enough that numpy's per-call
#: overhead is small against a step's work, few enough that the nodes of the trees walked
#: together (20 trees for 1,600 rows) stay in cache.
_WALKERS = 32768
#: Trees whose leaf values are summed before adding to the total. Not a tuning knob: the
#: order of the floating-point additions, and so the last bit of every prediction,
#: depends on it (16 since the first TreeEnsemble).
_SUM_GROUP = 16
#: Steps between removing finished walkers (a finished walker stays on its leaf).
_COMPACT_EVERY = 4
#: Most threads walking blocks of one ensemble's trees (and at most one per CPU). The walk
#: is numpy's take and comparisons, which release the GIL: during a walk another thread
#: gets the GIL thousands of times a second, against about 150 under pure Python.
_MAX_THREADS = 4


def _floor_float32(threshold: np.ndarray) -> np.ndarray:
    """The largest float32 <= each threshold: for float32 ``x``, ``x <= t`` iff ``x <= floor``."""
    t32 = threshold.astype(np.float32)
    return np.where(t32 > threshold, np.nextafter(t32, np.float32(-np.inf)), t32)


@dataclass
class TreeEnsemble:
    """A fitted tree ensemble as flat arrays, so that predicting needs numpy only.

    Saved in ``time.npz`` and ``power.npz`` (:meth:`to_arrays`, :meth:`from_arrays`)
    instead of the scikit-learn object: plain arrays load fast, loading runs no code, and
    predicting imports no scikit-learn (about 1.5 s of a 2 s budget on a small CPU).
    :meth:`from_sklearn` takes a fitted random forest, extra trees or histogram gradient
    boosting regressor; :meth:`predict` gives the same numbers (tested against
    scikit-learn).

    Attributes:
        feature_names_in_: feature columns, in order (as scikit-learn names them).
        children: ``(n_nodes, 2)`` left and right child (global node index); a leaf
            points to itself, so a walker that reached it stays there.
        feature: the feature a node splits on (0 at a leaf).
        threshold: go right if ``x > threshold`` (+inf at a leaf). For forests, float32
            and rounded down: scikit-learn's trees compare float32 inputs with float64
            thresholds, and for a float32 ``x``, ``x <= t`` iff ``x <=`` the largest
            float32 not above ``t``.
        is_leaf: whether a node is a leaf.
        value: each node's output (used at leaves).
        roots: the root node of each tree.
        combine: ``mean`` (forests) or ``sum`` (boosting) over trees, plus ``offset``.
        source: the estimator's class and size, for provenance.
    """

    feature_names_in_: np.ndarray
    children: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    is_leaf: np.ndarray
    value: np.ndarray
    roots: np.ndarray
    combine: str
    offset: float
    source: str

    @classmethod
    def from_sklearn(cls, model: Any) -> TreeEnsemble:
        """Flatten a fitted ``RandomForestRegressor``, ``ExtraTreesRegressor`` or
        ``HistGradientBoostingRegressor``.

        Raises:
            PredictorError: for another estimator.
        """
        trees: list[tuple[np.ndarray, ...]] = []
        if hasattr(model, "estimators_") and hasattr(model, "n_estimators"):
            for est in model.estimators_:
                t = est.tree_
                leaf = t.children_left < 0
                trees.append(
                    (
                        t.children_left,
                        t.children_right,
                        t.feature,
                        t.threshold,
                        t.value[:, 0, 0],
                        leaf,
                    )
                )
            combine, offset, float32 = "mean", 0.0, True
        elif hasattr(model, "_predictors") and hasattr(model, "_baseline_prediction"):
            for per_iteration in model._predictors:
                if len(per_iteration) != 1:
                    raise PredictorError("only single-output gradient boosting is supported")
                n = per_iteration[0].nodes
                if n["is_categorical"].any():
                    raise PredictorError("categorical splits are not supported")
                trees.append(
                    (
                        n["left"],
                        n["right"],
                        n["feature_idx"],
                        n["num_threshold"],
                        n["value"],
                        n["is_leaf"].astype(bool),
                    )
                )
            # HistGradientBoosting compares float64 inputs; its leaf values include the
            # learning rate, and the baseline is the initial prediction.
            combine, float32 = "sum", False
            offset = float(np.asarray(model._baseline_prediction).ravel()[0])
        else:
            raise PredictorError(
                f"cannot store a {type(model).__name__}: expected a random forest, extra "
                "trees or histogram gradient boosting regressor"
            )
        children, features, thresholds, leaves, values, roots = [], [], [], [], [], []
        start = 0
        for left, right, feature, threshold, value, leaf in trees:
            own = np.arange(start, start + len(leaf), dtype=np.int64)
            children.append(
                np.stack(
                    [
                        np.where(leaf, own, np.asarray(left, dtype=np.int64) + start),
                        np.where(leaf, own, np.asarray(right, dtype=np.int64) + start),
                    ],
                    axis=1,
                )
            )
            features.append(np.where(leaf, 0, feature))
            threshold = np.asarray(threshold, dtype=np.float64)
            if float32:
                threshold = _floor_float32(threshold)
            thresholds.append(np.where(leaf, np.inf, threshold))
            leaves.append(np.asarray(leaf, dtype=bool))
            values.append(np.asarray(value, dtype=np.float64))
            roots.append(start)
            start += len(leaf)
        if start >= np.iinfo(np.int32).max:
            raise PredictorError(f"{start} tree nodes is too many; use fewer or smaller trees")
        return cls(
            feature_names_in_=np.asarray(model.feature_names_in_, dtype=object),
            children=np.concatenate(children).astype(np.int32),
            feature=np.concatenate(features).astype(np.int32),
            threshold=np.concatenate(thresholds).astype(np.float32 if float32 else np.float64),
            is_leaf=np.concatenate(leaves),
            value=np.concatenate(values),
            roots=np.asarray(roots, dtype=np.int32),
            combine=combine,
            offset=offset,
            source=f"{type(model).__name__} ({len(roots)} trees, {start} nodes)",
        )

    @property
    def n_features_in_(self) -> int:
        return len(self.feature_names_in_)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The ensemble as named arrays: numbers, booleans and unicode strings (no objects);
        the scalars as 0-d arrays."""
        return {
            "feature_names_in_": np.asarray([str(n) for n in self.feature_names_in_], dtype=str),
            "children": self.children,
            "feature": self.feature,
            "threshold": self.threshold,
            "is_leaf": self.is_leaf,
            "value": self.value,
            "roots": self.roots,
            "combine": np.asarray(self.combine, dtype=str),
            "offset": np.asarray(self.offset, dtype=np.float64),
            "source": np.asarray(self.source, dtype=str),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], where: str) -> TreeEnsemble:
        """The ensemble :meth:`to_arrays` gave, after checking that its arrays make trees
        that every walk leaves at a leaf (each child after its parent, leaves point to
        themselves) on features that exist.

        Raises:
            PredictorError: a missing or extra array, a wrong type or shape, or nodes
                that do not form such trees; the message names ``where``.
        """
        kinds = {
            "feature_names_in_": ("U", 1),
            "children": ("int32", 2),
            "feature": ("int32", 1),
            "threshold": ("float", 1),
            "is_leaf": ("bool", 1),
            "value": ("float64", 1),
            "roots": ("int32", 1),
            "combine": ("U", 0),
            "offset": ("float64", 0),
            "source": ("U", 0),
        }

        def bad(what: str) -> PredictorError:
            return PredictorError(f"{where}: not an opcost tree ensemble ({what}); retrain")

        if set(arrays) != set(kinds):
            raise bad(f"arrays {sorted(arrays)}, expected {sorted(kinds)}")
        for name, (kind, ndim) in kinds.items():
            a = arrays[name]
            ok = {
                "U": a.dtype.kind == "U",
                "float": a.dtype in (np.float32, np.float64),
            }.get(kind, a.dtype == np.dtype(kind))
            if not ok or a.ndim != ndim:
                raise bad(f"{name} is {a.ndim}-d {a.dtype}, expected {ndim}-d {kind}")
        n = len(arrays["is_leaf"])
        children, feature, leaf = arrays["children"], arrays["feature"], arrays["is_leaf"]
        roots, n_features = arrays["roots"], len(arrays["feature_names_in_"])
        if children.shape != (n, 2) or any(
            len(arrays[k]) != n for k in ("feature", "threshold", "value")
        ):
            raise bad(f"node arrays of different lengths ({n} nodes)")
        # A leaf's children are itself, an inner node's lie after it: every walk ends at a
        # leaf.
        own = np.arange(n, dtype=np.int32)
        left, right = children[:, 0], children[:, 1]
        if (
            n == 0
            or len(roots) == 0
            or children.min() < 0
            or children.max() >= n
            or not np.array_equal(left == own, leaf)
            or not np.array_equal(right == own, leaf)
            or not (left >= own).all()
            or not (right >= own).all()
            or feature.min() < 0
            or feature.max() >= n_features
            or roots.min() < 0
            or roots.max() >= n
        ):
            raise bad("nodes do not form trees over its features")
        combine = str(arrays["combine"])
        if combine not in ("mean", "sum"):
            raise bad(f"combine {combine!r}")
        return cls(
            feature_names_in_=arrays["feature_names_in_"].astype(object),
            children=children,
            feature=feature,
            threshold=arrays["threshold"],
            is_leaf=leaf,
            value=arrays["value"],
            roots=roots,
            combine=combine,
            offset=float(arrays["offset"]),
            source=str(arrays["source"]),
        )

    def predict(self, x: Any) -> np.ndarray:
        """The ensemble's prediction for each row of ``x`` (columns as ``feature_names_in_``).

        Blocks of trees are walked on up to :data:`_MAX_THREADS` threads; the leaf values
        are summed in one fixed order, so the result does not depend on the blocks, the
        chunks of rows or the threads.

        Raises:
            SchemaError: ``x`` has other columns than the model was trained on.
        """
        if isinstance(x, pd.DataFrame) and list(x.columns) != list(self.feature_names_in_):
            raise SchemaError("feature columns differ from the model's; retrain the predictors")
        data = np.asarray(x, dtype=np.float64)
        if data.ndim != 2 or data.shape[1] != self.n_features_in_:
            raise SchemaError(
                f"expected {self.n_features_in_} features per row, got shape {data.shape}"
            )
        # The comparisons scikit-learn makes: float64 input cast to the thresholds' type.
        data = np.ascontiguousarray(data, dtype=self.threshold.dtype)
        n_trees = len(self.roots)
        out = np.zeros(len(data))
        for lo in range(0, len(data), _CHUNK_ROWS):
            chunk = data[lo : lo + _CHUNK_ROWS]
            per_walk = max(1, _WALKERS // len(chunk))
            blocks = [(chunk, self.roots[t : t + per_walk]) for t in range(0, n_trees, per_walk)]
            leaf_values = np.hstack(_starmap_threads(self._leaf_values, blocks))
            # Summed in the same order as ever, so that predictions do not change.
            for t in range(0, n_trees, _SUM_GROUP):
                out[lo : lo + len(chunk)] += leaf_values[:, t : t + _SUM_GROUP].sum(axis=1)
        if self.combine == "mean":
            out /= n_trees
        return out + self.offset

    def _leaf_values(self, data: np.ndarray, roots: np.ndarray) -> np.ndarray:
        """``(n_rows, len(roots))``: the value of the leaf each row reaches in each tree.

        All (row, tree) walkers move down one level per step, as arrays.
        """
        n_rows, n_features = data.shape
        flat = data.ravel()
        feature, threshold, is_leaf = self.feature, self.threshold, self.is_leaf
        # The child of node n is children[2 * n + went_right].
        children = self.children.reshape(-1)
        # intp indices and take(): numpy converts other index types first, and fancy
        # indexing is slower than take.
        node = np.tile(roots.astype(np.intp), n_rows)
        offset = np.repeat(np.arange(n_rows, dtype=np.intp) * n_features, len(roots))
        slot = np.arange(len(node), dtype=np.intp)
        values = np.empty(len(node))
        step = 0
        while node.size:
            right = flat.take(offset + feature.take(node)) > threshold.take(node)
            # In place: int64 + bool in one expression takes numpy's slow casting path.
            node *= 2
            node += right
            node = children.take(node).astype(np.intp)
            step += 1
            if step % _COMPACT_EVERY == 0:
                finished = is_leaf.take(node)
                at = np.flatnonzero(finished)
                values[slot.take(at)] = self.value.take(node.take(at))
                keep = np.flatnonzero(~finished)
                node, offset, slot = node.take(keep), offset.take(keep), slot.take(keep)
        return values.reshape(n_rows, len(roots))


def _starmap_threads(func: Callable[..., Any], args: list[tuple[Any, ...]]) -> list[Any]:
    """``[func(*a) for a in args]``, on up to :data:`_MAX_THREADS` threads (one per CPU)."""
    try:
        n_cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n_cpus = os.cpu_count() or 1
    n_threads = min(_MAX_THREADS, n_cpus, len(args))
    if n_threads <= 1:
        return [func(*a) for a in args]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n_threads) as pool:
        return list(pool.map(func, *zip(*args, strict=True)))


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


def save_predictor(
    predictor: Predictor, directory: str | Path, dataset: str | Path | None = None
) -> None:
    """Write ``time.npz``, ``power.npz`` (none without a power model), ``features.json``
    and, last, ``manifest.json``.

    The manifest also covers ``metrics.json`` and the validation tables already in
    ``directory`` (``opcost train`` writes them first). Until it is written, the directory
    holds no manifest, so a predictor interrupted while being saved never loads.

    Args:
        dataset: the dataset Parquet the models were trained from, recorded with its
            SHA-256 in the manifest (None: not recorded).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST_FILE).unlink(missing_ok=True)
    _write_model(predictor.time_model, directory / TIME_FILE)
    if predictor.power_model is None:
        (directory / POWER_FILE).unlink(missing_ok=True)
    else:
        _write_model(predictor.power_model, directory / POWER_FILE)
    cond = predictor.conditions.astype(object).where(predictor.conditions.notna(), None)
    ref = predictor.time_reference
    doc = {
        **predictor.meta,
        "features_version": predictor.schema.version,
        "gpu": predictor.gpu,
        "schema": predictor.schema.to_dict(),
        "columns": predictor.schema.columns(),
        "time_target": "log(time_s)" if ref is None else "log(time_s / t_ref)",
        "time_reference": None if ref is None else asdict(ref),
        "power_target": "power_w" if predictor.power_model is not None else None,
        "conditions": cond.to_dict(orient="records"),
        "training_ranges": predictor.ranges,
    }
    text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"
    _write_atomic(directory / FEATURES_FILE, text.encode())
    manifest = {
        "format": "opcost predictor",
        "format_version": FORMAT_VERSION,
        "gpu": {
            "name": predictor.gpu,
            "devices": list(predictor.meta.get("gpu_names", [])),
            "settings": predictor.settings,
            "modes": predictor.modes,
        },
        "dataset": None if dataset is None else _file_entry(Path(dataset), with_path=True),
        "files": {
            name: _file_entry(directory / name)
            for name in PREDICTOR_FILES
            if (directory / name).is_file()
        },
    }
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    _write_atomic(directory / MANIFEST_FILE, text.encode())


def _sha256(path: Path) -> tuple[str, int]:
    """The SHA-256 (hex) and size of a file, read in blocks."""
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256")
        return digest.hexdigest(), f.tell()


def _file_entry(path: Path, with_path: bool = False) -> dict[str, Any]:
    """A manifest entry: the file's SHA-256 and size in bytes (and its path if asked)."""
    sha256, size = _sha256(path)
    return {"sha256": sha256, "bytes": size, **({"path": str(path)} if with_path else {})}


def _write_atomic(path: Path, data: bytes) -> None:
    """Write under a temporary name, flush to disk, then rename: no reader sees half a
    file, and after a crash the file is whole or absent."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_model(model: TreeEnsemble, path: Path) -> None:
    """Save a tree ensemble as an uncompressed ``.npz`` of its arrays (no pickles), which
    ``np.load`` reads.

    Each member's local header is padded (an extra field as Android's ``zipalign``
    writes) so that its array data start at a multiple of 64 bytes: :func:`_npz_arrays`
    then uses them in place. A fixed timestamp makes the same model the same bytes.
    """
    if not isinstance(model, TreeEnsemble):
        raise PredictorError(
            f"{path}: cannot store a {type(model).__name__}; expected a TreeEnsemble"
        )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, array in model.to_arrays().items():
            member = io.BytesIO()
            np.lib.format.write_array(member, array, allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            # The .npy header is padded to 64 bytes; the local header is 30 bytes, the
            # name, and the extra field (4 bytes and the padding).
            pad = -(buffer.tell() + 30 + len(info.filename) + 4) % 64
            info.extra = struct.pack("<HH", 0xD935, pad) + bytes(pad)
            archive.writestr(info, member.getvalue())
    _write_atomic(path, buffer.getvalue())


def _read_model(data: bytes, path: Path) -> TreeEnsemble:
    """A tree ensemble from the bytes of its ``.npz`` (:func:`_npz_arrays`)."""
    try:
        arrays = _npz_arrays(data)
    except Exception as e:  # zipfile and numpy raise many types for a malformed archive
        raise PredictorError(f"{path}: not an opcost model file ({e}); retrain") from e
    return TreeEnsemble.from_arrays(arrays, str(path))


def _npz_arrays(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an uncompressed ``.npz`` held in ``data``.

    Plain arrays only: a member whose dtype holds objects (which ``np.load`` would
    unpickle with ``allow_pickle=True``) or a compressed member (whose size the file's
    does not bound) is refused. Each array is a read-only view of ``data`` where it lies
    aligned, else a copy: no reading through ``zipfile`` in small blocks.

    Raises:
        ValueError: not such an archive.
    """
    from numpy.lib import format as npy

    readers = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}
    arrays = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"member {info.filename} is compressed")
            local = data[info.header_offset : info.header_offset + 30]
            if len(local) < 30 or local[:4] != b"PK\x03\x04":
                raise ValueError(f"member {info.filename}: no local header")
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            end = start + info.file_size
            header = io.BytesIO(data[start : min(end, start + 65536)])
            version = npy.read_magic(header)
            if version not in readers:
                raise ValueError(f"member {info.filename}: .npy version {version}")
            shape, fortran, dtype = readers[version](header)
            if dtype.hasobject:
                raise ValueError(f"member {info.filename} holds Python objects")
            if any(d < 0 for d in shape):
                raise ValueError(f"member {info.filename}: shape {shape}")
            count = int(np.prod(shape, dtype=np.int64))
            offset = start + header.tell()
            if offset + count * dtype.itemsize > end:
                raise ValueError(f"member {info.filename} is cut short")
            array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
            if not array.flags.aligned:
                array = array.copy()
                array.flags.writeable = False
            arrays[info.filename.removesuffix(".npy")] = array.reshape(
                shape, order="F" if fortran else "C"
            )
    return arrays


def _read_manifest(directory: Path) -> dict[str, bytes]:
    """The bytes of every file ``manifest.json`` lists, each checked against its SHA-256
    and size; files are read once, so what is parsed is what was checked.

    Raises:
        PredictorError: no or an unreadable manifest, another format version, a listed
            file missing or changed, or a file the loader reads that the manifest does not
            list; the message names the file.
    """
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise PredictorError(
            f"{directory}: no {MANIFEST_FILE} (not trained, interrupted, or from an older "
            "opcost); train the predictors (snakemake results/predictors/<gpu>/"
            f"{MANIFEST_FILE}) or pass --predictors DIR"
        )
    try:
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise PredictorError(f"{path}: not readable JSON ({e}); {RETRAIN}") from e
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version != FORMAT_VERSION:
        raise PredictorError(
            f"{path}: predictor format version {version!r}, this opcost reads "
            f"{FORMAT_VERSION}; {RETRAIN}"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not {FEATURES_FILE, TIME_FILE} <= set(files):
        raise PredictorError(f"{path}: lists no {FEATURES_FILE} and {TIME_FILE}; retrain")
    unknown = sorted(set(files) - set(PREDICTOR_FILES))
    if unknown:
        raise PredictorError(f"{path}: lists an unknown file {unknown[0]!r}; retrain")
    for name in (POWER_FILE, METRICS_FILE):
        if name not in files and (directory / name).exists():
            raise PredictorError(
                f"{directory / name}: not in {MANIFEST_FILE} (added after training); "
                "remove it or retrain the predictor"
            )
    contents = {}
    for name in PREDICTOR_FILES:
        if name not in files:
            continue
        entry, file = files[name], directory / name
        try:
            data = file.read_bytes()
        except OSError as e:
            raise PredictorError(
                f"{file}: listed in {MANIFEST_FILE} but not readable ({e.strerror}); retrain"
            ) from e
        expected = entry.get("sha256") if isinstance(entry, dict) else None
        if hashlib.sha256(data).hexdigest() != expected or len(data) != entry.get("bytes"):
            raise PredictorError(
                f"{file}: does not match its SHA-256 in {MANIFEST_FILE} (changed or damaged "
                f"since training); {RETRAIN}"
            )
        contents[name] = data
    return contents


def load_predictor(directory: str | Path) -> Predictor:
    """Load one GPU configuration's predictor and check it.

    Every file ``manifest.json`` lists is read and checked against its SHA-256 first
    (:func:`_read_manifest`); then the checked bytes are parsed, JSON and ``.npz`` of
    plain arrays only, so that loading runs no code from the files.

    Raises:
        PredictorError: a file is missing, changed since training, or unreadable.
        SchemaError: the models' features differ from the schema, or the schema's version
            from this opcost's.
    """
    directory = Path(directory)
    path = directory / FEATURES_FILE
    contents = _read_manifest(directory)
    try:
        doc = json.loads(contents[FEATURES_FILE])
    except ValueError as e:
        raise PredictorError(f"{path}: not readable JSON ({e})") from e
    if not isinstance(doc, dict) or "schema" not in doc:
        raise PredictorError(f"{path}: not a features.json written by opcost train")
    schema = FeatureSchema.from_dict(doc["schema"])
    check_schema(schema, doc.get("columns", []), str(path))
    time_model = _read_model(contents[TIME_FILE], directory / TIME_FILE)
    power_model = None
    if POWER_FILE in contents:
        power_model = _read_model(contents[POWER_FILE], directory / POWER_FILE)
    for name, model in ((TIME_FILE, time_model), (POWER_FILE, power_model)):
        if model is not None:
            check_schema(schema, [str(n) for n in model.feature_names_in_], str(directory / name))
    conditions = pd.DataFrame(doc.get("conditions", []))
    needed = ["setting", "mode", "dtype", "tf32", *CONDITIONS]
    if conditions.empty or any(c not in conditions.columns for c in needed):
        raise PredictorError(f"{path}: no trained settings recorded; retrain")
    conditions = conditions[needed].copy()
    for c in CONDITIONS:
        conditions[c] = pd.to_numeric(conditions[c], errors="coerce").astype("float64")
    conditions["tf32"] = conditions["tf32"].astype(bool)
    meta = {
        k: v
        for k, v in doc.items()
        if k not in {"schema", "columns", "conditions", "training_ranges", "gpu", "time_reference"}
    }
    reference = doc.get("time_reference")
    try:
        time_reference = None if reference is None else TimeReference(**reference)
    except TypeError as e:
        raise PredictorError(f"{path}: time_reference is not readable ({e}); retrain") from e
    return Predictor(
        gpu=str(doc.get("gpu", directory.name)),
        schema=schema,
        time_model=time_model,
        power_model=power_model,
        conditions=conditions,
        ranges=doc.get("training_ranges", {}),
        meta=meta,
        lono_mape_pct=_lono_mape(contents.get(METRICS_FILE)),
        time_reference=time_reference,
    )


def _lono_mape(metrics: bytes | None) -> dict[str, dict[str, float]]:
    """Mode -> criterion -> LONO network MAPE (%) from ``metrics.json``'s bytes; empty if
    absent or unreadable (the errors only qualify a choice, the models predict without
    them)."""
    try:
        networks = json.loads(metrics)["lono"]["network"]
    except (ValueError, KeyError, TypeError):
        return {}
    out: dict[str, dict[str, float]] = {}
    for mode, scores in networks.items() if isinstance(networks, dict) else ():
        if mode not in MODES or not isinstance(scores, dict):
            continue
        values = {
            criterion: float(scores[f"{criterion}_mape_pct"])
            for criterion in ("time", "energy")
            if isinstance(scores.get(f"{criterion}_mape_pct"), int | float)
        }
        if values:
            out[mode] = values
    return out


def load_predictors(root: str | Path) -> dict[str, Predictor]:
    """Every predictor under ``root`` (one subdirectory per GPU configuration).

    Raises:
        PredictorError: ``root`` does not exist or holds no predictor.
    """
    root = Path(root)
    if not root.is_dir():
        raise PredictorError(
            f"{root}: no such predictor directory; train first (snakemake) or pass --predictors DIR"
        )
    # A directory with features.json but no manifest (interrupted, or an older opcost's)
    # is a predictor that load_predictor refuses, saying so.
    marks = (MANIFEST_FILE, FEATURES_FILE)
    dirs = sorted({p.parent for name in marks for p in root.glob(f"*/{name}")})
    if any((root / name).is_file() for name in marks):
        dirs = [root]
    if not dirs:
        raise PredictorError(
            f"{root}: holds no trained predictor (no */{MANIFEST_FILE}); train first "
            "(snakemake) or pass --predictors DIR"
        )
    # On threads: reading and hashing the files release the GIL.
    return {p.gpu: p for p in _starmap_threads(load_predictor, [(d,) for d in dirs])}


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
                    **_runner_up(table, values, predictors, str(mode), criterion),
                }
            )
    best = pd.DataFrame(best_rows, columns=BEST_COLUMNS)
    return NetworkPrediction(
        table=table.sort_values(["network", "mode", "gpu", "setting"], ignore_index=True),
        best=best,
        per_op=pd.DataFrame(per_op).reindex(columns=PER_OP_COLUMNS),
        extrapolation=extrapolation,
        op_predictions=op_predictions,
    )


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
    predictors: dict[str, Predictor],
    mode: str,
    criterion: str,
) -> dict[str, Any]:
    """The second-best choice of ``values`` (sorted, best first), by how much the best
    wins, and whether that lies within the predictors' leave-one-network-out error."""
    if len(values) < 2:
        return {"margin": np.nan, "lono_mape_pct": np.nan, "within_error": None}
    best, second = values.index[0], values.index[1]
    margin = float(values.iloc[1] / values.iloc[0] - 1.0)
    errors = [
        predictors[table.loc[i, "gpu"]].lono_mape_pct.get(mode, {}).get(criterion)
        for i in (best, second)
    ]
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
    from opcost.tables import read_parquet

    return read_parquet(path, columns=["op_id", "spec", "count"])


__all__ = [
    "NetworkPrediction",
    "Predictor",
    "PredictorError",
    "TreeEnsemble",
    "SchemaError",
    "load_predictor",
    "load_predictors",
    "predict_networks",
    "read_ops_table",
    "save_predictor",
    "sum_by_count",
    "training_ranges",
]
