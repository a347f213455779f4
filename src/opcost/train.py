"""Training: per GPU configuration, a regressor for time and one for power (thesis chapter 4).

Method
------
* Rows: the dataset's operation measurements (``kind == "op"``) with a positive time.
  Features: :func:`opcost.features.encode_features`, with each row's *measured* SM clock,
  memory clock and power limit, so one model covers every GPU setting (thesis 4.2).
* Time: the regressor fits ``log(time_s)`` and predicts ``exp`` of it. Op times span
  orders of magnitude; on the log scale the model's error is relative, which is what
  matters when summing a network.
* Time relative to a roofline (``time_target: roofline_ratio``, not the default): the
  regressor fits ``log(time_s / t_ref)``, ``t_ref = max(flops / roofline_flops_per_s,
  bytes_moved / roofline_bytes_per_s) + roofline_launch_s`` (the op's derived counts), and
  a prediction is ``t_ref`` times ``exp`` of its output. A forest predicts no value beyond
  those it was trained on; fitting a ratio, it learns an efficiency, and an op heavier
  than any in training gets a time in proportion to its work. The constants need not be
  the GPU's peaks: the forest learns the ratio. docs/validation.md has what it changes.
* Power: the regressor fits ``power_w`` on the rows with usable power: finite and not
  ``low_power_samples`` (too few distinct readings, which the evaluate stage says not to
  use unflagged). Without such rows there is no power model, and power and energy
  predictions are NaN. Energy = predicted time × predicted power (thesis 4.1).
* Regressor: ``random_forest`` (thesis), ``extra_trees`` or ``gradient_boosting``
  (scikit-learn's ``HistGradientBoostingRegressor``, so a model does not change with
  whether XGBoost happens to be installed); hyperparameters from the config's ``train``.
  Once fitted, it is stored as an :class:`opcost.predict.TreeEnsemble` (same predictions,
  no scikit-learn needed to predict).
* Prediction conditions: a user predicts at a GPU *setting*, not at a measured clock. The
  conditions of a setting are the medians of the measured clocks and power limit over the
  training rows of that setting and mode; the validations below predict at those
  conditions too, exactly as ``opcost predict`` does.

Validation (written to ``metrics.json``)
----------------------------------------
* *Hold-out*: a random ``holdout_fraction`` of the operations (by ``op_id``: all of an op's
  settings and modes) is left out of training and predicted. Baseline: the median time
  and power of the training rows of the same op type and mode (the mode's median for a
  type not in training).
* *Leave one network out* (LONO): for each network whose op table is given, every op that
  occurs in it is removed from training (also where other networks share it), the models
  are trained on the rest, and the network's ops are predicted and summed by count. This
  is the honest test of "a network never run". Its sums are compared with the measured
  whole network (``kind == "network"`` rows) and with the sum of the network's measured
  ops (the model's own error, without the summation error of thesis 5.1).
* MAPE = mean(|predicted - measured| / measured) · 100, in percent. Power and energy are
  scored only where the measured power is usable (as above).

Files (``results/predictors/{gpu}/``, written by :func:`train_gpu`)
-------------------------------------------------------------------
``time.npz``, ``power.npz`` (none without power), ``features.json`` and
``manifest.json`` (written last: the SHA-256 of every file here, the dataset's path and
SHA-256): the predictor, see :mod:`opcost.predict`. ``metrics.json``: the scores, under ``holdout``
(``op``, ``baseline_op``) and ``lono`` (``op``, ``baseline_op``, ``network``,
``network_vs_summed_ops``), each per mode and ``all``: ``n``, ``time_mape_pct``,
``power_mape_pct``, ``energy_mape_pct`` (null where nothing is comparable).

``holdout_predictions.parquet``, one row per held-out op measurement:

==================== ===== ===========================================================
column               unit  meaning
==================== ===== ===========================================================
gpu, setting, mode   --    as in the dataset
op_id, op_type       --    the operation
time_s               s     measured time per iteration
time_pred_s          s     predicted (models trained without this op)
power_w              W     measured power (NaN for time-only data)
power_pred_w         W     predicted power (NaN without a power model)
energy_j             J     measured energy per iteration
energy_pred_j        J     time_pred_s · power_pred_w
low_power_samples    --    the measured power is flagged (too few distinct readings)
time_baseline_s      s     per-type median baseline (see above)
power_baseline_w     W     per-type median baseline
==================== ===== ===========================================================

``network_predictions.parquet``, leave one network out, one row per network, setting and
mode:

==================== ===== ===========================================================
column               unit  meaning
==================== ===== ===========================================================
gpu                  --    GPU configuration
model_input          --    the network left out
setting, mode        --    as in the dataset
time_pred_s          s     Σ count · predicted op time
energy_pred_j        J     Σ count · predicted op energy
power_pred_w         W     energy_pred_j / time_pred_s
time_s, energy_j     s, J  the measured whole network (NaN if not measured)
power_w              W     the measured whole network's power
time_sum_ops_s       s     Σ count · measured op time (NaN unless every op was measured)
energy_sum_ops_j     J     Σ count · measured op energy (likewise)
n_ops                --    distinct operations of the network
n_ops_measured       --    of which measured at this setting and mode
n_ops_unseen         --    of which of a type absent from the training data
n_calls              --    Σ count
==================== ===== ===========================================================
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opcost import __version__
from opcost.errors import OpcostError
from opcost.features import CONDITIONS, build_schema, encode_features
from opcost.predict import (
    HOLDOUT_FILE,
    MANIFEST_FILE,
    METRICS_FILE,
    NETWORKS_FILE,
    Predictor,
    TimeReference,
    TreeEnsemble,
    save_predictor,
    sum_by_count,
    training_ranges,
)
from opcost.tables import TableError, read_parquet, write_parquet_atomic

REGRESSORS = ("random_forest", "extra_trees", "gradient_boosting")
TIME_TARGETS = ("log_time", "roofline_ratio")
#: Dataset columns training reads.
DATASET_COLUMNS = (
    "gpu",
    "setting",
    "mode",
    "kind",
    "op_id",
    "model_input",
    "op_type",
    "spec",
    "dtype",
    "tf32",
    "time_s",
    "power_w",
    "energy_j",
    "low_power_samples",
    *CONDITIONS,
)
HOLDOUT_COLUMNS = [
    "gpu",
    "setting",
    "mode",
    "op_id",
    "op_type",
    "time_s",
    "time_pred_s",
    "power_w",
    "power_pred_w",
    "energy_j",
    "energy_pred_j",
    "low_power_samples",
    "time_baseline_s",
    "power_baseline_w",
]
NETWORK_COLUMNS = [
    "gpu",
    "model_input",
    "setting",
    "mode",
    "time_pred_s",
    "energy_pred_j",
    "power_pred_w",
    "time_s",
    "energy_j",
    "power_w",
    "time_sum_ops_s",
    "energy_sum_ops_j",
    "n_ops",
    "n_ops_measured",
    "n_ops_unseen",
    "n_calls",
]


class TrainError(OpcostError, ValueError):
    """Training cannot proceed; the message says what is missing."""


@dataclass(frozen=True)
class TrainConfig:
    """The config's ``train`` section (``workflow/schemas/config.schema.yaml``)."""

    regressor: str = "random_forest"
    n_estimators: int = 300
    max_depth: int | None = None
    min_samples_leaf: int = 1
    holdout_fraction: float = 0.2
    seed: int = 0
    #: Whether the feature vector has the derived counts (FLOPs, parameters, bytes).
    derived: bool = True
    #: What the time model fits: ``log_time`` (thesis) or ``roofline_ratio``.
    time_target: str = "log_time"
    #: The roofline estimate ``roofline_ratio`` divides by (see the module docstring).
    roofline_flops_per_s: float = 1e14
    roofline_bytes_per_s: float = 2e12
    roofline_launch_s: float = 5e-6

    @classmethod
    def from_config(cls, section: dict[str, Any]) -> TrainConfig:
        known = {k: v for k, v in section.items() if k in cls.__dataclass_fields__}
        cfg = cls(**known)
        if cfg.regressor not in REGRESSORS:
            raise TrainError(
                f"train.regressor {cfg.regressor!r} is unknown; use one of {', '.join(REGRESSORS)}"
            )
        if cfg.time_target not in TIME_TARGETS:
            raise TrainError(
                f"train.time_target {cfg.time_target!r} is unknown; use one of "
                f"{', '.join(TIME_TARGETS)}"
            )
        for name in ("roofline_flops_per_s", "roofline_bytes_per_s", "roofline_launch_s"):
            if not getattr(cfg, name) > 0:
                raise TrainError(f"train.{name} must be positive, not {getattr(cfg, name)!r}")
        return cfg

    def time_reference(self) -> TimeReference | None:
        """The roofline estimate the time model is relative to, or None (``log_time``)."""
        if self.time_target != "roofline_ratio":
            return None
        return TimeReference(
            flops_per_s=self.roofline_flops_per_s,
            bytes_per_s=self.roofline_bytes_per_s,
            launch_s=self.roofline_launch_s,
        )


