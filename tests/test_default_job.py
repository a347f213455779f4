"""The README's main job, `snakemake` on the default config, end to end on this machine:
the shipped H100/H200 measurements evaluated, trained on, validated, drawn and reported,
with no GPU; and the predictors shipped with opcost are what it builds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opcost.model import sources
from opcost.model.format import load_predictors
from opcost.predict import predict_networks

REPO = Path(__file__).resolve().parents[1]
GPUS = ["h100", "h100-notf32", "h200", "h200-notf32"]
FIGURES = [
    "validation_small",
    "validation_large",
    "network_energy",
    "replay",
    "prediction_ops",
    "prediction_errors",
    "prediction_op_types",
    "prediction_networks",
]


@pytest.fixture(scope="module")
def default_job(tmp_path_factory):
    """A directory in which `snakemake --cores 2` ran the default study, as the README's
    first command does in the repository (its config and data linked in)."""
    work = tmp_path_factory.mktemp("default_job")
    for name in ("config", "data"):
        (work / name).symlink_to(REPO / name)
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "2"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=2400,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return work


@pytest.mark.slow
def test_the_default_job_draws_every_figure_from_the_shipped_data(default_job):
    for stem in FIGURES:
        for ext in ("pdf", "png"):
            assert (default_job / f"results/figures/{stem}.{ext}").stat().st_size > 10_000
    for gpu in GPUS:
        assert (default_job / f"results/predictors/{gpu}/manifest.json").is_file()
    # Nothing was profiled: every raw log is an included one, unpacked.
    assert not (default_job / "results/raw").exists()
    validation = pd.read_parquet(default_job / "results/validation/dataset_validation.parquet")
    # 24 model-input sets (16 at batch 1 and 8, 8 at 64), 2 modes, 4 configurations.
    assert validation[validation["ops_included"] == "all"].shape[0] == 24 * 2 * 4


@pytest.mark.slow
def test_the_default_job_evaluates_the_raw_logs_as_they_were_on_the_gpu_hosts(default_job):
    """Its datasets equal those the evaluate rule wrote on the GPU hosts (data/*/dataset)."""
    keys = ["mode", "kind", "op_id", "model_input"]
    for gpu in GPUS:
        made = pd.read_parquet(default_job / f"results/dataset/{gpu}.parquet")
        shipped = pd.concat(
            pd.read_parquet(REPO / f"data/{study}/{gpu}/dataset/{gpu}.parquet")
            for study in ("hopper", "hopper-large")
        )
        assert len(made) == len(shipped) == 1164 + 592
        merged = made.merge(shipped, on=keys, suffixes=("", "_gpu_host"))
        assert len(merged) == len(made)
        for column in ("time_s", "power_w", "energy_j", "gpu_time_s"):
            np.testing.assert_allclose(
                merged[column], merged[f"{column}_gpu_host"], rtol=1e-12, equal_nan=True
            )


@pytest.mark.slow
def test_the_shipped_predictors_are_the_default_jobs(default_job):
    """`snakemake ready_made_predictors` copies these: trained from the same data with the
    same config and seed, they predict the same (up to scikit-learn's version)."""
    made = load_predictors(default_job / "results/predictors")
    shipped = load_predictors(sources.SHIPPED)
    assert sorted(made) == sorted(shipped) == GPUS
    ops = pd.read_parquet(REPO / "data/hopper-large/ops/resnet18_64x3x224x224.parquet")
    for gpu in GPUS:
        assert sources.provenance(made[gpu]) | {"lono_mape_pct": None} == sources.provenance(
            shipped[gpu]
        ) | {"lono_mape_pct": None}
        a = predict_networks({gpu: made[gpu]}, ops).table
        b = predict_networks({gpu: shipped[gpu]}, ops).table
        np.testing.assert_allclose(a["time_s"], b["time_s"], rtol=0.02)
        np.testing.assert_allclose(a["energy_j"], b["energy_j"], rtol=0.02)


@pytest.mark.slow
def test_the_default_jobs_report_holds_its_figures(default_job):
    report = default_job / "report.html"
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--report", str(report)],
        cwd=default_job,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    text = report.read_text(errors="replace")
    for stem in ("validation_small", "replay", "prediction_networks"):
        assert f"{stem}.png" in text


@pytest.mark.slow
def test_the_default_job_trains_the_op_models_of_the_shipped_op_space_data(default_job):
    from opcost.model.opmodel_format import load_op_models

    models = load_op_models(default_job / "results/op-models")
    assert sorted(models) == GPUS
    # data/op-space/README.md: with TF32 off only conv, linear, matmul and attention are
    # measured; the other families are the twin's, and only its own are scored.
    for gpu in GPUS:
        # 13 families, the layer norms learnt apart from the other norms (opmodel.model_key)
        assert len(models[gpu].families) == 14, gpu
        assert "norm.rows" in models[gpu].families
        assert models[gpu].meta["tf32"] is ("notf32" not in gpu)
    metrics = json.loads((default_job / "results/op-models/h100-notf32/metrics.json").read_text())
    assert sorted(metrics["families"]) == ["attention", "conv", "linear", "matmul"]
