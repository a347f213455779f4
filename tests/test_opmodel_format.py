"""Tests for opcost.model.opmodel_format: op models saved and loaded predict the same
numbers, loading checks every file against the manifest, and a directory without a
manifest (interrupted) or with an altered file is refused, naming the file."""

from __future__ import annotations

import glob
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opcost.model import PredictorError, op_scores, op_tables, opmodel
from opcost.model.opmodel_format import (
    MANIFEST_FILE,
    METRICS_FILE,
    MODEL_FILE,
    TREES_FILE,
    load_op_model,
    load_op_models,
    save_op_model,
)
from opcost.train import TrainConfig, make_regressor

DATA = Path(__file__).resolve().parents[1] / "data" / "op-space"


def _make():
    return make_regressor(TrainConfig(regressor="extra_trees", n_estimators=5), n_jobs=1)


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    files = sorted(glob.glob(str(DATA / "h100" / "*.parquet")))
    t = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    return t.groupby("family", group_keys=False).head(40).reset_index(drop=True)


@pytest.fixture(scope="module")
def saved(table: pd.DataFrame, tmp_path_factory) -> tuple[opmodel.OpModel, Path]:
    model = opmodel.fit(table, "h100", _make)
    directory = tmp_path_factory.mktemp("op-models") / "h100"
    sources = sorted(glob.glob(str(DATA / "h100" / "*.parquet")))[:2]
    save_op_model(model, directory, sources=sources, metrics={"all": {"n": 1}})
    return model, directory


def test_saved_model_predicts_the_same(table: pd.DataFrame, saved) -> None:
    model, directory = saved
    loaded = load_op_model(directory)
    ops = table[["spec", "mode", "op_type"]].drop_duplicates()
    pd.testing.assert_frame_equal(model.predict(ops), loaded.predict(ops))
    assert loaded.gpu == "h100"
    assert loaded.ceilings == model.ceilings
    assert loaded.sync_s == model.sync_s
    assert loaded.meta["gpu_name"] == "NVIDIA H100 80GB HBM3"
    assert loaded.families["conv"].ranges == model.families["conv"].ranges != {}
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    assert set(manifest["files"]) == {MODEL_FILE, TREES_FILE, METRICS_FILE}
    assert len(manifest["sources"]) == 2
    assert list(load_op_models(directory.parent)) == ["h100"]


def test_no_manifest_is_refused(saved, tmp_path: Path) -> None:
    _, directory = saved
    copy = tmp_path / "h100"
    shutil.copytree(directory, copy)
    (copy / MANIFEST_FILE).unlink()
    with pytest.raises(PredictorError, match="no manifest.json"):
        load_op_model(copy)


@pytest.mark.parametrize("name", [TREES_FILE, MODEL_FILE])
def test_an_altered_file_is_refused(saved, tmp_path: Path, name: str) -> None:
    _, directory = saved
    copy = tmp_path / "h100"
    shutil.copytree(directory, copy)
    data = bytearray((copy / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / name).write_bytes(bytes(data))
    with pytest.raises(PredictorError, match=f"{name}: does not match its SHA-256"):
        load_op_model(copy)


def test_trees_hold_plain_arrays_only(saved) -> None:
    _, directory = saved
    with np.load(directory / TREES_FILE, allow_pickle=False) as arrays:
        assert all(not arrays[k].dtype.hasobject for k in arrays.files)
        # One ensemble per fitted target of every family, and the power model.
        prefixes = {k.rsplit("/", 1)[0] for k in arrays.files}
    doc = json.loads((directory / MODEL_FILE).read_text())
    expected = {f"{f}/{t}" for f, d in doc["families"].items() for t in d["targets"]}
    assert prefixes == expected | {"power"}


def test_held_out_errors_and_twin(table: pd.DataFrame) -> None:
    errors = op_scores.held_out_errors(table, "h100", _make, fraction=0.25)
    held = set(np.random.default_rng(0).choice(sorted(table["op_id"].unique()),
                                                int(table["op_id"].nunique() * 0.25),
                                                replace=False))  # fmt: skip
    expected = table[table["op_id"].isin(held) & (table["status"] == "ok")]
    expected = expected[(expected["gpu_time_s"] > 0) & (expected["host_time_s"] > 0)]
    assert errors["all"]["n"] == len(expected)
    assert sum(f["n"] for f in errors["families"].values()) == len(expected)
    assert all(f["gpu_time_median_abs_error_pct"] >= 0 for f in errors["families"].values())
    # The held-out power windows whose kernels keep the GPU busy at least half the window,
    # each scored once.
    windows = expected[
        expected["power_w"].notna() & (expected["gpu_time_s"] >= 0.5 * expected["power_time_s"])
    ]
    power = errors["busy_power"]
    assert power["all"]["n"] == len(windows) >= 5
    assert {f: s["n"] for f, s in power["families"].items()} == (
        windows.groupby("family").size().to_dict()
    )
    assert power["all"]["median_abs_error_pct"] > 0
    off = table.assign(tf32=False)
    assert op_tables.twin_of({"h100": table, "h100-notf32": off}, "h100-notf32") == "h100"
    assert op_tables.twin_of({"h100": table, "h100-notf32": off}, "h100") is None
    other = table.assign(gpu_name="NVIDIA H200")
    assert op_tables.twin_of({"h200": other, "h100-notf32": off}, "h100-notf32") is None
    # cudnn_benchmark on: the twin is the same GPU with PyTorch's defaults; a table
    # measured before the column existed reads as benchmark off.
    bench = table.assign(cudnn_benchmark=True)
    both = {"h100": table, "h100-bench": bench, "h100-notf32": off}
    assert op_tables.twin_of(both, "h100-bench") == "h100"
    assert op_tables.twin_of({**both, "h100": bench.assign(gpu_name="x")}, "h100-bench") is None
    assert op_tables.peers_of({**both, "h200-bench": bench.assign(gpu_name="H200")},
                              "h100-bench") == ["h200-bench"]  # fmt: skip


def test_a_power_model_of_other_features_is_refused(saved, tmp_path: Path) -> None:
    model, _ = saved
    # Saved consistently (manifest and all), but its power model does not take the
    # features this opcost gives it (as one saved by an opcost with other features).
    other = opmodel.OpModel(**{**model.__dict__, "power_families": ("conv",)})
    save_op_model(other, tmp_path / "h100")
    with pytest.raises(PredictorError, match=r"\(power\): other features than this opcost's"):
        load_op_model(tmp_path / "h100")