def make_regressor(cfg: TrainConfig, n_jobs: int | None = None) -> Any:
    """A fresh, unfitted regressor as the config says."""
    from sklearn.ensemble import (
        ExtraTreesRegressor,
        HistGradientBoostingRegressor,
        RandomForestRegressor,
    )

    if cfg.regressor == "gradient_boosting":
        return HistGradientBoostingRegressor(
            max_iter=cfg.n_estimators,
            max_depth=cfg.max_depth,
            min_samples_leaf=cfg.min_samples_leaf,
            early_stopping=False,
            random_state=cfg.seed,
        )
    cls = RandomForestRegressor if cfg.regressor == "random_forest" else ExtraTreesRegressor
    return cls(
        n_estimators=cfg.n_estimators,
        max_depth=cfg.max_depth,
        min_samples_leaf=cfg.min_samples_leaf,
        random_state=cfg.seed,
        n_jobs=n_jobs,
    )


def op_rows(dataset: pd.DataFrame) -> pd.DataFrame:
    """The operation measurements usable for training: ``kind == "op"``, time > 0."""
    missing = [c for c in DATASET_COLUMNS if c not in dataset.columns]
    if missing:
        raise TrainError(f"the dataset lacks columns {missing}; re-run the evaluate stage")
    rows = dataset[(dataset["kind"] == "op") & (dataset["time_s"] > 0)]
    return rows.reset_index(drop=True)


