"""Op models learnt from the op-space study: GPU time through the roofline, host time, power.

Per GPU configuration and op family (:func:`opcost.model.op_spec.family_of`; the layer
norms apart from the other norms, :func:`model_key`), fitted on the sampled
configurations only (:mod:`opcost.opspace`; networks are never training data):

* **GPU time** over a **base time** (:mod:`opcost.model.base_time`): the roofline time
  against the configuration's ceilings plus the shortest kernel the samples ran, once
  per pass. The model fits ``log(GPU time / base)``: for a large op the base is its
  roofline time, for a small one the floor every kernel costs, so the trees learn a
  ratio near 1 and smooth over the space instead of an efficiency that spans three
  decades. A tree's prediction is an average of training values, so an op heavier than
  any sample is predicted in proportion to its work. GPU time = base × ratio, never
  below the roofline time: the **efficiency** ``roofline time / GPU time`` stays in
  (0, 1];
* **kernels** per call (``log1p``), and in training the forward pass's share of the GPU
  time, host time and kernels (a replay issues the forward, then the backward);
* the **busy share**: the time the device is busy with a call's kernels (the union of
  their intervals, ``gpu_busy_time_s``) over their summed durations, ``log``, from the
  samples that record it: below 1 where cuDNN runs a grouped convolution's kernels on
  several streams at once. ``gpu_busy_time_s`` = GPU time × share (1 for a family
  without such samples): what a replay's GPU stream is busy for;
* the **graph share**: the time a call takes replayed from a CUDA graph over its busy
  time, at most 1, ``log``, from the samples timed from a graph (``graph_time_s``) or
  whose power window ran from one (``power_graphed``): below 1 where a graph runs
  kernels at once that eager launches leave apart, as cuDNN's per-group kernels of a
  grouped convolution; 1 for a call of at most
  :data:`~opcost.model.shares.GRAPH_MIN_KERNELS` kernels a pass; learnt for a family
  with :data:`MIN_GRAPH_WINDOWS` such samples or more, else 1. The shares are read from
  the samples by :mod:`opcost.model.shares`.
  ``graph_busy_time_s`` = busy time × share: what a graph replay's GPU is busy for;
* **host time** per call (``log``), relative to the host-speed probe of the chunk it was
  measured in, so that a prediction can be for another host
  (``host_time = ratio * probe``);
* **busy power**: the power while kernels run, one model over all families, learnt
  from the samples with a power window (:mod:`opcost.model.op_power`).

Views (no kernels) take GPU time 0. A family the op space lacks for a configuration (a
TF32-off configuration measures only the TF32 families, one with ``cudnn_benchmark`` only
the convolutions; the rest is its twin's, see
:func:`opcost.opspace_workflow.default_twin`) is learnt from the twin's rows. Regressors:
``random_forest``, ``extra_trees``, ``gradient_boosting`` (:func:`opcost.train.make_regressor`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from opcost.model import in_network, op_power, peer_transfer, shapes
from opcost.model import roofline as rl
from opcost.model.base_time import base_time_s, gpu_base
from opcost.model.features import FeatureSchema, build_schema, encode_features
from opcost.model.op_spec import family_of, reduced_name
from opcost.model.op_tables import pooled_rows
from opcost.model.shares import GRAPH_MIN_KERNELS, busy_share, graph_share, kernels_per_pass
from opcost.model.trees import TreeEnsemble

#: Families without kernels: GPU time 0.
NO_KERNEL_FAMILIES = ("view",)
#: The gap between two kernels queued on one stream: the median ``launch_gap_s`` of the
#: traced Hopper networks and ops (H100 and H200, docs/results.md); the op space does not
#: measure it.
KERNEL_GAP_S = 1e-6
#: Targets fitted with the configured number of trees; the others (host time, kernels per
#: call, the forward pass's shares) with :data:`AUXILIARY_TREES_DIVISOR` times fewer (at
#: least :data:`AUXILIARY_MIN_TREES`). Their errors are those of the full forests
#: (docs/op-space.md, "Model size"), and the model files stay small enough to ship.
MAIN_TARGETS = ("time",)
#: The least samples timed from a graph a family learns its graph share from (a tree's
#: prediction is an average of its samples: a few would set every op's share).
MIN_GRAPH_WINDOWS = 20
AUXILIARY_TREES_DIVISOR = 4
AUXILIARY_MIN_TREES = 6
#: The feature column of a family model that holds the log of the roofline time.
LOG_ROOFLINE = "log_roofline_time_s"
#: Size features whose sampled range an op is checked against (``FamilyModel.outside``):
#: the matrix product it amounts to (rows and reduction length of norms and softmax).
RANGE_FEATURES = ("log_gemm_m", "log_gemm_n", "log_gemm_k")
#: Tolerance of that check, in log units (5 %).
RANGE_SLACK = math.log(1.05)


@dataclass
class FamilyModel:
    """The fitted regressors of one family: targets ``time`` (log of GPU time over the
    base time, :func:`base_time_s`), ``kernels`` (log1p), ``host`` (log of host time /
    probe), and in training the forward shares."""

    schema: FeatureSchema
    fits: dict[str, Any]
    #: The sampled range of each size feature (:data:`RANGE_FEATURES`): ``(min, max)``.
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)

    def outside(self, spec: str) -> list[str]:
        """The size features of op ``spec`` that lie outside the sampled ranges, each as
        ``name value (sampled lo-hi)`` in sizes, not logs."""
        values = dict(zip(shapes.SHAPE_FEATURES, shapes.shape_features(spec), strict=True))
        out = []
        for name, (lo, hi) in sorted(self.ranges.items()):
            v = values.get(name, -1.0)
            if v >= 0 and not lo - RANGE_SLACK <= v <= hi + RANGE_SLACK:
                sampled = f"{math.exp(lo):.0f}-{math.exp(hi):.0f}"
                out.append(f"{name.removeprefix('log_')} {math.exp(v):.0f} (sampled {sampled})")
        return out


@dataclass
class OpModel:
    """One GPU configuration's op models (module docstring)."""

    gpu: str
    peaks: rl.Peaks
    ceilings: rl.Peaks
    host_probe_s: float
    wait_power_w: float
    families: dict[str, FamilyModel]
    power_families: tuple[str, ...]
    power_fit: Any = None
    meta: dict[str, Any] = field(default_factory=dict)
    #: A synchronisation's cost, measured with the samples: ends a replayed step.
    sync_s: float = 0.0
    #: The device's gap between queued kernels (:func:`opcost.replay.replay`).
    kernel_gap_s: float = 0.0
    #: The shortest kernel the samples ran (:func:`~opcost.model.base_time.shortest_kernel_s`),
    #: part of the base time GPU time is learnt against (:func:`base_time_s`); 0: the
    #: roofline time alone.
    kernel_floor_s: float = 0.0
    #: What a leaf input adds to an isolated op's backward host time that a network's call
    #: does not pay, and the host time of a trivial backward node, both relative to the
    #: host probe (:func:`opcost.model.in_network.leaf_overhead`); 0 where the samples do
    #: not tell.
    leaf_overhead_ratio: float = 0.0
    backward_node_ratio: float = 0.0

    def family_model(self, key: str) -> FamilyModel | None:
        """The model of :func:`model_key` ``key``: its own, else its family's, else the
        stand-in for a family without one (:func:`_fallback`)."""
        family = family_of_key(key)
        return (
            self.families.get(key)
            or self.families.get(family)
            or self.families.get(_fallback(family, self.families))
        )

    def predict(
        self, ops: pd.DataFrame, host_probe_s: float | None = None, *, isolated: bool = False
    ) -> pd.DataFrame:
        """Per row of ``ops`` (columns ``spec``, ``mode``; the configuration's numerics are
        the model's): ``gpu_time_s``, ``forward_gpu_time_s``, ``n_kernels``,
        ``forward_n_kernels``, ``gpu_busy_time_s``, ``forward_gpu_busy_time_s``,
        ``graph_busy_time_s``, ``forward_graph_busy_time_s``, ``host_time_s``,
        ``forward_host_time_s``, ``efficiency``, ``roofline_time_s``, ``busy_power_w``,
        ``family``; host times for a host whose probe is ``host_probe_s`` (default: the
        one measured with the training data). In
        training, host times, GPU times and kernels are those of a call in a network
        (:mod:`opcost.model.in_network`: the leaf inputs' gradient accumulation and the
        copies of their gradients taken off, the clone autograd makes of an in-place op's
        input added; ``ops`` may carry the columns of :mod:`opcost.model.leaf_grads` and
        :mod:`opcost.model.inplace_saves`), or with ``isolated`` of the op measured alone."""
        probe = host_probe_s or self.host_probe_s
        rows = _with_conditions(ops, self.meta)
        roof = rl.roofline_times_s(list(rows["spec"]), list(rows["mode"]), self.ceilings)
        fam = rows["op_type"].map(family_of)
        # A view-like op that moves bytes (a gather, a reshape that copies) runs as a copy.
        fam = fam.where(~(fam.isin(NO_KERNEL_FAMILIES).to_numpy() & (roof > 0)), "copy")
        out = pd.DataFrame(index=rows.index)
        out["family"] = fam
        out["roofline_time_s"] = roof
        targets = {
            t: np.full(len(rows), np.nan)
            for t in ("time", "kernels", "host", "fwd_gpu", "fwd_host", "fwd_k", "busy", "graph")
        }
        keys = np.array(
            [model_key(f, t) for f, t in zip(fam, rows["op_type"], strict=True)], dtype=object
        )
        for key in pd.unique(keys):
            sel = keys == key
            model = self.family_model(key)
            if model is None:
                continue
            x = features(rows[sel], model.schema, roof[sel])
            for target, values in targets.items():
                fit = model.fits.get(target)
                if fit is not None:
                    values[sel] = fit.predict(x)
        out["n_kernels"] = targets["kernels"]
        out["host_ratio"] = targets["host"]
        for share in ("fwd_gpu", "fwd_host", "fwd_k"):
            out[share] = targets[share]
        training = rows["mode"].to_numpy() == "training"
        base = base_time_s(roof, training, self.kernel_floor_s)
        gpu = pd.Series(np.maximum(base * np.exp(targets["time"]), roof), index=out.index)
        no_kernels = fam.isin(NO_KERNEL_FAMILIES) | (out["roofline_time_s"] <= 0)
        out["gpu_time_s"] = gpu.where(~no_kernels, 0.0).fillna(0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            out["efficiency"] = (out["roofline_time_s"] / gpu).where(~no_kernels)
        out["n_kernels"] = np.expm1(out["n_kernels"]).clip(lower=0).where(~no_kernels, 0.0)
        out["host_time_s"] = np.exp(out["host_ratio"]) * probe
        for share, total, col in (
            ("fwd_gpu", "gpu_time_s", "forward_gpu_time_s"),
            ("fwd_host", "host_time_s", "forward_host_time_s"),
            ("fwd_k", "n_kernels", "forward_n_kernels"),
        ):
            s = out[share].clip(0, 1).fillna(0.5)
            out[col] = np.where(training, out[total] * s, out[total])
        if not isolated:
            out["host_time_s"] = in_network.network_host_time_s(
                out, rows, training, probe, self.leaf_overhead_ratio, self.backward_node_ratio
            )
        out["busy_power_w"] = self._busy_power(out, rows)
        if not isolated and training.any():
            rates = (self.peaks.memory_bytes_per_s, self.kernel_floor_s)
            in_network.without_leaf_copies(out, rows, training, *rates)
            in_network.with_inplace_saves(out, rows, training, *rates)
        busy = np.exp(np.minimum(np.nan_to_num(targets["busy"], nan=0.0), 0.0))
        out["gpu_busy_time_s"] = out["gpu_time_s"] * busy
        out["forward_gpu_busy_time_s"] = out["forward_gpu_time_s"] * busy
        graph = np.exp(np.minimum(np.nan_to_num(targets["graph"], nan=0.0), 0.0))
        graph = np.where(
            kernels_per_pass(out.assign(mode=rows["mode"])) > GRAPH_MIN_KERNELS, graph, 1.0
        )
        out["graph_busy_time_s"] = out["gpu_busy_time_s"] * graph
        out["forward_graph_busy_time_s"] = out["forward_gpu_busy_time_s"] * graph
        return out.drop(columns=["host_ratio", "fwd_gpu", "fwd_host", "fwd_k"])

    def _busy_power(self, out: pd.DataFrame, rows: pd.DataFrame) -> np.ndarray:
        if self.power_fit is None:
            return np.full(len(out), np.nan)
        x = op_power.features(out["family"], rows, out, self.power_families)
        return np.exp(self.power_fit.predict(x))


#: The key of the layer norms' own models within the norm family (:func:`model_key`).
ROW_NORM_MODEL = "norm.rows"


def model_key(family: str, op_type: str) -> str:
    """The model an op of ``family`` and ``op_type`` is learnt and predicted with: its
    family's, but layer norms (:data:`opcost.model.roofline.ROW_NORMS`) have their own
    (:data:`ROW_NORM_MODEL`): their roofline time is bounded by their rows, the other
    norms' by their bytes, and in shared trees each kind's ratio to its base time
    would move the other's."""
    if family == "norm" and reduced_name(op_type) in rl.ROW_NORMS:
        return ROW_NORM_MODEL
    return family


def family_of_key(key: str) -> str:
    """The op family of a model key (:func:`model_key`)."""
    return key.split(".", 1)[0]


def _fallback(family: str, families: dict[str, FamilyModel]) -> str:
    """The family whose model stands in for one without: memory-bound ops take the
    elementwise model."""
    return "elementwise" if "elementwise" in families else next(iter(families), "")


def _with_conditions(ops: pd.DataFrame, meta: dict[str, Any]) -> pd.DataFrame:
    rows = ops.copy()
    if "op_type" not in rows:
        rows["op_type"] = [json.loads(s)["type"] for s in rows["spec"]]
    rows["dtype"] = meta.get("dtype", "float32")
    rows["tf32"] = bool(meta.get("tf32", True))
    for c in ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w"):
        rows[c] = np.nan
    return rows


# -- fitting --------------------------------------------------------------------------------


def _targets(rows: pd.DataFrame, roof: np.ndarray, floor_s: float) -> dict[str, np.ndarray]:
    g = rows["gpu_time_s"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        training = rows["mode"].to_numpy() == "training"
        base = base_time_s(roof, training, floor_s)
        share = lambda a, b: np.where(training & (b > 0), a / b, np.nan)  # noqa: E731
        return {
            "time": np.where((g > 0) & (roof > 0), np.log(g / base), np.nan),
            "kernels": np.log1p(rows["n_kernels"].to_numpy()),
            "host": np.log(rows["host_time_s"].to_numpy() / rows["host_probe_s"].to_numpy()),
            "fwd_gpu": share(rows["forward_gpu_time_s"].to_numpy(), g),
            "fwd_host": share(
                rows["forward_host_time_s"].to_numpy(), rows["host_time_s"].to_numpy()
            ),
            "fwd_k": share(rows["forward_n_kernels"].to_numpy(), rows["n_kernels"].to_numpy()),
            "busy": np.log(np.clip(busy_share(rows), None, 1.0)),
            "graph": np.log(np.clip(_graph_shares(rows), None, 1.0)),
        }


def _graph_shares(rows: pd.DataFrame) -> np.ndarray:
    """:func:`graph_share` of each row, as :func:`fit` took it before a peer's GPU times
    were carried over (column ``_graph_share``), else from the row's own columns."""
    if "_graph_share" in rows:
        return rows["_graph_share"].to_numpy(dtype=float)
    return graph_share(rows)


def features(rows: pd.DataFrame, schema: FeatureSchema, roof: np.ndarray) -> pd.DataFrame:
    """The family model's features: the pipeline's encoding (thesis section 4.2), the
    op's shape features (:func:`opcost.model.shapes.shape_features`: the matrix product
    it amounts to) and the log of the roofline time (column :data:`LOG_ROOFLINE`)."""
    x = encode_features(rows, schema)
    x[list(shapes.SHAPE_FEATURES)] = shapes.shape_matrix(rows["spec"])
    x[LOG_ROOFLINE] = np.log(np.clip(np.asarray(roof, dtype=float), 1e-12, None))
    return x


def _ensemble(fitted: Any) -> TreeEnsemble:
    """A fitted scikit-learn regressor as the plain-array ensemble that predicts and is
    saved (:mod:`opcost.model.trees`)."""
    return TreeEnsemble.from_sklearn(fitted)


def fit_family(
    rows: pd.DataFrame,
    roof: np.ndarray,
    make: Any,
    kernel_floor_s: float | np.ndarray = 0.0,
    feature_roof: np.ndarray | None = None,
) -> FamilyModel:
    """One family's regressors (``make()`` gives a fresh unfitted regressor), GPU time
    against the base time of ``roof`` and ``kernel_floor_s`` (:func:`base_time_s`; one
    value, or one per row), the roofline time feature from ``feature_roof`` (default
    ``roof``)."""
    schema = build_schema(rows["op_type"])
    xs = features(rows, schema, roof if feature_roof is None else feature_roof)
    fits = {}
    for target, y in _targets(rows, roof, kernel_floor_s).items():
        ok = np.isfinite(y)
        if ok.sum() >= (MIN_GRAPH_WINDOWS if target == "graph" else 2):
            regressor = make()
            if target not in MAIN_TARGETS:
                _auxiliary(regressor)
            fits[target] = _ensemble(regressor.fit(xs[ok], y[ok]))
    return FamilyModel(schema, fits, sampled_ranges(xs))


def sampled_ranges(xs: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """``(min, max)`` of each of :data:`RANGE_FEATURES` over a family's samples, where
    the family has it (shape features are -1 where an op has no such size)."""
    out = {}
    for name in RANGE_FEATURES:
        v = xs[name].to_numpy(dtype=float)
        v = v[v >= 0]
        if len(v):
            out[name] = (float(v.min()), float(v.max()))
    return out


def _auxiliary(regressor: Any) -> None:
    """Fewer trees for a target other than GPU time (:data:`MAIN_TARGETS`)."""
    for name in ("n_estimators", "max_iter"):
        n = regressor.get_params().get(name)
        if isinstance(n, int):
            regressor.set_params(**{name: max(AUXILIARY_MIN_TREES, n // AUXILIARY_TREES_DIVISOR)})


def fit(
    table: pd.DataFrame,
    gpu: str,
    make: Any,
    *,
    twin: pd.DataFrame | None = None,
    peers: pd.DataFrame | None = None,
    transfer_peers: bool = True,
) -> OpModel:
    """The op models of one GPU configuration from its op-space table (the chunks
    concatenated), families it lacks from ``twin``'s table (module docstring). With
    ``peers`` (the tables of its :func:`~opcost.model.op_tables.peers_of`, concatenated;
    then ``twin`` may hold their twins too), GPU time, kernels, host time and the forward
    shares are learnt also from the configurations only a peer measured
    (:func:`~opcost.model.op_tables.pooled_rows`): with ``transfer_peers``, their GPU
    times carried over to this configuration's GPU by the ratio of the samples both
    measured and learnt against its base time (:mod:`opcost.model.peer_transfer`; a
    family with too few such samples, and every family without ``transfer_peers``,
    against the peer's own base time: its ceilings and kernel floor); busy power learns
    also from the power windows only a peer measured, scaled by the ratio of those both
    measured (:func:`~opcost.model.op_power.peer_windows`); the host constants stay the
    configuration's own."""
    rows, pooled = pooled_rows(table, twin, peers)
    # A peer's sample keeps the graph share of its own times (a ratio of two of them).
    pooled["_graph_share"] = graph_share(pooled)
    name = str(table["gpu_name"].iloc[0])
    # Every sample of a GPU sets its peaks, ceilings and kernel floor.
    per_gpu = {}
    for gpu_name, part in pooled.groupby(pooled["gpu_name"].astype(str)):
        measured = part[part["_measured"]] if part["_measured"].any() else part
        per_gpu[gpu_name] = gpu_base(part, measured)
    peaks, ceil, own_floor = per_gpu[name]
    # Power windows as the peers measured them, before their GPU times are carried over.
    peer_rows = pooled[pooled["gpu_name"].astype(str) != name]
    carried: dict[str, dict[str, float]] = {}
    if transfer_peers:

        def family_features(part: pd.DataFrame, schema: FeatureSchema) -> pd.DataFrame:
            own = rl.roofline_times_s(list(part["spec"]), list(part["mode"]), ceil)
            return features(part, schema, own)

        pooled, carried = peer_transfer.transfer(pooled, name, make, family_features)
    train = pooled[pooled["_train"].astype(bool)].reset_index(drop=True)
    gpus = train["gpu_name"].astype(str).to_numpy()
    # The roofline time as a feature against this configuration's ceilings for every
    # sample, as a prediction computes it: a configuration is one point whoever measured it;
    # the base time a sample's GPU time is learnt against, against its own GPU's.
    own_roof = rl.roofline_times_s(list(train["spec"]), list(train["mode"]), ceil)
    roof, floor = own_roof.copy(), np.full(len(train), own_floor)
    for gpu_name, (_, other_ceil, other_floor) in per_gpu.items():
        sel = gpus == gpu_name
        if gpu_name != name and sel.any():
            part = train[sel]
            roof[sel] = rl.roofline_times_s(list(part["spec"]), list(part["mode"]), other_ceil)
            floor[sel] = other_floor
    families = {}
    keys = [model_key(f, t) for f, t in zip(train["family"], train["op_type"], strict=True)]
    for key, part in train.groupby(np.array(keys, dtype=object)):
        i = part.index.to_numpy()
        families[str(key)] = fit_family(part, roof[i], make, floor[i], own_roof[i])
    p_wait = op_power.wait_power_w(rows)
    overhead, node = in_network.leaf_overhead(rows)
    model = OpModel(
        leaf_overhead_ratio=overhead,
        backward_node_ratio=node,
        gpu=gpu,
        sync_s=float(table["sync_s"].median()) if "sync_s" in table else 0.0,
        kernel_gap_s=KERNEL_GAP_S,
        kernel_floor_s=own_floor,
        peaks=peaks,
        ceilings=ceil,
        host_probe_s=float(rows["host_probe_s"].median()),
        wait_power_w=p_wait,
        families=families,
        power_families=tuple(sorted({family_of_key(k) for k in families})),
        meta={
            "dtype": str(rows["dtype"].iloc[0]),
            "tf32": bool(table["tf32"].iloc[0]),
            "cudnn_benchmark": bool(rows["cudnn_benchmark"].iloc[0]),
            "gpu_name": str(table["gpu_name"].iloc[0]),
            "driver_version": str(table["driver_version"].iloc[0]),
            "torch_version": str(table["torch_version"].iloc[0]),
            "host_cpu": str(table["host_cpu"].iloc[0]),
            "samples": int(len(rows)),
            "pooled_samples": len(train),
            "pooled_gpus": sorted(per_gpu),
            "carried_over": carried,
            "measured": _measured_dates(table),
        },
    )
    model.power_fit = op_power.fit(model, rows, make, peer_rows)
    return model


def _measured_dates(table: pd.DataFrame) -> list[str]:
    """The first and last day (UTC) the samples were measured; empty if not recorded."""
    t = pd.to_numeric(table.get("finished_unix_s"), errors="coerce").dropna()
    if t.empty:
        return []
    days = pd.to_datetime(t, unit="s", utc=True).dt.strftime("%Y-%m-%d")
    return [str(days.min()), str(days.max())]
