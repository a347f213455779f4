"""Tests for opcost.train on the real H100 sample (tests/data/h100).

Forests are small (few trees) to keep the tests fast. The claims checked here are the ones
the README makes: the predictors beat a naive per-type median on held-out operations, the
derived features help, and leave-one-network-out never trains on an op of the network it
predicts.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import opcost.train
from opcost.io import TableError
from opcost.model.accuracy import baseline_predictions, mape_pct, usable_power
from opcost.model.features import SchemaError
from opcost.model.format import HOLDOUT_COLUMNS, NETWORK_COLUMNS, load_predictor
from opcost.train import (
    TrainConfig,
    TrainError,
    TrainOutputs,
    crossval_predictions,
    fit_predictor,
    holdout_split,
    load_op_tables,
    network_predictions,
    op_rows,
    setting_conditions,
    train_gpu,
)

DATA = Path(__file__).parent / "data" / "h100"
DATASET = DATA / "dataset" / "h100.parquet"
NETWORKS = ["resnet18_4x3x64x64", "squeezenet1_1_4x3x64x64", "vgg11_4x3x64x64"]
OPS = [DATA / "ops" / f"{n}.parquet" for n in NETWORKS]
FAST = TrainConfig(n_estimators=20, seed=0)


@pytest.fixture(scope="module")
def dataset() -> pd.DataFrame:
    return pd.read_parquet(DATASET)


@pytest.fixture(scope="module")
def rows(dataset) -> pd.DataFrame:
    return op_rows(dataset)


def pooled_crossval(rows: pd.DataFrame, cfg: TrainConfig, seeds=(0, 1, 2)) -> pd.DataFrame:
    return pd.concat(
        [crossval_predictions(rows, replace(cfg, seed=s), "h100") for s in seeds],
        ignore_index=True,
    )


def scores(cv: pd.DataFrame, prefix_time: str, prefix_power: str) -> dict[str, float]:
    ok = usable_power(cv)
    energy = cv[prefix_time] * cv[prefix_power]
    return {
        "time": mape_pct(cv[prefix_time], cv["time_s"]),
        "power": mape_pct(cv.loc[ok, prefix_power], cv.loc[ok, "power_w"]),
        "energy": mape_pct(energy[ok], cv.loc[ok, "energy_j"]),
    }


@pytest.fixture(scope="module")
def crossval(rows) -> pd.DataFrame:
    return pooled_crossval(rows, FAST)


def test_mape_by_hand():
    assert mape_pct([110.0, 90.0], [100.0, 100.0]) == pytest.approx(10.0)
    assert mape_pct([1.0, np.nan], [2.0, 5.0]) == pytest.approx(50.0)
    assert math.isnan(mape_pct([np.nan], [1.0]))


def test_op_rows_are_the_91_ops_in_both_modes(rows):
    assert len(rows) == 182
    assert rows["op_id"].nunique() == 91
    assert set(rows["kind"]) == {"op"}
    # Power usable where it is finite and the window held enough distinct readings.
    assert usable_power(rows).sum() == (~rows["low_power_samples"]).sum() == 148


def test_beats_per_type_median_on_held_out_operations(crossval):
    # Five-fold cross-validation over the 91 ops, three different splits: every op is
    # predicted by models that never saw it. The baseline predicts the median time and
    # power of the training ops of the same type and mode.
    model = scores(crossval, "time_pred_s", "power_pred_w")
    naive = scores(crossval, "time_baseline_s", "power_baseline_w")
    assert model["time"] < naive["time"]
    assert model["energy"] < naive["energy"]
    # Power depends on the op's size far more than on its type: the forest halves the error.
    assert model["power"] < 0.6 * naive["power"]


def test_derived_features_help_on_real_data(rows, crossval):
    with_derived = scores(crossval, "time_pred_s", "power_pred_w")
    without = scores(
        pooled_crossval(rows, replace(FAST, derived=False)), "time_pred_s", "power_pred_w"
    )
    for quantity in ("time", "power", "energy"):
        assert with_derived[quantity] < without[quantity], quantity


def test_baseline_is_the_per_type_median(rows):
    train, test = rows.iloc[:150], rows.iloc[150:]
    base = baseline_predictions(train, test)
    for i in test.index[:10]:
        same = train[
            (train["op_type"] == test.loc[i, "op_type"]) & (train["mode"] == test.loc[i, "mode"])
        ]
        expected = (
            same["time_s"].median()
            if len(same)
            else train[train["mode"] == test.loc[i, "mode"]]["time_s"].median()
        )
        assert base.loc[i, "time_baseline_s"] == pytest.approx(expected)


def test_holdout_split_is_by_operation_and_reproducible():
    ids = [f"{i:016x}" for i in range(50)] * 2  # every op in two modes
    held = holdout_split(ids, 0.2, seed=3)
    assert len(held) == 10
    assert held == holdout_split(ids, 0.2, seed=3)
    assert held != holdout_split(ids, 0.2, seed=4)
    assert held <= set(ids)
    with pytest.raises(TrainError):
        holdout_split(["a", "a"], 0.2, 0)


def test_holdout_predictions_hold_out_both_modes_of_an_op(rows):
    out = opcost.train.holdout_predictions(rows, FAST, "h100")
    assert list(out.columns) == HOLDOUT_COLUMNS
    held = set(out["op_id"])
    assert len(held) == round(0.2 * 91)
    # All measurements of a held-out op are predicted, and only those.
    assert len(out) == rows["op_id"].isin(held).sum() == 2 * len(held)
    assert (out["time_pred_s"] > 0).all()
    np.testing.assert_allclose(out["energy_pred_j"], out["time_pred_s"] * out["power_pred_w"])


def test_leave_one_network_out_never_trains_on_the_network(rows, dataset, monkeypatch):
    tables = load_op_tables(OPS)
    trained_on: list[set[str]] = []
    original = opcost.train.fit_predictor

    def spy(train_rows, *args, **kwargs):
        trained_on.append(set(train_rows["op_id"]))
        return original(train_rows, *args, **kwargs)

    monkeypatch.setattr(opcost.train, "fit_predictor", spy)
    networks = dataset[dataset["kind"] == "network"]
    per_net, per_op = network_predictions(rows, networks, tables, FAST, "h100")
    assert len(trained_on) == 3
    for name, seen in zip(sorted(tables), trained_on, strict=True):
        assert not seen & set(tables[name]["op_id"]), name
        assert seen  # the other networks' ops remain
    assert list(per_net.columns) == NETWORK_COLUMNS
    assert len(per_net) == 6  # three networks, two modes, one setting
    # Each network's op predictions cover exactly its measured ops.
    for name, group in per_op.groupby("model_input"):
        assert set(group["op_id"]) == set(tables[name]["op_id"])


def test_leave_one_network_out_sums_and_measurements(rows, dataset):
    tables = load_op_tables(OPS)
    networks = dataset[dataset["kind"] == "network"]
    per_net, _ = network_predictions(rows, networks, tables, FAST, "h100")
    r = per_net.set_index(["model_input", "mode"])
    # Measured whole networks, straight from the dataset.
    whole = networks.set_index(["model_input", "mode"])
    for key in r.index:
        assert r.loc[key, "time_s"] == whole.loc[key, "time_s"]
        assert r.loc[key, "energy_j"] == whole.loc[key, "energy_j"]
    # Summed measured ops of resnet18 in inference, computed by hand from the dataset.
    ops = tables["resnet18_4x3x64x64"]
    measured = rows[rows["mode"] == "inference"].set_index("op_id")["time_s"]
    expected = sum(measured[o] * c for o, c in zip(ops["op_id"], ops["count"], strict=True))
    assert r.loc[("resnet18_4x3x64x64", "inference"), "time_sum_ops_s"] == pytest.approx(expected)
    assert r.loc[("resnet18_4x3x64x64", "inference"), "n_ops"] == len(ops) == 29
    assert r.loc[("resnet18_4x3x64x64", "inference"), "n_calls"] == ops["count"].sum() == 69
    # Every op type of these three networks occurs in the other two, except AdaptiveAvgPool2d
    # and add_ (resnet18 only), cat (squeezenet only): a known, countable number of unseen ops.
    unseen = {
        name: int((~t["type"].isin(set(rows[~rows["op_id"].isin(t["op_id"])]["op_type"]))).sum())
        for name, t in tables.items()
    }
    for name in NETWORKS:
        assert (per_net[per_net["model_input"] == name]["n_ops_unseen"] == unseen[name]).all()
    np.testing.assert_allclose(
        per_net["power_pred_w"], per_net["energy_pred_j"] / per_net["time_pred_s"]
    )


def test_time_only_dataset_trains_without_power(rows, tmp_path):
    cpu = rows.assign(power_w=np.nan, energy_j=np.nan, sm_clock_mhz=np.nan)
    predictor = fit_predictor(cpu, FAST, "cpu")
    assert predictor.power_model is None
    pred = predictor.predict_ops(cpu.drop_duplicates("op_id").head(5))
    assert pred["time_pred_s"].gt(0).all()
    assert pred["power_pred_w"].isna().all()
    assert pred["energy_pred_j"].isna().all()
    # Saved, it writes no power file; loaded, it has no power model.
    from opcost.model.format import save_predictor

    (tmp_path / "power.npz").write_bytes(b"left from a predictor with power")
    save_predictor(predictor, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "features.json",
        "manifest.json",
        "time.npz",
    ]
    loaded = load_predictor(tmp_path)
    assert loaded.power_model is None
    assert loaded.predict_ops(cpu.drop_duplicates("op_id").head(5))["power_pred_w"].isna().all()


def test_one_model_covers_settings_through_the_clock(rows):
    # A second, synthetic setting: the SM clock locked at 990 MHz, everything twice as
    # slow. Trained on both settings, the model must predict held-out ops slower there.
    slow = rows.assign(setting="sm990", sm_clock_mhz=990.0, time_s=rows["time_s"] * 2)
    both = pd.concat([rows, slow], ignore_index=True)
    held = holdout_split(both["op_id"].tolist(), 0.2, seed=0)
    predictor = fit_predictor(both[~both["op_id"].isin(held)], FAST, "h100")
    cond = setting_conditions(both)
    assert sorted(cond["setting"]) == ["default", "default", "sm990", "sm990"]
    assert set(cond["sm_clock_mhz"]) == {1980.0, 990.0}
    test_ops = rows[rows["op_id"].isin(held)].drop_duplicates("op_id")
    pred = predictor.predict_ops(test_ops).pivot_table(
        index=["op_id", "mode"], columns="setting", values="time_pred_s"
    )
    ratio = pred["sm990"] / pred["default"]
    assert (ratio > 1.5).all()


@pytest.mark.parametrize("regressor", ["random_forest", "extra_trees", "gradient_boosting"])
def test_every_regressor_trains_and_predicts(rows, regressor):
    cfg = TrainConfig(regressor=regressor, n_estimators=10, min_samples_leaf=5)
    predictor = fit_predictor(rows, cfg, "h100")
    pred = predictor.predict_rows(rows.head(4))
    assert pred["time_pred_s"].between(1e-7, 1.0).all()
    assert pred["power_pred_w"].between(50, 800).all()


def test_config_section_is_read_and_checked():
    cfg = TrainConfig.from_config(
        {"regressor": "extra_trees", "n_estimators": 5, "max_depth": 3, "seed": 7}
    )
    assert (cfg.regressor, cfg.n_estimators, cfg.max_depth, cfg.seed) == ("extra_trees", 5, 3, 7)
    with pytest.raises(TrainError, match="random_forest"):
        TrainConfig.from_config({"regressor": "xgboost"})


def test_train_gpu_writes_the_contract(tmp_path):
    out = TrainOutputs.under(tmp_path / "h100")
    lines: list[str] = []
    metrics = train_gpu(DATASET, OPS, out, FAST, "h100", log=lines.append)
    parquets = ["holdout_predictions.parquet", "network_predictions.parquet"]
    files = ["features.json", "time.npz", "power.npz", "metrics.json", *parquets]
    assert sorted(p.name for p in out.directory.iterdir()) == sorted([*files, "manifest.json"])
    # The manifest, written last: every other file's SHA-256 and size, and the dataset's.
    manifest = json.loads((out.directory / "manifest.json").read_text())
    assert manifest["format_version"] == 1
    assert manifest["gpu"]["name"] == "h100"
    assert manifest["gpu"]["settings"] == ["default"]
    assert manifest["gpu"]["devices"] == ["NVIDIA H100 80GB HBM3"]
    assert manifest["dataset"] == {
        "path": str(DATASET),
        "sha256": hashlib.sha256(DATASET.read_bytes()).hexdigest(),
        "bytes": DATASET.stat().st_size,
    }
    assert sorted(manifest["files"]) == sorted(files)
    for name in files:
        data = (out.directory / name).read_bytes()
        assert manifest["files"][name] == {
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
        }
    holdout = pd.read_parquet(out.holdout)
    assert list(holdout.columns) == HOLDOUT_COLUMNS
    networks = pd.read_parquet(out.networks)
    assert list(networks.columns) == NETWORK_COLUMNS
    assert sorted(set(networks["model_input"])) == NETWORKS
    on_disk = json.loads(out.metrics.read_text())
    assert on_disk == json.loads(json.dumps(metrics))
    for split in ("holdout", "lono"):
        for mode in ("inference", "training", "all"):
            assert on_disk[split]["op"][mode]["time_mape_pct"] > 0
    assert on_disk["lono"]["network"]["all"]["n"] == 6
    assert on_disk["lono"]["network"]["training"]["energy_mape_pct"] > 0
    predictor = load_predictor(out.directory)
    assert predictor.gpu == "h100"
    assert predictor.meta["n_rows"] == 182
    assert any("leave out vgg11_4x3x64x64" in line for line in lines)


def test_train_gpu_fails_clearly_on_missing_inputs(tmp_path):
    out = TrainOutputs.under(tmp_path / "x")
    with pytest.raises(TableError, match="no such file"):
        train_gpu(tmp_path / "none.parquet", OPS, out, FAST, "h100")
    bad = tmp_path / "bad.parquet"
    pd.DataFrame({"kind": ["op"]}).to_parquet(bad)
    with pytest.raises(TableError, match="missing columns"):
        train_gpu(bad, OPS, out, FAST, "h100")


def test_encoding_refuses_a_bad_dataset(rows):
    with pytest.raises(SchemaError, match="dtype"):
        fit_predictor(rows.assign(dtype="int4"), FAST, "h100")


LARGE = Path(__file__).parents[1] / "data" / "hopper-large"


@pytest.fixture(scope="module")
def large_rows() -> pd.DataFrame:
    """The H100's ops at batch 64 (data/hopper-large), training mode."""
    rows = op_rows(pd.read_parquet(LARGE / "h100" / "dataset" / "h100.parquet"))
    return rows[rows["mode"] == "training"].reset_index(drop=True)


