"""Tests for opcost.predict: network sums, best choices, per-op settings, extrapolation, loading.

The arithmetic is checked with stand-in regressors whose predictions are simple formulas of
the features, so every total, best choice and saving is computed here by hand. Loading and
extrapolation are checked with a forest trained on the real H100 sample. The fast path of
``opcost predict`` (ops encoded once per condition grid, trees walked in blocks on threads,
models saved and loaded as arrays) is checked against scikit-learn's own forests on the
real H100 sample: each op's prediction is the forest's ``predict`` of its row of
``encode_features``.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import reseal

import opcost.model.trees
from opcost import spec as specs
from opcost.model import PredictorError
from opcost.model.accuracy import usable_power
from opcost.model.features import (
    FEATURES_VERSION,
    FeatureSchema,
    SchemaError,
    build_schema,
    encode_features,
)
from opcost.model.format import load_predictor, load_predictors, save_predictor
from opcost.model.predictor import UNSEEN_TYPE, Predictor, sum_by_count, training_ranges
from opcost.model.trees import TreeEnsemble
from opcost.predict import NEEDS_SETTINGS, predict_networks
from opcost.train import (
    TrainConfig,
    fit_predictor,
    make_regressor,
    op_rows,
    setting_conditions,
)

DATA = Path(__file__).parent / "data" / "h100"
LINEAR = "torch.nn.modules.linear.Linear"


class FakeTime:
    """log time = log(input_numel · 1 ns · 1980 MHz / SM clock): time scales with 1/clock."""

    def __init__(self, columns: list[str]) -> None:
        self.feature_names_in_ = np.array(columns, dtype=object)

    def predict(self, x: pd.DataFrame) -> np.ndarray:
        return np.log(x["input_numel"] * 1e-9 * 1980.0 / x["sm_clock_mhz"]).to_numpy()


class FakePower:
    """Modules: 100 W + 300 W · clock/1980; functions: 800 W · (clock/1980)^3."""

    def __init__(self, columns: list[str]) -> None:
        self.feature_names_in_ = np.array(columns, dtype=object)

    def predict(self, x: pd.DataFrame) -> np.ndarray:
        f = x["sm_clock_mhz"] / 1980.0
        return np.where(x["is_module"] == 1, 100.0 + 300.0 * f, 800.0 * f**3)


def linear_op() -> dict:
    return {
        "kind": "module",
        "type": LINEAR,
        "attrs": {"in_features": 100, "out_features": 10, "bias": True},
        "args": [{"__tensor__": 0}],
        "kwargs": {},
        "inputs": [{"shape": [10, 100], "dtype": "float32", "param": False}],
        "outputs": [{"shape": [10, 10], "dtype": "float32"}],
    }


def relu_op() -> dict:
    return {
        "kind": "function",
        "type": "torch.relu",
        "args": [{"__tensor__": 0}],
        "kwargs": {},
        "inputs": [{"shape": [10, 100], "dtype": "float32", "param": False}],
        "outputs": [{"shape": [10, 100], "dtype": "float32"}],
    }


def op_table(counts=(1, 2), network: str = "net_1x100") -> pd.DataFrame:
    rows = []
    for spec, count in zip((linear_op(), relu_op()), counts, strict=True):
        rows.append(
            {
                "model_input": network,
                "op_id": specs.op_id(spec),
                "kind": spec["kind"],
                "type": spec["type"],
                "spec": specs.canonical_json(spec),
                "count": count,
            }
        )
    return pd.DataFrame(rows)


def conditions(*clocks: float, modes=("inference",)) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "setting": "default" if c == 1980 else f"sm{int(c)}",
                "mode": m,
                "dtype": "float32",
                "tf32": True,
                "sm_clock_mhz": float(c),
                "mem_clock_mhz": 2619.0,
                "power_limit_w": 700.0,
            }
            for c in clocks
            for m in modes
        ]
    )


def fake_predictor(gpu: str, *clocks: float, modes=("inference",)) -> Predictor:
    schema = FeatureSchema(op_types=(LINEAR, "torch.relu"))
    cols = schema.columns()
    ranges = {
        t: {k: [0.0, 1e12] for k in ("flops", "input_numel", "output_numel")}
        for t in schema.op_types
    }
    return Predictor(
        gpu, schema, FakeTime(cols), FakePower(cols), conditions(*clocks, modes=modes), ranges
    )


def one_leaf(columns: list[str]) -> TreeEnsemble:
    """A tree ensemble of one leaf (predicts 0): what a saved fake predictor holds."""
    return TreeEnsemble(
        feature_names_in_=np.array(columns, dtype=object),
        children=np.zeros((1, 2), dtype=np.int32),
        feature=np.zeros(1, dtype=np.int32),
        threshold=np.full(1, np.inf, dtype=np.float32),
        is_leaf=np.ones(1, dtype=bool),
        value=np.zeros(1),
        roots=np.zeros(1, dtype=np.int32),
        combine="mean",
        offset=0.0,
        source="one leaf",
    )


def save_fake(p: Predictor, directory: Path) -> None:
    """Save a fake predictor: files store tree ensembles only, so one-leaf ensembles stand
    in for its regressors (:func:`with_fakes` puts them back after loading)."""
    cols = p.schema.columns()
    save_predictor(replace(p, time_model=one_leaf(cols), power_model=one_leaf(cols)), directory)


def with_fakes(p: Predictor) -> Predictor:
    """A loaded fake predictor with its stand-in regressors back."""
    cols = p.schema.columns()
    return replace(p, time_model=FakeTime(cols), power_model=FakePower(cols))


# -- arithmetic, by hand ----------------------------------------------------------------


def test_sum_by_count_by_hand():
    pred = pd.DataFrame(
        {
            "k": ["a", "a", "b"],
            "count": [2, 3, 1],
            "time_pred_s": [1.0, 2.0, 4.0],
            "energy_pred_j": [10.0, 20.0, 8.0],
        }
    )
    out = sum_by_count(pred, ["k"]).set_index("k")
    assert out.loc["a", "time_pred_s"] == 2 * 1 + 3 * 2
    assert out.loc["a", "energy_pred_j"] == 2 * 10 + 3 * 20
    assert out.loc["a", "power_pred_w"] == 80 / 8
    # One unknown energy makes the network's energy unknown, not a partial sum.
    pred.loc[2, "energy_pred_j"] = np.nan
    assert math.isnan(sum_by_count(pred, ["k"]).set_index("k").loc["b", "energy_pred_j"])


def test_network_totals_best_choices_and_per_op_saving():
    result = predict_networks({"fake": fake_predictor("fake", 1980, 990)}, op_table((1, 2)))
    t = result.table.set_index("setting")
    # Linear (1 call) and ReLU (2 calls), 1000 input elements each: 1 µs at 1980 MHz.
    t_default, t_slow = 3 * 1e-6, 3 * 2e-6
    e_default = 1 * 1e-6 * 400 + 2 * 1e-6 * 800  # 100 + 300 W, and 800 W
    e_slow = 1 * 2e-6 * 250 + 2 * 2e-6 * 100  # 100 + 150 W, and 800/8 W
    assert t.loc["default", "time_s"] == pytest.approx(t_default)
    assert t.loc["sm990", "time_s"] == pytest.approx(t_slow)
    assert t.loc["default", "energy_j"] == pytest.approx(e_default)
    assert t.loc["sm990", "energy_j"] == pytest.approx(e_slow)
    assert t.loc["default", "power_w"] == pytest.approx(e_default / t_default)
    assert t.loc["sm990", "edp_js"] == pytest.approx(e_slow * t_slow)
    assert (t.loc["default", "n_ops"], t.loc["default", "n_calls"]) == (2, 3)
    # Fastest at the default clock; least energy and least EDP (2.16e-9 < 6e-9 J·s) at 990.
    best = result.best.set_index("criterion")
    assert best.loc["time", "setting"] == "default"
    assert best.loc["energy", "setting"] == "sm990"
    assert best.loc["edp", "setting"] == "sm990"
    assert t["best_time"].tolist() == [True, False]
    assert t["best_energy"].tolist() == [False, True]
    # Per op: the Linear is cheaper at the default clock (400 vs 500 µJ), the ReLU at 990
    # MHz (200 vs 800 µJ per call): 400 + 2·200 = 800 µJ against 900 µJ at sm990.
    per_op = result.per_op.iloc[0]
    assert per_op["status"] == "ok"
    assert per_op["best_single_setting"] == "sm990"
    assert per_op["per_op_energy_j"] == pytest.approx(800e-6)
    assert per_op["saving_pct"] == pytest.approx(100 * (900 - 800) / 900)
    assert result.extrapolation.empty


def test_best_choice_across_gpus_and_single_setting_status():
    predictors = {
        "fast": fake_predictor("fast", 1980),
        "slow": fake_predictor("slow", 990),
    }
    result = predict_networks(predictors, op_table())
    best = result.best.set_index("criterion")
    assert (best.loc["time", "gpu"], best.loc["energy", "gpu"]) == ("fast", "slow")
    assert len(result.table) == 2
    for status in result.per_op["status"]:
        assert status.startswith(NEEDS_SETTINGS)
    assert result.per_op["saving_pct"].isna().all()


def test_best_choice_names_its_runner_up_and_lead():
    """By hand: one op table on two clocks of one GPU (as in the test above)."""
    result = predict_networks({"fake": fake_predictor("fake", 1980, 990)}, op_table((1, 2)))
    best = result.best.set_index("criterion")
    # Time: 3 µs at the default clock against 6 µs at 990 MHz.
    assert best.loc["time", "runner_up_setting"] == "sm990"
    assert best.loc["time", "runner_up_value"] == pytest.approx(6e-6)
    assert best.loc["time", "margin"] == pytest.approx(6 / 3 - 1)
    # Energy: 900 µJ at sm990 against 2000 µJ at the default clock.
    e_default = 1 * 1e-6 * 400 + 2 * 1e-6 * 800
    e_slow = 1 * 2e-6 * 250 + 2 * 2e-6 * 100
    assert best.loc["energy", "runner_up_setting"] == "default"
    assert best.loc["energy", "margin"] == pytest.approx(e_default / e_slow - 1)
    # Without metrics.json the predictors' error is unknown: no verdict.
    assert best["lono_mape_pct"].isna().all()
    assert best["within_error"].isna().all()


def write_lono(directory: Path, time_pct: float, energy_pct: float) -> None:
    """A metrics.json as opcost train writes it (before the predictor, so that the
    manifest covers it), with only the LONO network errors."""
    scores = {"n": 3, "time_mape_pct": time_pct, "energy_mape_pct": energy_pct}
    doc = {"lono": {"network": {"inference": scores, "all": scores}}}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.json").write_text(json.dumps(doc))


def test_a_lead_smaller_than_the_predictors_lono_error_is_flagged(tmp_path):
    """fast (1980 MHz) beats slow (990 MHz) by 100 % in time; slow beats fast in energy.
    The verdict compares the lead with the larger LONO error of the two predictors."""
    write_lono(tmp_path / "fast", time_pct=30.0, energy_pct=5.0)
    write_lono(tmp_path / "slow", time_pct=150.0, energy_pct=1000.0)
    save_fake(fake_predictor("fast", 1980), tmp_path / "fast")
    save_fake(fake_predictor("slow", 990), tmp_path / "slow")
    predictors = {g: with_fakes(p) for g, p in load_predictors(tmp_path).items()}
    assert predictors["fast"].lono_mape_pct == {"inference": {"time": 30.0, "energy": 5.0}}
    best = predict_networks(predictors, op_table((1, 2))).best.set_index("criterion")
    assert best.loc["time", "gpu"] == "fast"
    assert best.loc["time", "lono_mape_pct"] == 150.0
    assert best.loc["time", "within_error"]  # 100 % lead < 150 %
    assert best.loc["energy", "lono_mape_pct"] == 1000.0
    assert best.loc["energy", "within_error"]
    write_lono(tmp_path / "slow", time_pct=20.0, energy_pct=2.0)
    save_fake(fake_predictor("slow", 990), tmp_path / "slow")
    predictors = {g: with_fakes(p) for g, p in load_predictors(tmp_path).items()}
    best = predict_networks(predictors, op_table((1, 2))).best
    best = best.set_index("criterion")
    assert best.loc["time", "lono_mape_pct"] == 30.0
    assert not best.loc["time", "within_error"]  # 100 % lead > 30 %
    assert best.loc["energy", "lono_mape_pct"] == 5.0
    assert not best.loc["energy", "within_error"]  # 2000/900 - 1 = 122 % > 5 %
    # The energy-delay product has no LONO error of its own.
    assert math.isnan(best.loc["edp", "lono_mape_pct"])
    assert best.loc["edp", "within_error"] is None


def test_an_unreadable_metrics_file_leaves_predictions_unqualified(tmp_path):
    (tmp_path / "fast").mkdir()
    (tmp_path / "fast" / "metrics.json").write_text("{not json")
    save_fake(fake_predictor("fast", 1980), tmp_path / "fast")
    predictor = with_fakes(load_predictor(tmp_path / "fast"))
    assert predictor.lono_mape_pct == {}
    assert len(predict_networks({"fast": predictor}, op_table()).table) == 1


def test_several_networks_and_modes():
    ops = pd.concat([op_table((1, 2), "a_1"), op_table((5, 0), "b_1")], ignore_index=True)
    p = fake_predictor("fake", 1980, modes=("inference", "training"))
    result = predict_networks({"fake": p}, ops)
    t = result.table.set_index(["network", "mode"])
    assert len(t) == 4
    assert t.loc[("b_1", "training"), "time_s"] == pytest.approx(5e-6)
    only = predict_networks({"fake": p}, ops, modes=["training"])
    assert set(only.table["mode"]) == {"training"}
    with pytest.raises(PredictorError, match="mode 'training'"):
        predict_networks({"fake": fake_predictor("fake", 1980)}, ops, modes=["training"])
    with pytest.raises(PredictorError, match="no operations"):
        predict_networks({"fake": p}, ops.iloc[:0])


def test_save_and_load_round_trip(tmp_path):
    p = fake_predictor("fake", 1980, 990)
    save_fake(p, tmp_path / "fake")
    loaded = with_fakes(load_predictors(tmp_path)["fake"])
    pd.testing.assert_frame_equal(loaded.conditions, p.conditions, check_dtype=False)
    a = predict_networks({"fake": p}, op_table()).table
    b = predict_networks({"fake": loaded}, op_table()).table
    pd.testing.assert_frame_equal(a, b)


# -- with a forest trained on the real H100 sample ---------------------------------------


@pytest.fixture(scope="module")
def real_rows() -> pd.DataFrame:
    return op_rows(pd.read_parquet(DATA / "dataset" / "h100.parquet"))


@pytest.fixture(scope="module")
def predictors_dir(tmp_path_factory, real_rows) -> Path:
    root = tmp_path_factory.mktemp("predictors")
    save_predictor(fit_predictor(real_rows, TrainConfig(n_estimators=10), "h100"), root / "h100")
    return root


def copy_predictor(src: Path, dst: Path) -> Path:
    shutil.copytree(src / "h100", dst / "h100")
    return dst / "h100"


def test_real_network_prediction_sums_its_ops(predictors_dir):
    ops = pd.read_parquet(DATA / "ops" / "resnet18_4x3x64x64.parquet")
    result = predict_networks(load_predictors(predictors_dir), ops)
    per_op = result.op_predictions
    for mode, row in result.table.set_index("mode").iterrows():
        sel = per_op[per_op["mode"] == mode]
        assert row["time_s"] == pytest.approx((sel["time_pred_s"] * sel["count"]).sum())
        assert row["energy_j"] == pytest.approx((sel["energy_pred_j"] * sel["count"]).sum())
    assert len(per_op) == 2 * len(ops)  # every op, both modes
    # Every op of resnet18 was in the training data: nothing extrapolates.
    assert result.extrapolation.empty
    assert result.per_op["status"].str.startswith(NEEDS_SETTINGS).all()


def test_extrapolation_flags_unseen_types_and_sizes(predictors_dir):
    p = load_predictor(predictors_dir / "h100")
    known = pd.read_parquet(DATA / "ops" / "vgg11_4x3x64x64.parquet")
    big = json.loads(known[known["type"] == LINEAR]["spec"].iloc[0])
    big["inputs"][0]["shape"][0] *= 1000  # a batch far beyond the training data
    big["outputs"][0]["shape"][0] *= 1000
    gelu = {**relu_op(), "type": "torch.nn.functional.gelu"}
    extra = pd.DataFrame(
        [
            {"op_id": specs.op_id(s), "spec": specs.canonical_json(s), "count": 1}
            for s in (big, gelu)
        ]
    )
    flags = p.extrapolation(pd.concat([known, extra], ignore_index=True)).set_index("op_id")
    assert set(flags.index) == set(extra["op_id"])
    assert flags.loc[specs.op_id(gelu), "reason"] == UNSEEN_TYPE
    assert "input_numel" in flags.loc[specs.op_id(big), "reason"]
    assert "> trained max" in flags.loc[specs.op_id(big), "reason"]


def test_unknown_mode_or_setting_is_refused(predictors_dir):
    p = load_predictor(predictors_dir / "h100")
    with pytest.raises(PredictorError, match="no setting 'sm1000'"):
        p.select_conditions(settings=["sm1000"])
    with pytest.raises(PredictorError, match="no mode 'train'"):
        p.select_conditions(modes=["train"])


def test_missing_predictors_fail_clearly(tmp_path, predictors_dir):
    with pytest.raises(PredictorError, match="no such predictor directory"):
        load_predictors(tmp_path / "nowhere")
    with pytest.raises(PredictorError, match="holds no trained predictor"):
        load_predictors(tmp_path)
    d = copy_predictor(predictors_dir, tmp_path / "copy")
    (d / "power.npz").unlink()
    with pytest.raises(PredictorError, match="power.npz: listed in manifest.json but not readable"):
        load_predictors(tmp_path / "copy")
    d = copy_predictor(predictors_dir, tmp_path / "again")
    (d / "features.json").write_text("{not json")
    reseal(d)
    with pytest.raises(PredictorError, match="not readable JSON"):
        load_predictor(d)


def test_corrupt_model_file_fails_clearly(tmp_path, predictors_dir):
    d = copy_predictor(predictors_dir, tmp_path)
    (d / "time.npz").write_bytes(b"garbage")
    with pytest.raises(PredictorError, match="time.npz: does not match its SHA-256"):
        load_predictor(d)
    reseal(d)
    with pytest.raises(PredictorError, match="time.npz: not an opcost model file"):
        load_predictor(d)


def test_incompatible_schema_fails_clearly(tmp_path, predictors_dir, real_rows):
    # features.json of another encoding version.
    d = copy_predictor(predictors_dir, tmp_path / "a")
    doc = json.loads((d / "features.json").read_text())
    doc["schema"]["version"] = FEATURES_VERSION + 1
    (d / "features.json").write_text(json.dumps(doc))
    reseal(d)
    with pytest.raises(SchemaError, match="features version"):
        load_predictor(d)
    # A time model trained without the derived features, next to a schema with them.
    d = copy_predictor(predictors_dir, tmp_path / "b")
    other = fit_predictor(real_rows, replace(TrainConfig(n_estimators=2), derived=False), "h100")
    np.savez(d / "time.npz", **other.time_model.to_arrays())
    reseal(d)
    with pytest.raises(SchemaError, match="retrain"):
        load_predictor(d)
    # A column list that does not match the schema.
    d = copy_predictor(predictors_dir, tmp_path / "c")
    doc = json.loads((d / "features.json").read_text())
    doc["columns"] = doc["columns"][:-1]
    (d / "features.json").write_text(json.dumps(doc))
    reseal(d)
    with pytest.raises(SchemaError, match="differ"):
        load_predictor(d)


# -- the stored tree ensembles -------------------------------------------------------------


@pytest.mark.parametrize("regressor", ["random_forest", "extra_trees", "gradient_boosting"])
def test_tree_ensemble_predicts_as_scikit_learn(real_rows, regressor):
    schema = build_schema(real_rows["op_type"])
    x = encode_features(real_rows, schema)
    y = np.log(real_rows["time_s"].to_numpy())
    cfg = TrainConfig(regressor=regressor, n_estimators=15, min_samples_leaf=2)
    model = make_regressor(cfg).fit(x.iloc[:140], y[:140])
    ensemble = TreeEnsemble.from_sklearn(model)
    # Unseen rows, and values just off the training values (float32 rounding of thresholds).
    probe = x.copy()
    probe["flops"] *= 1 + 1e-7
    probe["sm_clock_mhz"] = [1400.0, 1980.0] * (len(probe) // 2)
    np.testing.assert_allclose(ensemble.predict(probe), model.predict(probe), rtol=1e-12)
    np.testing.assert_allclose(ensemble.predict(x), model.predict(x), rtol=1e-12)
    with pytest.raises(SchemaError, match="retrain"):
        ensemble.predict(x.iloc[:, ::-1])


def test_tree_ensemble_refuses_other_models():
    from sklearn.linear_model import LinearRegression

    model = LinearRegression().fit(np.eye(3), [1.0, 2.0, 3.0])
    with pytest.raises(PredictorError, match="cannot store a LinearRegression"):
        TreeEnsemble.from_sklearn(model)


# -- the fast path against scikit-learn ----------------------------------------------------


@pytest.fixture(scope="module")
def sklearn_forests(real_rows, tmp_path_factory):
    """scikit-learn forests on the real H100 sample, and the predictor saved from them.

    40 trees: more than two groups of the 16 summed at once, and not a multiple of 16.
    """
    schema = build_schema(real_rows["op_type"])
    x = encode_features(real_rows, schema)
    cfg = TrainConfig(n_estimators=40)
    time_rf = make_regressor(cfg).fit(x, np.log(real_rows["time_s"].to_numpy()))
    ok = usable_power(real_rows).to_numpy()
    power_rf = make_regressor(cfg).fit(x[ok], real_rows.loc[ok, "power_w"].to_numpy())
    predictor = Predictor(
        "h100",
        schema,
        TreeEnsemble.from_sklearn(time_rf),
        TreeEnsemble.from_sklearn(power_rf),
        setting_conditions(real_rows).drop(columns="n_rows"),
        training_ranges(real_rows),
    )
    root = tmp_path_factory.mktemp("sklearn_predictors")
    save_predictor(predictor, root / "h100")
    return time_rf, power_rf, root


def two_networks() -> pd.DataFrame:
    return pd.concat(
        [pd.read_parquet(DATA / "ops" / f"{n}_4x3x64x64.parquet") for n in ("resnet18", "vgg11")],
        ignore_index=True,
    )


def test_network_prediction_is_the_forests_prediction_of_each_op(sklearn_forests):
    time_rf, power_rf, root = sklearn_forests
    loaded = load_predictors(root)
    ops = two_networks()
    result = predict_networks(loaded, ops)
    # Expected: every distinct op at every trained condition, as one row of
    # encode_features each, predicted by scikit-learn.
    conditions = loaded["h100"].conditions
    unique = ops.drop_duplicates("op_id")
    rows = pd.DataFrame(
        [
            {"op_id": op_id, "spec": spec, **cond}
            for op_id, spec in zip(unique["op_id"], unique["spec"], strict=True)
            for cond in conditions.to_dict(orient="records")
        ]
    )
    x = encode_features(rows, loaded["h100"].schema)
    rows["time"] = np.exp(time_rf.predict(x))
    rows["power"] = power_rf.predict(x)
    got = result.op_predictions.merge(rows, on=["op_id", "setting", "mode"], validate="m:1")
    assert len(got) == len(result.op_predictions) == len(ops) * len(conditions)
    # The forest sums its trees in another order than scikit-learn: equal to rounding.
    np.testing.assert_allclose(got["time_pred_s"], got["time"], rtol=1e-12)
    np.testing.assert_allclose(got["power_pred_w"], got["power"], rtol=1e-12)
    np.testing.assert_allclose(got["energy_pred_j"], got["time"] * got["power"], rtol=1e-12)
    # Network totals: count-weighted sums of scikit-learn's predictions.
    for (network, mode), group in got.groupby(["network", "mode"]):
        row = result.table.set_index(["network", "mode"]).loc[(network, mode)]
        assert row["time_s"] == pytest.approx((group["count"] * group["time"]).sum(), rel=1e-12)
        energy = (group["count"] * group["time"] * group["power"]).sum()
        assert row["energy_j"] == pytest.approx(energy, rel=1e-12)
    assert set(result.table["network"]) == {"resnet18_4x3x64x64", "vgg11_4x3x64x64"}


@pytest.mark.parametrize(
    ("walkers", "chunk_rows", "threads"), [(50, 7, 1), (50, 7, 3), (1000, 10_000, 2)]
)
def test_predictions_do_not_depend_on_blocks_chunks_or_threads(
    sklearn_forests, monkeypatch, walkers, chunk_rows, threads
):
    time_rf, _, root = sklearn_forests
    model = load_predictor(root / "h100").time_model
    rows = two_networks().merge(load_predictor(root / "h100").conditions, how="cross")
    x = encode_features(rows, load_predictor(root / "h100").schema)
    default = model.predict(x)
    # Walked 7 trees at a time in chunks of 7 rows, on 1 or 3 threads: the same bits,
    # because the leaf values are summed in one fixed order.
    monkeypatch.setattr(opcost.model.trees, "_WALKERS", walkers)
    monkeypatch.setattr(opcost.model.trees, "_CHUNK_ROWS", chunk_rows)
    monkeypatch.setattr(opcost.model.trees, "_MAX_THREADS", threads)
    np.testing.assert_array_equal(model.predict(x), default)
    np.testing.assert_allclose(default, time_rf.predict(x), rtol=1e-12)


def test_retraining_in_place_leaves_a_loaded_predictor_intact(tmp_path, real_rows):
    # Saving over the models must not change (or crash) a process that still predicts
    # with the old ones, as `opcost predict` during `snakemake`.
    save_predictor(fit_predictor(real_rows, TrainConfig(n_estimators=5), "h100"), tmp_path / "h100")
    ops = pd.read_parquet(DATA / "ops" / "resnet18_4x3x64x64.parquet")
    loaded = load_predictor(tmp_path / "h100")
    before = loaded.predict_ops(ops)
    retrained = fit_predictor(real_rows, TrainConfig(n_estimators=30, seed=1), "h100")
    save_predictor(retrained, tmp_path / "h100")
    pd.testing.assert_frame_equal(loaded.predict_ops(ops), before, check_exact=True)
    reloaded = load_predictor(tmp_path / "h100").predict_ops(ops)
    pd.testing.assert_frame_equal(reloaded, retrained.predict_ops(ops), check_exact=True)
    assert not np.array_equal(reloaded["time_pred_s"], before["time_pred_s"])


def test_predict_from_an_op_table_imports_no_heavy_module(predictors_dir, tmp_path):
    # `opcost predict --ops` should pay for numpy, pandas and pyarrow only: torch alone
    # takes seconds to import, scikit-learn most of one.
    ops = tmp_path / "ops.parquet"
    shutil.copy(DATA / "ops" / "resnet18_4x3x64x64.parquet", ops)
    heavy = ["torch", "torchvision", "sklearn", "scipy", "matplotlib", "snakemake", "tqdm"]
    code = (
        "import sys\n"
        "from opcost.cli import main\n"
        f"rc = main(['predict', '--ops', {str(ops)!r}, '--predictors', "
        f"{str(predictors_dir)!r}, '--format', 'csv'])\n"
        f"print('imported:', sorted(m for m in {heavy!r} if m in sys.modules))\n"
        "sys.exit(rc)\n"
    )
    # stderr is a pipe, not a terminal: no progress bar, so no tqdm either.
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("network,gpu,setting,mode,time_s")
    assert len(lines) == 1 + 2 + 1  # header, both modes, the import line
    assert lines[-1] == "imported: []"


# --- issue 21: the predictor's format below both train and predict ------------------------


def _opcost_imports(path: Path) -> set[str]:
    """The opcost modules a source file imports, at any level (functions included)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n.startswith("opcost") and _module_path(n) is not None}
    return found


