"""A fitted tree ensemble as flat arrays, which predicts with numpy alone.

:meth:`TreeEnsemble.from_sklearn` flattens a fitted random forest, extra trees or
histogram gradient boosting regressor; :meth:`TreeEnsemble.predict` gives the same
numbers without importing scikit-learn. :meth:`TreeEnsemble.to_arrays` and
:meth:`TreeEnsemble.from_arrays` are the arrays of a model file
(:mod:`opcost.model.format`)::

    ensemble = TreeEnsemble.from_sklearn(fitted_forest)
    y = ensemble.predict(feature_frame)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from opcost.model import PredictorError
from opcost.model.features import SchemaError

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