def test_roofline_ratio_predicts_left_out_heavy_convolutions_better(large_rows):
    # vgg11's convolutions are the study's heaviest per FLOP of input. Left out, a forest
    # of log(time) predicts them from lighter convolutions, 2 to 5 times short; a forest of
    # the ratio to a roofline estimate predicts each in proportion to its work.
    vgg = set(pd.read_parquet(LARGE / "ops" / "vgg11_64x3x224x224.parquet")["op_id"])
    left_out = large_rows["op_id"].isin(vgg)
    train = large_rows[~left_out]
    convs = large_rows[left_out & (large_rows["op_type"] == "torch.nn.modules.conv.Conv2d")]
    assert len(convs) == 7  # distinct ones: two of its eight layers are alike
    cfg = replace(FAST, n_estimators=30)
    plain = fit_predictor(train, cfg, "h100").predict_rows(convs)["time_pred_s"]
    ratio_cfg = replace(cfg, time_target="roofline_ratio")
    ratio = fit_predictor(train, ratio_cfg, "h100").predict_rows(convs)["time_pred_s"]
    plain_error = (plain / convs["time_s"] - 1).abs()
    ratio_error = (ratio / convs["time_s"] - 1).abs()
    assert (ratio_error < plain_error).all()
    assert plain_error.median() > 0.5
    assert ratio_error.median() < 0.35