def _module_path(module: str) -> Path | None:
    base = Path(opcost.model.trees.__file__).parents[1].joinpath(*module.split(".")[1:])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def test_train_and_predict_share_the_format_below_them_without_cycles():
    # train -> opcost.model <- predict: training does not import the serving module, and
    # nothing that train, predict or validate reach imports back into them.
    graph: dict[str, set[str]] = {}
    todo = ["opcost.train", "opcost.predict", "opcost.validate.dataset"]
    todo += ["opcost.validate.predictions"]
    while todo:
        module = todo.pop()
        if module not in graph:
            graph[module] = _opcost_imports(_module_path(module)) - {module}
            todo += sorted(graph[module])
    assert "opcost.predict" not in graph["opcost.train"]
    assert "opcost.model.format" in graph["opcost.train"] & graph["opcost.predict"]

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(
            m == goal or (m not in seen and not seen.add(m) and reaches(m, goal, seen))
            for m in graph.get(start, ())
        )

    cycles = sorted(m for m in graph if reaches(m, m, set()))
    assert cycles == []


def test_training_and_validation_import_no_torch():
    # The model stages run on hosts without a GPU stack: importing them (and the
    # predictor format) must not load torch, nor scikit-learn until a model is fitted.
    code = (
        "import sys\n"
        "import opcost.train, opcost.validate.dataset, opcost.validate.predictions\n"
        "import opcost.predict, opcost.model.format\n"
        "print(sorted(m for m in ('torch', 'torchvision', 'sklearn') if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
