"""Training: per GPU configuration, a regressor for time and one for power (thesis chapter 4).

:func:`train_gpu` (the rule ``train``, ``opcost train``) reads a dataset, validates the
method on it and writes the predictor (:mod:`opcost.model.format`) with its scores:

* :func:`fit_predictor`: the time model fits ``log(time_s)`` (or the log of time over a
  roofline estimate, ``time_target: roofline_ratio``), the power model ``power_w`` on
  rows with usable power (:func:`usable_power`); features are each row's op and measured
  conditions (:mod:`opcost.model.features`); the fitted scikit-learn ensemble is kept as
  a :class:`~opcost.model.trees.TreeEnsemble`.
* :func:`holdout_predictions`: a random part of the ops left out and predicted, with a
  per-type median baseline; :func:`network_predictions`: each network left out (every
  op it holds) and predicted as the sum of its ops.
* ``metrics.json``: MAPE of both, per mode (:func:`opcost.model.accuracy.build_metrics`).

The config's ``train`` section (its defaults in the config schema) becomes a
:class:`TrainConfig`. docs/prediction.md describes the method and the current results,
docs/formats.md the files::

    train_gpu("results/dataset/h100.parquet", op_tables, TrainOutputs.under(directory),
              TrainConfig.from_config(config["train"]), "h100")
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opcost import __version__
from opcost.config import load_schema, schema_defaults
from opcost.errors import OpcostError
from opcost.io import TableError, read_parquet, write_json_atomic, write_parquet_atomic
from opcost.model.accuracy import baseline_predictions, build_metrics, json_safe, usable_power
from opcost.model.features import CONDITIONS, build_schema, encode_features
from opcost.model.format import (
    HOLDOUT_COLUMNS,
    HOLDOUT_FILE,
    MANIFEST_FILE,
    METRICS_FILE,
    NETWORK_COLUMNS,
    NETWORKS_FILE,
    save_predictor,
)
from opcost.model.predictor import Predictor, TimeReference, sum_by_count, training_ranges
from opcost.model.trees import TreeEnsemble
from opcost.schemas import TRAIN_COLUMNS as DATASET_COLUMNS  # the columns training reads

#: The config schema's ``train`` properties: TrainConfig's defaults and allowed values.
_SCHEMA = load_schema()["properties"]["train"]["properties"]
_DEFAULT = schema_defaults("train")
REGRESSORS = tuple(_SCHEMA["regressor"]["enum"])
TIME_TARGETS = tuple(_SCHEMA["time_target"]["enum"])


class TrainError(OpcostError, ValueError):
    """Training cannot proceed; the message says what is missing."""


@dataclass(frozen=True)
class TrainConfig:
    """The config's ``train`` section; each default and meaning is the config schema's."""

    regressor: str = _DEFAULT["regressor"]
    n_estimators: int = _DEFAULT["n_estimators"]
    max_depth: int | None = _DEFAULT["max_depth"]
    min_samples_leaf: int = _DEFAULT["min_samples_leaf"]
    holdout_fraction: float = _DEFAULT["holdout_fraction"]
    seed: int = _DEFAULT["seed"]
    #: Whether the feature vector has the derived counts (FLOPs, parameters, bytes); not
    #: a config setting (studies of the feature set change it).
    derived: bool = True
    time_target: str = _DEFAULT["time_target"]
    roofline_flops_per_s: float = _DEFAULT["roofline_flops_per_s"]
    roofline_bytes_per_s: float = _DEFAULT["roofline_bytes_per_s"]
    roofline_launch_s: float = _DEFAULT["roofline_launch_s"]

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
            **provenance(rows),
            "opcost_version": __version__,
            "sklearn_version": _sklearn_version(),
            "trained_unix_s": time.time(),
        },
    )


def provenance(rows: pd.DataFrame) -> dict[str, Any]:
    """Where the measurements come from: the drivers, CUDA and torch versions and host CPUs
    the rows record, and the days (UTC) they were measured on (first, last)."""
    out: dict[str, Any] = {}
    for key, column in (
        ("drivers", "driver_version"),
        ("cuda_versions", "cuda_version"),
        ("torch_versions", "torch_version"),
        ("host_cpus", "host_cpu"),
    ):
        out[key] = sorted(map(str, rows.get(column, pd.Series()).dropna().unique()))
    started = pd.to_datetime(rows.get("timed_start_unix_s", pd.Series()).dropna(), unit="s")
    out["measured"] = (
        []
        if started.empty
        else [
            started.min().strftime("%Y-%m-%d"),
            started.max().strftime("%Y-%m-%d"),
        ]
    )
    return out


def _sklearn_version() -> str:
    import sklearn

    return sklearn.__version__


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
    return _held_out(predictor, train, test, gpu).reset_index(drop=True)


def _held_out(
    predictor: Predictor, train: pd.DataFrame, test: pd.DataFrame, gpu: str
) -> pd.DataFrame:
    """``test``'s rows predicted by ``predictor`` (fitted on ``train``), with the baseline
    of ``train``: ``HOLDOUT_COLUMNS``, ``test``'s index."""
    out = pd.concat(
        [test, predictor.predict_at_settings(test), baseline_predictions(train, test)], axis=1
    )
    out["gpu"] = gpu
    return out[HOLDOUT_COLUMNS]


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
        parts.append(_held_out(fit_predictor(train, cfg, gpu, n_jobs), train, test, gpu))
    return pd.concat(parts).sort_index().reset_index(drop=True)


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
            o = _held_out(predictor, train, measured_ops, gpu).copy()
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
    metrics = json_safe(build_metrics(gpu, rows, cfg, holdout, lono_networks, lono_ops))
    predictor = fit_predictor(rows, cfg, gpu, n_jobs)
    predictor.meta["dataset"] = str(dataset_path)
    write_parquet_atomic(holdout, outputs.holdout)
    write_parquet_atomic(lono_networks, outputs.networks)
    write_json_atomic(outputs.metrics, metrics)
    save_predictor(predictor, outputs.directory, dataset=dataset_path)
    log(f"done in {time.perf_counter() - t0:.1f} s")
    return metrics


__all__ = [
    "REGRESSORS",
    "TrainConfig",
    "TrainError",
    "TrainOutputs",
    "baseline_predictions",
    "build_metrics",
    "crossval_predictions",
    "fit_predictor",
    "holdout_predictions",
    "holdout_split",
    "make_regressor",
    "network_predictions",
    "op_rows",
    "setting_conditions",
    "train_gpu",
    "usable_power",
]