def test_roofline_ratio_multiplies_back_the_estimate_by_hand(large_rows, tmp_path):
    cfg = replace(FAST, n_estimators=5, time_target="roofline_ratio", roofline_launch_s=1e-5)
    predictor = fit_predictor(large_rows, cfg, "h100")
    conv = large_rows[large_rows["op_type"] == "torch.nn.modules.conv.Conv2d"].head(3)
    x = opcost.train.encode_features(conv, predictor.schema)
    # t_ref from the op's counts, by the formula: max(FLOPs / F, bytes / B) + launch.
    t_ref = np.maximum(x["flops"] / 1e14, x["bytes_moved"] / 2e12) + 1e-5
    expected = np.exp(predictor.time_model.predict(x)) * t_ref.to_numpy()
    np.testing.assert_allclose(predictor.predict_rows(conv)["time_pred_s"], expected)
    # Saved and loaded, the predictor still multiplies by the same estimate.
    from opcost.model.format import save_predictor

    save_predictor(predictor, tmp_path)
    loaded = load_predictor(tmp_path)
    assert loaded.time_reference == predictor.time_reference
    np.testing.assert_allclose(loaded.predict_rows(conv)["time_pred_s"], expected)
    doc = json.loads((tmp_path / "features.json").read_text())
    assert doc["time_target"] == "log(time_s / t_ref)"


