"""Which models answer `opcost predict` and `opcost gpus`: the op models by default, the
forests with --forests; given, the study's own, or those shipped with opcost
(opcost.model.sources); and that the output says which."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from opcost.cli import main
from opcost.model import op_model_cache, sources
from opcost.model.format import load_predictors

REPO = Path(__file__).resolve().parents[1]
RESNET18_OPS = REPO / "tests/data/h100/ops/resnet18_4x3x64x64.parquet"
SHIPPED_GPUS = ["h100", "h100-notf32", "h200", "h200-notf32"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_shipped_predictors_cover_the_shipped_data():
    """Built from data/ (both Hopper studies): each names its GPU, the driver and torch
    the data record, and the days measured, as data/*/README.md give them."""
    shipped = load_predictors(sources.SHIPPED)
    assert sorted(shipped) == SHIPPED_GPUS
    for gpu, predictor in shipped.items():
        p = sources.provenance(predictor)
        device = "NVIDIA H100 80GB HBM3" if gpu.startswith("h100") else "NVIDIA H200"
        assert p["devices"] == [device]
        assert p["drivers"] == ["580.159.04"]
        assert p["torch_versions"] == ["2.11.0+cu130"]
        assert p["measured"] == ["2026-11-22", "2026-11-23"]
        # 566 distinct ops at batch 1 and 8 and 288 at batch 64 (data/*/README.md).
        assert p["n_ops"] == 566 + 288
        assert p["settings"] == ["default"]
        assert set(p["lono_mape_pct"]) == {"inference", "training"}


def test_predict_in_an_empty_directory_answers_from_the_shipped_predictors(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "predict", "--ops", str(RESNET18_OPS), "--forests")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "predictors (shipped with opcost, from the data in data/):"
    assert lines[1].startswith(
        "  h100: NVIDIA H100 80GB HBM3, driver 580.159.04, torch 2.11.0+cu130, "
        "measured 2026-11-22 to 2026-11-23, 854 ops"
    )
    assert len([line for line in lines if line.startswith("  h")]) == 4
    assert "resnet18_4x3x64x64: 29 distinct operations, 69 calls" in out
    table = out.split("\n\n")[2]
    assert set(SHIPPED_GPUS) <= set(table.split())


def test_a_studys_own_predictors_take_precedence_over_the_shipped(
    capsys, tmp_path, monkeypatch, predictors
):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(predictors, tmp_path / "results" / "predictors")
    code, out, err = run(
        capsys, "predict", "--ops", str(RESNET18_OPS), "--forests", "--format", "json"
    )
    assert code == 0, err
    doc = json.loads(out)
    assert doc["predictors"]["source"] == "this study's, results/predictors"
    assert [g["gpu"] for g in doc["predictors"]["gpus"]] == ["h100"]
    assert {r["gpu"] for r in doc["predictions"]} == {"h100"}


def test_predictors_given_take_precedence_over_the_studys(
    capsys, tmp_path, monkeypatch, predictors
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "predictors").mkdir(parents=True)
    shutil.copytree(sources.SHIPPED / "h200", tmp_path / "results" / "predictors" / "h200")
    code, out, err = run(capsys, "gpus", "--predictors", str(predictors), "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"] == str(predictors)
    assert [g["gpu"] for g in doc["gpus"]] == ["h100"]


def test_gpus_lists_the_shipped_configurations(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "gpus", "--forests")
    assert code == 0, err
    assert out.startswith("predictors (shipped with opcost, from the data in data/), in ")
    rows = [line.split() for line in out.splitlines() if line.lstrip().startswith("h")]
    assert [r[0] for r in rows] == SHIPPED_GPUS
    assert all("580.159.04" in r for r in rows)
    shipped = load_predictors(sources.SHIPPED)
    lono = shipped["h100"].lono_mape_pct
    assert f"{lono['inference']['time']:.3g}" in out


def test_no_predictors_anywhere_is_one_line_naming_what_to_do(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sources, "SHIPPED", tmp_path / "none")
    code, out, err = run(capsys, "predict", "--ops", str(RESNET18_OPS), "--forests")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert "no predictors: none in results/predictors and none shipped" in err
    assert "--predictors DIR" in err


def test_ship_copies_a_predictor_whole_and_it_loads_the_same(tmp_path, predictors):
    dest = tmp_path / "shipped" / "h100"
    dest.mkdir(parents=True)
    (dest / "stale.npz").write_bytes(b"old")
    sources.ship(predictors / "h100", dest)
    assert not (dest / "stale.npz").exists()
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        p.name for p in (predictors / "h100").iterdir()
    )
    a = load_predictors(tmp_path / "shipped")["h100"]
    b = load_predictors(predictors)["h100"]
    ops = pd.read_parquet(RESNET18_OPS)
    from opcost.predict import predict_networks

    assert predict_networks({"h100": a}, ops).table.equals(predict_networks({"h100": b}, ops).table)


# -- the op models, which answer by default ------------------------------------------------


@pytest.fixture(scope="module")
def op_space(tmp_path_factory) -> Path:
    """A small op-space data directory: two chunks of the H100's and the H200's rounds."""
    root = tmp_path_factory.mktemp("op-space")
    for gpu in ("h100", "h200"):
        (root / gpu).mkdir()
        for chunk in ("r4-0", "r2-0"):
            shutil.copy2(REPO / "data/op-space" / gpu / f"{chunk}.parquet", root / gpu)
    return root


