"""The H200 measurements with cudnn_benchmark (tests/data/cudnn_benchmark_h200): measured as
configuration h200-cudnnbench of config/op-space.yaml says, and learnt from as its twin
rules say."""

import json
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from opcost.config import load_study_file
from opcost.model import op_tables
from opcost.opspace_workflow import op_space_families

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests/data/cudnn_benchmark_h200"


@pytest.fixture(scope="module")
def chunks(tmp_path_factory) -> pd.DataFrame:
    out = tmp_path_factory.mktemp("chunks")
    with tarfile.open(DATA / "op_space_convs.tar.gz") as tar:
        tar.extractall(out, filter="data")
    files = sorted((out / "results/op-space/raw/h200-cudnnbench").glob("*.parquet"))
    return pd.concat([t for t in map(pd.read_parquet, files) if len(t)], ignore_index=True)


def test_the_chunks_hold_the_configurations_convolutions_measured_with_benchmark(chunks):
    study = load_study_file(REPO / "config/op-space.yaml")
    assert op_space_families(study, "h200-cudnnbench") == ["conv"]
    assert set(chunks["family"]) == {"conv"}
    assert chunks["cudnn_benchmark"].all()
    assert chunks["tf32"].all()
    assert (chunks["status"] == "ok").all()
    # Rounds 1 and 5's convolutions, each in both modes: the op ids the committed samples
    # of those rounds draw (data/op-space/samples*.parquet).
    samples = pd.concat(
        pd.read_parquet(REPO / f"data/op-space/{name}.parquet")
        for name in ("samples", "samples-r5")
    )
    convs = set(samples.loc[samples["family"] == "conv", "op_id"])
    assert set(chunks["op_id"]) == convs
    assert chunks.groupby("op_id")["mode"].nunique().eq(2).all()


def test_the_twin_fills_every_other_family_from_the_h200s_own_samples(chunks):
    h200 = pd.concat(map(pd.read_parquet, sorted((REPO / "data/op-space/h200").glob("*.parquet"))))
    assert op_tables.twin_of({"h200": h200, "h200-cudnnbench": chunks}, "h200-cudnnbench") == "h200"
    own, _ = op_tables.pooled_rows(chunks, h200, None)
    theirs = op_tables.training_rows(h200)
    assert (own.loc[own["family"] == "conv", "op_id"].isin(set(chunks["op_id"]))).all()
    others = own[own["family"] != "conv"]
    assert len(others) == (theirs["family"] != "conv").sum()
    assert others["cudnn_benchmark"].all()


def test_the_networks_were_traced_with_benchmark():
    with tarfile.open(DATA / "traces.tar.gz") as tar:
        records = [
            json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith(".json")
        ]
    assert len(records) == 60  # ten networks, batch 1, 8 and 64, two modes
    assert all(r["cudnn_benchmark"] and r["tf32"] for r in records)
    assert all(r["status"] == "ok" and r["graph_status"] == "ok" for r in records)
    assert {r["gpu"] for r in records} == {"h200-cudnnbench"}
