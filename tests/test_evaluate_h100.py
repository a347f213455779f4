"""Evaluation against the real H100 logs in tests/data/h100, recomputed by hand with numpy.

The expected values are computed here from the raw CSV text and the JSON, following the
thesis's formulas 3.1-3.9, without calling any helper of opcost.
"""

import datetime as dt
import json
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from opcost.evaluate import evaluate_files, evaluate_measurement

RAW = "tests/data/h100/raw/h100/default"
SAMPLES = [
    f"{RAW}/inference/networks/resnet18_4x3x64x64",
    f"{RAW}/training/networks/vgg11_4x3x64x64",
    f"{RAW}/inference/ops/{'025dc3cf99733f10'}",
    f"{RAW}/training/ops/{'025dc3cf99733f10'}",
]


def by_hand(prefix):
    with open(f"{prefix}.json") as f:
        record = json.load(f)
    with open(f"{prefix}.csv") as f:
        lines = f.read().splitlines()
    header = [h.strip() for h in lines[0].split(",")]
    col = header.index("power.draw.instant [W]")
    t, w = [], []
    for line in lines[1:]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(header):
            continue
        try:
            value = float(cells[col])
        except ValueError:
            continue
        local = dt.datetime.strptime(cells[0], "%Y/%m/%d %H:%M:%S.%f")
        unix = local.replace(tzinfo=dt.UTC).timestamp() - record["utc_offset_s"]
        t.append(unix)
        w.append(value)
    t, w = np.array(t), np.array(w)
    inside = (t >= record["timed_start_unix_s"]) & (t <= record["timed_end_unix_s"])
    w = w[inside]
    mean = w.mean()  # (3.1)
    sigma = w.std(ddof=1)  # (3.2)
    kept = w[np.abs(w - mean) <= 3 * sigma]  # (3.3)
    t_tot, n = record["total_time_s"], record["iterations"]
    e_tot = kept.mean() * t_tot  # (3.4)
    sigma_e_tot = kept.std(ddof=1) * t_tot  # (3.5)
    return {
        "n_power_samples": len(w),
        "power_unfiltered_w": mean,
        "sigma_power_unfiltered_w": sigma,
        "power_w": kept.mean(),
        "sigma_power_w": kept.std(ddof=1),
        "n_filtered_out": len(w) - len(kept),
        "energy_total_j": e_tot,
        "sigma_energy_total_j": sigma_e_tot,
        "time_s": t_tot / n,  # (3.6)
        "energy_j": e_tot / n,  # (3.7)
        "sigma_time_s": record["sigma_total_time_s"] / n,  # (3.8)
        "sigma_energy_j": sigma_e_tot / n,  # (3.9)
        "energy_nvml_j": (record["energy_counter_end_mj"] - record["energy_counter_start_mj"])
        / 1000
        / n,
        "n_power_updates": 1 + int(np.count_nonzero(np.diff(w))),
    }


@pytest.mark.parametrize("prefix", SAMPLES)
def test_real_h100_measurement_matches_hand_computation(prefix):
    row = evaluate_measurement(f"{prefix}.json", f"{prefix}.csv")
    expected = by_hand(prefix)
    assert row["power_field"] == "power.draw.instant"
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, rel=1e-9), key
    assert row["low_power_samples"] == (expected["n_power_updates"] < 10)


def test_whole_real_sample_evaluates_and_matches_the_committed_dataset():
    jsons = sorted(Path(RAW).rglob("*.json"))
    dataset, failed = evaluate_files(jsons, "h100")
    assert len(dataset) == len(jsons) == 188
    assert failed.empty
    committed = pd.read_parquet("tests/data/h100/dataset/h100.parquet")
    merged = dataset.merge(
        committed, on=["mode", "kind", "op_id", "model_input"], suffixes=("", "_committed")
    )
    assert len(merged) == 188
    for col in ("time_s", "power_w", "energy_j", "energy_nvml_j"):
        np.testing.assert_allclose(merged[col], merged[f"{col}_committed"], rtol=1e-12)


def test_nvml_counter_and_formula_energy_agree_on_the_real_sample():
    """README: the counter agrees with W̄·t on average; per measurement within ~10 %."""
    d = pd.read_parquet("tests/data/h100/dataset/h100.parquet")
    rel = d["energy_nvml_j"] / d["energy_j"] - 1
    assert abs(rel.mean()) < 0.01
    assert rel.abs().median() < 0.03
    assert rel.abs().max() < 0.10
    integrated = d["energy_integrated_j"] / d["energy_j"] - 1
    assert integrated.abs().median() < 0.001


def test_window_shorter_than_polling_keeps_time_and_flags_power():
    """Real H100 job with a 20 ms window between two 20 ms polls: no sample inside it."""
    prefix = "tests/data/h100_short_window/3ebdd5f0ee3bb8cb"
    row = evaluate_measurement(f"{prefix}.json", f"{prefix}.csv")
    with open(f"{prefix}.json") as f:
        record = json.load(f)
    assert row["time_s"] == pytest.approx(record["total_time_s"] / record["iterations"])
    assert np.isnan(row["power_w"])
    assert np.isnan(row["energy_j"])
    assert row["low_power_samples"]
    assert row["n_power_samples"] == 0