@pytest.fixture
def checkout(op_space, tmp_path, monkeypatch):
    """An empty working directory, the op-space data of a checkout, an empty cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sources, "CHECKOUT_OP_SPACE", op_space)
    monkeypatch.setenv("OPCOST_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_predict_builds_the_op_models_once_and_replays_them(capsys, checkout, op_space):
    code, out, err = run(capsys, "predict", "--ops", str(RESNET18_OPS))
    assert code == 0, err
    key = op_model_cache.key(op_space)
    built = checkout / "cache" / "op-models" / key
    assert f"building the op models from {op_space} once" in err
    assert out.splitlines()[0] == (
        f"op models (built from the op-space data in {op_space}), in {built}:"
    )
    assert sorted(p.name for p in built.iterdir()) == ["h100", "h100.log", "h200", "h200.log"]
    assert "each network's calls replayed on a host thread and a GPU stream" in out
    assert "resnet18_4x3x64x64: 29 distinct operations, 69 calls" in out
    assert "pace, inference: " in out
    # Again: from the cache, the same answer.
    code, again, err = run(capsys, "predict", "--ops", str(RESNET18_OPS))
    assert code == 0
    assert again == out
    assert "building" not in err


def test_the_cache_key_follows_the_data_and_the_code(op_space, tmp_path, monkeypatch):
    other = tmp_path / "other"
    shutil.copytree(op_space, other)
    assert op_model_cache.key(other) == op_model_cache.key(op_space)
    (other / "h200" / "r4-0.parquet").unlink()
    assert op_model_cache.key(other) != op_model_cache.key(op_space)
    # A change to the code that trains them (here the model's roofline module).
    before = op_model_cache.key(op_space)
    package = tmp_path / "opcost"
    shutil.copytree(op_model_cache._PACKAGE, package, ignore=shutil.ignore_patterns("*.pyc"))
    monkeypatch.setattr(op_model_cache, "_PACKAGE", package)
    assert op_model_cache.key(op_space) == before
    with open(package / "model" / "roofline.py", "a") as f:
        f.write("\n# changed\n")
    assert op_model_cache.key(op_space) != before


def test_the_cache_keeps_the_newest_sets_of_op_models(checkout, op_space):
    root = op_model_cache.cache_root()
    for i, name in enumerate(["a", "b", "c", "d"]):
        (root / name).mkdir(parents=True)
        os.utime(root / name, (1e9 + i, 1e9 + i))
    built = op_model_cache.cached_op_models(op_space)
    assert sorted(p.name for p in root.iterdir()) == sorted([built.name, "c", "d"])


def test_an_interrupted_build_leaves_nothing_that_loads(checkout, op_space, monkeypatch):
    from opcost import op_models_job

    calls = []

    def fail_second(*args, **kwargs):
        if calls:
            raise KeyboardInterrupt
        calls.append(args[0])
        return original(*args, **kwargs)

    original = op_models_job.run_train_op_models
    monkeypatch.setattr(op_models_job, "run_train_op_models", fail_second)
    with pytest.raises(KeyboardInterrupt):
        op_model_cache.cached_op_models(op_space)
    assert not (op_model_cache.cache_root() / op_model_cache.key(op_space)).exists()


def test_a_studys_own_op_models_take_precedence_and_given_ones_over_them(
    capsys, checkout, op_models
):
    study = checkout / "results" / "op-models"
    study.mkdir(parents=True)
    shutil.copytree(op_models / "slow", study / "slow")
    code, out, err = run(capsys, "predict", "--ops", str(RESNET18_OPS), "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["op_models"]["source"] == "this study's, results/op-models"
    assert {r["gpu"] for r in doc["predictions"]} == {"slow"}
    code, out, err = run(capsys, "gpus", "--op-models", str(op_models), "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"] == str(op_models)
    assert [g["gpu"] for g in doc["gpus"]] == ["h100", "slow"]
    assert not (checkout / "cache").exists()  # nothing built


def test_gpus_lists_the_op_models_with_their_held_out_error(capsys, checkout, op_models):
    from opcost.model.opmodel_format import load_op_model, save_op_model

    scored = checkout / "scored"
    scores = {"gpu_time_median_abs_error_pct": 7.91, "gpu_time_mape_pct": 17.84}
    save_op_model(load_op_model(op_models / "h100"), scored / "h100", metrics={"all": scores})
    shutil.copytree(op_models / "slow", scored / "slow")
    code, out, err = run(capsys, "gpus", "--op-models", str(scored))
    assert code == 0, err
    assert out.startswith(f"op models in {scored}:")
    rows = [line.split() for line in out.splitlines() if line.lstrip().startswith(("h1", "sl"))]
    assert [r[0] for r in rows] == ["h100", "slow"]
    assert rows[0][-3:] == ["7.9", "/", "17.8"]
    assert rows[1][-3:] == ["n/a", "/", "n/a"]  # trained without a held-out score


def test_without_op_models_to_be_had_the_forests_answer_and_say_so(capsys, tmp_path, monkeypatch):
    from opcost.cli.predict import NO_OP_MODELS

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sources, "CHECKOUT_OP_SPACE", tmp_path / "none")
    code, out, err = run(capsys, "predict", "--ops", str(RESNET18_OPS))
    assert code == 0, err
    assert err.strip() == NO_OP_MODELS
    assert out.startswith("predictors (shipped with opcost, from the data in data/):")


def test_the_forests_options_and_the_op_models_are_not_mixed(capsys, op_models):
    base = ["predict", "--ops", str(RESNET18_OPS)]
    code, _, err = run(capsys, *base, "--forests", "--op-models", str(op_models))
    assert code == 2
    assert "not both" in err
    code, _, err = run(capsys, *base, "--forests", "--host-probe-ms", "2")
    assert code == 2
    assert "--host-probe-ms is for the op models' replay" in err