def test_time_target_is_checked():
    assert TrainConfig.from_config({}).time_reference() is None
    with pytest.raises(TrainError, match="train.time_target"):
        TrainConfig.from_config({"time_target": "roofline"})
    with pytest.raises(TrainError, match="train.roofline_bytes_per_s"):
        TrainConfig.from_config({"time_target": "roofline_ratio", "roofline_bytes_per_s": 0})


# --- issue 21: one writer, defaults from the schema --------------------------------------


def test_a_full_disk_while_writing_metrics_keeps_the_previous_metrics(tmp_path, monkeypatch):
    # The disk fills half way through metrics.json: the previous file stays whole (the new
    # one was written under a temporary name), and no temporary file is left behind.
    import pathlib

    out = TrainOutputs.under(tmp_path / "h100")
    out.directory.mkdir()
    out.metrics.write_text('{"previous": true}\n')
    real_open = pathlib.Path.open

    class HalfThenFull:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            self.f.flush()
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    def open_(self, mode="r", *args, **kwargs):
        f = real_open(self, mode, *args, **kwargs)
        return HalfThenFull(f) if "metrics.json" in self.name and "w" in mode else f

    monkeypatch.setattr(pathlib.Path, "open", open_)
    with pytest.raises(OSError, match="No space"):
        train_gpu(DATASET, OPS, out, TrainConfig(n_estimators=2), "h100")
    monkeypatch.undo()
    assert json.loads(out.metrics.read_text()) == {"previous": True}
    assert sorted(p.name for p in out.directory.iterdir() if "metrics" in p.name) == [
        "metrics.json"
    ]


def test_train_config_defaults_are_the_config_schemas(tmp_path):
    # The defaults live in the config schema only: a schema with other defaults gives a
    # TrainConfig with those defaults, and every setting of the schema is a field.
    code = """
import copy, json
import opcost.config
real = opcost.config.load_schema()
def load_schema(*args, **kwargs):
    schema = copy.deepcopy(real)
    props = schema["properties"]["train"]["properties"]
    props["n_estimators"]["default"] = 7
    props["roofline_launch_s"]["default"] = 1.5e-5
    return schema
opcost.config.load_schema = load_schema
from dataclasses import asdict, fields
from opcost.train import TrainConfig
props = real["properties"]["train"]["properties"]
print(json.dumps({"config": asdict(TrainConfig()), "schema": sorted(props),
                  "fields": sorted(f.name for f in fields(TrainConfig))}))
"""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["config"]["n_estimators"] == 7
    assert got["config"]["roofline_launch_s"] == 1.5e-5
    assert got["config"]["regressor"] == "random_forest"
    # Every schema setting is a field; ``derived`` is not a config setting.
    assert sorted(set(got["fields"]) - {"derived"}) == got["schema"]
