"""Which predictors answer `opcost predict` and `opcost gpus`: given, the study's own, or
those shipped with opcost (opcost.model.sources), and that the output says which."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from opcost.cli import main
from opcost.model import sources
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
    code, out, err = run(capsys, "predict", "--ops", str(RESNET18_OPS))
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
    code, out, err = run(capsys, "predict", "--ops", str(RESNET18_OPS), "--format", "json")
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
    code, out, err = run(capsys, "gpus")
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
    code, out, err = run(capsys, "predict", "--ops", str(RESNET18_OPS))
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