def usable_power(rows: pd.DataFrame) -> pd.Series:
    """Rows whose measured power may be used: finite and not ``low_power_samples``."""
    return np.isfinite(rows["power_w"].astype("float64")) & ~rows["low_power_samples"].astype(bool)


def setting_conditions(rows: pd.DataFrame) -> pd.DataFrame:
    """Per trained setting and mode: the median measured conditions (prediction inputs)."""
    keys = ["setting", "mode"]
    med = rows.groupby(keys, sort=True)[list(CONDITIONS)].median()
    first = rows.groupby(keys, sort=True)[["dtype", "tf32"]].agg(lambda s: s.mode().iloc[0])
    n = rows.groupby(keys, sort=True).size().rename("n_rows")
    out = med.join(first).join(n).reset_index()
    out["tf32"] = out["tf32"].astype(bool)
    return out[["setting", "mode", "dtype", "tf32", *CONDITIONS, "n_rows"]]


def fit_predictor(
    rows: pd.DataFrame,
    cfg: TrainConfig,
    gpu: str,
    n_jobs: int | None = None,
) -> Predictor:
    """Fit the time and power models on op measurement rows.

    Raises:
        TrainError: no rows to train on.
    """
    if rows.empty:
        raise TrainError(f"{gpu}: no operation measurements to train on")
    reference = cfg.time_reference()
    schema = build_schema(rows["op_type"], derived=cfg.derived or reference is not None)
    x = encode_features(rows, schema)
    log_time = np.log(rows["time_s"].to_numpy())
    if reference is not None:
        log_time = log_time - np.log(reference.estimate_s(x))
    time_model = make_regressor(cfg, n_jobs).fit(x, log_time)
    power_ok = usable_power(rows).to_numpy()
    power_model = None
    if power_ok.any():
        power_model = make_regressor(cfg, n_jobs).fit(
            x[power_ok], rows.loc[power_ok, "power_w"].to_numpy()
        )
    return Predictor(
        gpu=gpu,
        schema=schema,
        # Flat arrays: small files, and predicting needs no scikit-learn import.
        time_model=TreeEnsemble.from_sklearn(time_model),
        power_model=None if power_model is None else TreeEnsemble.from_sklearn(power_model),
        conditions=setting_conditions(rows).drop(columns="n_rows"),
        ranges=training_ranges(rows),
        time_reference=reference,
        meta={
            "regressor": cfg.regressor,
            "train_config": asdict(cfg),
            "n_rows": len(rows),
            "n_ops": int(rows["op_id"].nunique()),
            "n_power_rows": int(power_ok.sum()),
            # The GPUs measured (nvidia-smi's names), for the manifest.
            "gpu_names": sorted(map(str, rows.get("gpu_name", pd.Series()).dropna().unique())),
            "opcost_version": __version__,
            "sklearn_version": _sklearn_version(),
            "trained_unix_s": time.time(),
        },
    )