def test_whole_job_log_spans_the_measurement():
    """The second nvidia-smi log (thesis 3.3) covers the job's timed window."""
    prefix = "tests/data/h100_short_window/3ebdd5f0ee3bb8cb"
    with open(f"{prefix}.json") as f:
        record = json.load(f)
    with open(f"{prefix}.job-log.csv") as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("timestamp, power.draw [W]")
    stamps = [
        dt.datetime.strptime(line.split(",")[0], "%Y/%m/%d %H:%M:%S.%f")
        .replace(tzinfo=dt.UTC)
        .timestamp()
        - record["utc_offset_s"]
        for line in lines[1:]
    ]
    # Within one polling interval (nvidia-smi's first sample comes ~25 ms after its start).
    assert stamps[0] <= record["timed_start_unix_s"] + 0.05
    assert stamps[-1] >= record["timed_end_unix_s"] - 0.05
    assert record["started_unix_s"] <= stamps[0] <= stamps[-1] <= record["finished_unix_s"]


def unpack(tar_gz: str, dest: Path) -> Path:
    """A committed raw_and_logs.tar.gz, unpacked under ``dest``."""
    with tarfile.open(tar_gz) as tar:
        # filter="data" where this Python has it (3.11.4 and later).
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, **kwargs)
    return dest


def assert_reevaluation_matches(jsons: list[Path], gpu: str, committed_parquet: str):
    """Evaluating the raw files again gives the committed dataset, row for row."""
    dataset, failed = evaluate_files(jsons, gpu)
    assert failed.empty
    committed = pd.read_parquet(committed_parquet)
    merged = dataset.merge(
        committed, on=["mode", "kind", "op_id", "model_input"], suffixes=("", "_committed")
    )
    assert len(merged) == len(committed) == len(jsons)
    for col in ("time_s", "power_w", "energy_j", "energy_nvml_j"):
        np.testing.assert_allclose(merged[col], merged[f"{col}_committed"], rtol=1e-12)
    return dataset


#: The issue #9 studies, each with the GPU configurations its config gives and the
#: measurements each configuration holds: config/hopper.yaml (batch 1 and 8) and
#: config/hopper-large.yaml (batch 64), both with TF32 on and off on each GPU.
STUDIES = {
    "hopper": (yaml.safe_load(Path("config/hopper.yaml").read_text())["gpus"], 1164),
    "hopper-large": (yaml.safe_load(Path("config/hopper-large.yaml").read_text())["gpus"], 592),
}
MEASURED = [
    (study, gpu)
    for study, (gpus, _) in STUDIES.items()
    for gpu in gpus
    if Path(f"data/{study}/{gpu}/raw_and_logs.tar.gz").exists()
]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The raw logs of data/hopper and data/hopper-large (the issue #9
    studies on the H100 and H200), unpacked."""
    root = tmp_path_factory.mktemp("hopper")
    for study, gpu in MEASURED:
        unpack(f"data/{study}/{gpu}/raw_and_logs.tar.gz", root / study / gpu)
    return root


def test_every_configuration_of_both_studies_is_committed():
    for study, (gpus, _) in STUDIES.items():
        assert [gpu for s, gpu in MEASURED if s == study] == list(gpus)


@pytest.mark.parametrize(("study", "gpu"), MEASURED)
def test_worker_measurements_match_hand_computation_and_the_committed_dataset(measured, study, gpu):
    raw = measured / study / gpu / "results" / "raw" / gpu / "default"
    chained = [
        p
        for p in sorted((raw / "training" / "ops").glob("*.json"))
        if json.loads(p.read_text()).get("calls_per_backward") == 16
    ]
    assert chained, "the training ops were measured in chains"
    small, large = ("64", "64") if study == "hopper-large" else ("1", "8")
    prefixes = [
        str(chained[0])[: -len(".json")],
        str(raw / "inference" / "networks" / f"resnet18_{small}x3x224x224"),
        str(raw / "training" / "networks" / f"resnet18_{large}x3x224x224"),
    ]
    for prefix in prefixes:
        row = evaluate_measurement(f"{prefix}.json", f"{prefix}.csv")
        for key, value in by_hand(prefix).items():
            assert row[key] == pytest.approx(value, rel=1e-9), (prefix, key)
    record = json.loads(chained[0].read_text())
    assert record["number_per_run"] % record["calls_per_backward"] == 0
    jsons = sorted(Path(raw).rglob("*.json"))
    assert_reevaluation_matches(jsons, gpu, f"data/{study}/{gpu}/dataset/{gpu}.parquet")


@pytest.mark.parametrize(("study", "gpu"), MEASURED)
def test_tf32_setting_reaches_every_measurement_of_the_study(measured, study, gpu):
    """Each record says whether TF32 was on, as the study's config asks for its GPU
    configuration, and so does every row of the committed dataset."""
    gpus, n_measurements = STUDIES[study]
    wanted = gpus[gpu]["tf32"]
    jsons = sorted((measured / study / gpu / "results" / "raw" / gpu).rglob("*.json"))
    assert len(jsons) == n_measurements
    assert all(json.loads(p.read_text())["tf32"] is wanted for p in jsons)
    committed = pd.read_parquet(f"data/{study}/{gpu}/dataset/{gpu}.parquet")
    assert (committed["tf32"] == wanted).all()