def _sklearn_version() -> str:
    import sklearn

    return sklearn.__version__


def predict_at_settings(predictor: Predictor, rows: pd.DataFrame) -> pd.DataFrame:
    """Predict measured rows at their setting's trained conditions, as ``opcost predict`` does.

    A row whose (setting, mode) the predictor was not trained on keeps its own measured
    conditions.
    """
    columns = ["dtype", "tf32", *CONDITIONS]
    cond = predictor.conditions.set_index(["setting", "mode"])[columns]
    keys = pd.MultiIndex.from_arrays([rows["setting"], rows["mode"]])
    known = keys.isin(cond.index)
    at = rows.copy()
    for c in columns:
        at[c] = np.where(known, cond[c].reindex(keys).to_numpy(), rows[c].to_numpy())
    at["tf32"] = at["tf32"].astype(bool)
    return predictor.predict_rows(at)


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


def holdout_split(op_ids: Sequence[str], fraction: float, seed: int) -> set[str]:
    """A random ``fraction`` of the distinct ops (at least one, never all)."""
    unique = sorted(set(op_ids))
    if len(unique) < 2:
        raise TrainError("a hold-out split needs at least two distinct operations")
    n = min(len(unique) - 1, max(1, round(fraction * len(unique))))
    rng = np.random.default_rng(seed)
    return set(rng.choice(unique, size=n, replace=False).tolist())


def holdout_predictions(
    rows: pd.DataFrame, cfg: TrainConfig, gpu: str, n_jobs: int | None = None
) -> pd.DataFrame:
    """Train without a random part of the ops, predict that part (columns: ``HOLDOUT_COLUMNS``)."""
    held = holdout_split(rows["op_id"].tolist(), cfg.holdout_fraction, cfg.seed)
    is_test = rows["op_id"].isin(held)
    train, test = rows[~is_test], rows[is_test]
    predictor = fit_predictor(train, cfg, gpu, n_jobs)
    pred = predict_at_settings(predictor, test)
    base = baseline_predictions(train, test)
    out = pd.concat([test, pred, base], axis=1)
    out["gpu"] = gpu
    return out[HOLDOUT_COLUMNS].reset_index(drop=True)


def crossval_predictions(
    rows: pd.DataFrame, cfg: TrainConfig, gpu: str, k: int = 5, n_jobs: int | None = None
) -> pd.DataFrame:
    """K-fold cross-validation over ops: every op is predicted once by models without it.

    Folds split the distinct ops at random (``cfg.seed``); returns ``HOLDOUT_COLUMNS``
    for every row. More stable than a single hold-out on a small dataset.
    """
    ids = np.array(sorted(set(rows["op_id"])))
    if len(ids) < k:
        raise TrainError(f"{k}-fold cross-validation needs at least {k} distinct operations")
    np.random.default_rng(cfg.seed).shuffle(ids)
    parts = []
    for fold in range(k):
        is_test = rows["op_id"].isin(set(ids[fold::k]))
        train, test = rows[~is_test], rows[is_test]
        predictor = fit_predictor(train, cfg, gpu, n_jobs)
        parts.append(
            pd.concat(
                [test, predict_at_settings(predictor, test), baseline_predictions(train, test)],
                axis=1,
            )
        )
    out = pd.concat(parts).sort_index()
    out["gpu"] = gpu
    return out[HOLDOUT_COLUMNS].reset_index(drop=True)


def network_predictions(
    rows: pd.DataFrame,
    networks: pd.DataFrame,
    op_tables: dict[str, pd.DataFrame],
    cfg: TrainConfig,
    gpu: str,
    n_jobs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Leave-one-network-out predictions.

    Args:
        rows: op measurement rows (:func:`op_rows`).
        networks: the dataset's ``kind == "network"`` rows (measured whole networks).
        op_tables: model-input set -> its op table (``op_id``, ``spec``, ``type``, ``count``).
        cfg, gpu, n_jobs: as for :func:`fit_predictor`.
        progress: called with each network's name before it is trained.

    Returns:
        ``(per_network, per_op)``: one row per network, setting and mode
        (``NETWORK_COLUMNS``); and every measured op of each left-out network with its
        prediction (``HOLDOUT_COLUMNS`` plus ``model_input``).
    """
    net_rows, op_out = [], []
    for name in sorted(op_tables):
        table = op_tables[name]
        if progress:
            progress(name)
        train = rows[~rows["op_id"].isin(set(table["op_id"]))]
        if train.empty:
            if progress:
                progress(f"{name}: skipped, no operation outside it to train on")
            continue
        predictor = fit_predictor(train, cfg, gpu, n_jobs)
        seen_types = set(train["op_type"])
        ops = table.drop_duplicates("op_id")
        n_unseen = int((~ops["type"].isin(seen_types)).sum())
        pred = predictor.predict_ops(ops).merge(ops[["op_id", "count"]], on="op_id")
        totals = sum_by_count(pred, ["setting", "mode"])
        measured_ops = rows[rows["op_id"].isin(set(ops["op_id"]))]
        for r in totals.itertuples(index=False):
            m_ops = measured_ops[
                (measured_ops["setting"] == r.setting) & (measured_ops["mode"] == r.mode)
            ]
            m_ops = m_ops.merge(ops[["op_id", "count"]], on="op_id")
            complete = m_ops["op_id"].nunique() == len(ops)
            whole = networks[
                (networks["model_input"] == name)
                & (networks["setting"] == r.setting)
                & (networks["mode"] == r.mode)
            ]
            net_rows.append(
                {
                    "gpu": gpu,
                    "model_input": name,
                    "setting": r.setting,
                    "mode": r.mode,
                    "time_pred_s": r.time_pred_s,
                    "energy_pred_j": r.energy_pred_j,
                    "power_pred_w": r.power_pred_w,
                    "time_s": float(whole["time_s"].iloc[0]) if len(whole) else np.nan,
                    "energy_j": float(whole["energy_j"].iloc[0]) if len(whole) else np.nan,
                    "power_w": float(whole["power_w"].iloc[0]) if len(whole) else np.nan,
                    "time_sum_ops_s": _summed(m_ops, "time_s") if complete else np.nan,
                    "energy_sum_ops_j": _summed(m_ops, "energy_j") if complete else np.nan,
                    "n_ops": len(ops),
                    "n_ops_measured": int(m_ops["op_id"].nunique()),
                    "n_ops_unseen": n_unseen,
                    "n_calls": int(ops["count"].sum()),
                }
            )
        if not measured_ops.empty:
            p = predict_at_settings(predictor, measured_ops)
            base = baseline_predictions(train, measured_ops)
            o = pd.concat([measured_ops, p, base], axis=1)
            o["gpu"] = gpu
            o = o[HOLDOUT_COLUMNS].copy()
            o["model_input"] = name
            op_out.append(o)
    per_network = pd.DataFrame(net_rows, columns=NETWORK_COLUMNS)
    per_op = (
        pd.concat(op_out, ignore_index=True)
        if op_out
        else pd.DataFrame(columns=[*HOLDOUT_COLUMNS, "model_input"])
    )
    return per_network, per_op


def _summed(ops: pd.DataFrame, column: str) -> float:
    """Σ count · value over measured ops; NaN if any value is missing (time-only data)."""
    values = ops[column] * ops["count"]
    return float(values.sum()) if values.notna().all() else np.nan


def mape(predicted: Any, measured: Any) -> float | None:
    """Mean absolute percentage error, percent; None where nothing is comparable."""
    p = np.asarray(predicted, dtype=np.float64)
    m = np.asarray(measured, dtype=np.float64)
    ok = np.isfinite(p) & np.isfinite(m) & (m > 0)
    if not ok.any():
        return None
    return float(np.mean(np.abs(p[ok] - m[ok]) / m[ok]) * 100.0)


def _op_scores(table: pd.DataFrame, time_col: str, power_col: str) -> dict[str, Any]:
    power_ok = usable_power(table)
    energy_pred = (
        table["time_pred_s"] * table["power_pred_w"]
        if time_col == "time_pred_s"
        else table[time_col] * table[power_col]
    )
    return {
        "n": len(table),
        "n_power": int(power_ok.sum()),
        "time_mape_pct": mape(table[time_col], table["time_s"]),
        "power_mape_pct": mape(table.loc[power_ok, power_col], table.loc[power_ok, "power_w"]),
        "energy_mape_pct": mape(energy_pred[power_ok], table.loc[power_ok, "energy_j"]),
    }


def op_scores(table: pd.DataFrame, *, baseline: bool = False) -> dict[str, Any]:
    """Op-level MAPE of time, power and energy per mode and over all modes."""
    cols = ("time_baseline_s", "power_baseline_w") if baseline else ("time_pred_s", "power_pred_w")
    out = {mode: _op_scores(g, *cols) for mode, g in table.groupby("mode", sort=True)}
    out["all"] = _op_scores(table, *cols)
    return out


def network_scores(table: pd.DataFrame, time_col: str, energy_col: str) -> dict[str, Any]:
    """Network-level MAPE of predicted sums against ``time_col``/``energy_col``, per mode."""

    def score(g: pd.DataFrame) -> dict[str, Any]:
        power = g[energy_col] / g[time_col]
        return {
            "n": int(g[time_col].notna().sum()),
            "time_mape_pct": mape(g["time_pred_s"], g[time_col]),
            "energy_mape_pct": mape(g["energy_pred_j"], g[energy_col]),
            "power_mape_pct": mape(g["power_pred_w"], power),
        }

    out = {mode: score(g) for mode, g in table.groupby("mode", sort=True)}
    out["all"] = score(table)
    return out


def build_metrics(
    gpu: str,
    rows: pd.DataFrame,
    cfg: TrainConfig,
    holdout: pd.DataFrame,
    lono_networks: pd.DataFrame,
    lono_ops: pd.DataFrame,
) -> dict[str, Any]:
    """The content of ``metrics.json``."""
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


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if isinstance(obj, np.generic):
        return _json_safe(obj.item())
    return obj


def load_op_tables(paths: Sequence[str | Path]) -> dict[str, pd.DataFrame]:
    """Op tables (``results/ops/{model_input}.parquet``) by model-input set."""
    tables = {}
    for path in paths:
        table = read_parquet(path, columns=["model_input", "op_id", "type", "spec", "count"])
        if table.empty:
            continue
        names = set(table["model_input"])
        if len(names) != 1:
            raise TableError(f"{path}: holds {len(names)} model-input sets, expected one")
        tables[names.pop()] = table
    return tables


@dataclass(frozen=True)
class TrainOutputs:
    """Where :func:`train_gpu` writes (the rule's outputs)."""

    directory: Path
    metrics: Path
    holdout: Path
    networks: Path

    @classmethod
    def under(cls, directory: str | Path) -> TrainOutputs:
        d = Path(directory)
        return cls(
            d,
            d / METRICS_FILE,
            d / HOLDOUT_FILE,
            d / NETWORKS_FILE,
        )


def train_gpu(
    dataset_path: str | Path,
    op_table_paths: Sequence[str | Path],
    outputs: TrainOutputs,
    cfg: TrainConfig,
    gpu: str,
    n_jobs: int | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Validate and train one GPU configuration's predictor; write every output.

    Writes ``metrics.json``, ``holdout_predictions.parquet`` and
    ``network_predictions.parquet``, then the predictor (``time.npz``, ``power.npz``,
    ``features.json``) into ``outputs.directory``, and last ``manifest.json``, which
    covers them all: a run interrupted at any point leaves no predictor that loads.
    Returns the metrics.
    """
    (outputs.directory / MANIFEST_FILE).unlink(missing_ok=True)
    dataset = read_parquet(dataset_path, columns=list(DATASET_COLUMNS))
    rows = op_rows(dataset)
    if rows.empty:
        raise TrainError(f"{dataset_path}: no operation measurements to train on")
    networks = dataset[dataset["kind"] == "network"]
    log(
        f"{gpu}: {len(rows)} op measurements of {rows['op_id'].nunique()} ops, "
        f"{int(usable_power(rows).sum())} with usable power, {len(networks)} network rows"
    )
    t0 = time.perf_counter()
    holdout = holdout_predictions(rows, cfg, gpu, n_jobs)
    log(f"hold-out: {holdout['op_id'].nunique()} ops ({time.perf_counter() - t0:.1f} s)")
    tables = load_op_tables(op_table_paths)
    lono_networks, lono_ops = network_predictions(
        rows, networks, tables, cfg, gpu, n_jobs, progress=lambda n: log(f"leave out {n}")
    )
    metrics = _json_safe(build_metrics(gpu, rows, cfg, holdout, lono_networks, lono_ops))
    predictor = fit_predictor(rows, cfg, gpu, n_jobs)
    predictor.meta["dataset"] = str(dataset_path)
    write_parquet_atomic(holdout, outputs.holdout)
    write_parquet_atomic(lono_networks, outputs.networks)
    outputs.metrics.write_text(json.dumps(metrics, indent=1, sort_keys=True) + "\n")
    save_predictor(predictor, outputs.directory, dataset=dataset_path)
    log(f"done in {time.perf_counter() - t0:.1f} s")
    return metrics


__all__ = [
    "REGRESSORS",
    "TrainConfig",
    "TrainError",
    "TrainOutputs",
    "baseline_predictions",
    "crossval_predictions",
    "fit_predictor",
    "holdout_predictions",
    "holdout_split",
    "make_regressor",
    "mape",
    "network_predictions",
    "op_rows",
    "predict_at_settings",
    "setting_conditions",
    "train_gpu",
    "usable_power",
]
