"""Tests for opcost.evaluate: thesis formulas (3.1)-(3.9) on synthetic and real logs.

Expected values are computed here with numpy from the raw numbers, following the thesis's
formulas and the choices in docs/method.md, never by calling the code's helpers.
Junk rows counted in the dataset, and logs that must fail the evaluation, are tested in
tests/test_faults.py, which imports the record and log builders below.
"""

from __future__ import annotations

import csv
import json
import math
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opcost.evaluate
import opcost.schemas
from opcost.evaluate import (
    DATASET_COLUMNS,
    FAILURE_COLUMNS,
    EvaluationError,
    evaluate_gpu,
    evaluate_measurement,
    write_dataset,
)

PROBE = Path(__file__).parent / "data" / "h100_probe"
HEADER = (
    "timestamp, power.draw [W], power.draw.instant [W], clocks.current.sm [MHz], "
    "clocks.current.memory [MHz], temperature.gpu, utilization.gpu [%], power.limit [W]"
)
OP_ID = "0123456789abcdef"
SPEC = {
    "kind": "module",
    "type": "torch.nn.modules.linear.Linear",
    "attrs": {"in_features": 4, "out_features": 2, "bias": True},
    "args": [{"__tensor__": 0}],
    "kwargs": {},
    "inputs": [{"shape": [8, 4], "dtype": "float32"}],
    "outputs": [{"shape": [8, 2], "dtype": "float32"}],
}
START_UNIX_S = 1795340491.0  # 2026-11-22 09:41:31 UTC
POLL_S = 0.02
SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def record(**overrides) -> dict:
    """A benchmark JSON as the profile stage writes it (docs/formats.md)."""
    r = {
        "schema_version": 1,
        "status": "ok",
        "failure_reason": None,
        "kind": "op",
        "op_id": OP_ID,
        "model_input": None,
        "spec": SPEC,
        "mode": "inference",
        "gpu": "h100",
        "setting": "default",
        "device": "cuda",
        "dtype": "float32",
        "tf32": True,
        "block_size": 4,
        "warmup_iterations": 10,
        "min_run_time_s": 1.0,
        "number_per_run": 50,
        "block_times_s": [0.25, 0.26, 0.24, 0.25],
        "iterations": 200,
        "total_time_s": 1.0,
        "sigma_total_time_s": 0.02,
        "timed_start_unix_s": START_UNIX_S,
        "timed_end_unix_s": START_UNIX_S + 1.02,
        "utc_offset_s": 3600,
        "energy_counter_start_mj": 1_000_000,
        "energy_counter_end_mj": 1_300_500,
        "power_available": True,
        "power_fields": ["timestamp", "power.draw", "power.draw.instant"],
        "peak_memory_bytes": 123456,
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "gpu_uuid": "GPU-57781e38-0b78-5d74-ed7b-e2db6ddbacd3",
        "driver_version": "580.159.04",
        "cuda_version": "13.0",
        "torch_version": "2.15.0",
        "host": "node01",
        "started_unix_s": START_UNIX_S - 5,
        "finished_unix_s": START_UNIX_S + 3,
    }
    r.update(overrides)
    return r


def log_line(unix_s: float, power_w: float, *, utc_offset_s: int = 3600, sm=1980, temp=40) -> str:
    """One nvidia-smi line at ``unix_s``, printed in local time like nvidia-smi does."""
    local = datetime.fromtimestamp(unix_s, UTC).replace(tzinfo=None)
    local += timedelta(seconds=utc_offset_s)
    ms = round(local.microsecond / 1000)
    local = local.replace(microsecond=0) + timedelta(milliseconds=ms)
    text = local.strftime("%Y/%m/%d %H:%M:%S.") + f"{local.microsecond // 1000:03d}"
    return f"{text}, 300.00, {power_w:.2f}, {sm}, 2619, {temp}, 97, 700.00"


def write_pair(folder: Path, rec: dict, lines: list[str] | None, name: str = OP_ID):
    folder.mkdir(parents=True, exist_ok=True)
    json_path = folder / f"{name}.json"
    json_path.write_text(json.dumps(rec))
    csv_path = folder / f"{name}.csv"
    if lines is not None:
        csv_path.write_text("\n".join(lines) + "\n")
    return json_path, csv_path


def expected_power(w: np.ndarray, t_rel_s: np.ndarray, window_s: float) -> dict:
    """The thesis's formulas (3.1)-(3.3) and the cross-checks, by hand."""
    mean = w.sum() / len(w)  # (3.1)
    sigma = math.sqrt(((w - mean) ** 2).sum() / (len(w) - 1))  # (3.2)
    kept = w[np.abs(w - mean) <= 3 * sigma]  # (3.3)
    mean_f = kept.sum() / len(kept)
    sigma_f = math.sqrt(((kept - mean_f) ** 2).sum() / (len(kept) - 1))
    runs = [v for i, v in enumerate(w) if i == 0 or v != w[i - 1]]
    kept_runs = [v for v in runs if abs(v - mean) <= 3 * sigma]
    area = sum((w[i] + w[i + 1]) / 2 * (t_rel_s[i + 1] - t_rel_s[i]) for i in range(len(w) - 1))
    area += w[0] * t_rel_s[0] + w[-1] * (window_s - t_rel_s[-1])
    return {
        "mean": mean,
        "sigma": sigma,
        "mean_f": mean_f,
        "sigma_f": sigma_f,
        "n_out": len(w) - len(kept),
        "n_updates": len(runs),
        "sem": sigma_f / math.sqrt(len(kept_runs)),
        "integrated_j": area,
    }


def test_hand_computed_example(tmp_path):
    """A small log: lead-in, a startup spike inside the window, a lead-out."""
    rec = record()
    inside = [612.0, 655.5, 650.25, 650.25, 648.0, 652.75, 652.75, 651.5, 649.0, 650.5]
    inside += [651.25, 649.75, 650.0, 653.0, 647.5, 650.5, 650.5, 651.0, 648.25, 652.0]
    inside = [95.0, *inside]  # the first poll in the window still sees the idle card
    lines = [HEADER]
    lines += [log_line(START_UNIX_S - 0.1 + POLL_S * i, 90.0) for i in range(5)]
    times = [START_UNIX_S + 0.01 + 0.05 * i for i in range(len(inside))]
    lines += [log_line(t, p) for t, p in zip(times, inside, strict=True)]
    lines += [log_line(START_UNIX_S + 1.03 + POLL_S * i, 120.0) for i in range(5)]
    json_path, csv_path = write_pair(tmp_path, rec, lines)

    row = evaluate_measurement(json_path, csv_path)

    w = np.array(inside)
    t_rel = np.array(times) - START_UNIX_S
    x = expected_power(w, t_rel, 1.02)
    assert x["n_out"] == 1  # the idle reading is more than 3σ off; nothing else is
    n_iter, t_tot, sigma_t_tot = 200, 1.0, 0.02
    assert row["n_power_samples"] == 21
    assert row["n_rows_total"] == 31
    assert row["n_rows_dropped"] == 0
    assert row["n_filtered_out"] == 1
    assert row["n_power_updates"] == x["n_updates"] == 18
    assert row["power_field"] == "power.draw.instant"
    assert row["power_unfiltered_w"] == pytest.approx(x["mean"], rel=1e-12)
    assert row["sigma_power_unfiltered_w"] == pytest.approx(x["sigma"], rel=1e-12)
    assert row["power_w"] == pytest.approx(x["mean_f"], rel=1e-12)
    assert row["sigma_power_w"] == pytest.approx(x["sigma_f"], rel=1e-12)
    assert row["sem_power_w"] == pytest.approx(x["sem"], rel=1e-12)
    assert row["energy_total_j"] == pytest.approx(x["mean_f"] * t_tot, rel=1e-12)  # (3.4)
    assert row["sigma_energy_total_j"] == pytest.approx(x["sigma_f"] * t_tot, rel=1e-12)  # (3.5)
    assert row["time_s"] == pytest.approx(t_tot / n_iter, rel=1e-12)  # (3.6)
    assert row["energy_j"] == pytest.approx(x["mean_f"] * t_tot / n_iter, rel=1e-12)  # (3.7)
    assert row["sigma_time_s"] == pytest.approx(sigma_t_tot / n_iter, rel=1e-12)  # (3.8)
    assert row["sigma_energy_j"] == pytest.approx(x["sigma_f"] * t_tot / n_iter, rel=1e-12)
    assert row["energy_nvml_j"] == pytest.approx(300.5 / n_iter, rel=1e-12)
    # Timestamps carry milliseconds only: the hand integral uses the exact times.
    assert row["energy_integrated_j"] == pytest.approx(x["integrated_j"] / n_iter, rel=1e-4)
    assert row["sm_clock_mhz"] == 1980.0
    assert row["mem_clock_mhz"] == 2619.0
    assert row["temperature_c"] == 40.0
    assert row["power_limit_w"] == 700.0
    assert row["utilization_gpu_pct"] == 97.0
    assert row["window_s"] == pytest.approx(1.02, abs=1e-6)  # float64 at 2e9 s
    assert row["low_power_samples"] is False
    assert row["op_type"] == "torch.nn.modules.linear.Linear"
    assert json.loads(row["spec"]) == SPEC
    assert " " not in row["spec"]
    assert row["model_input"] is None
    assert set(row) == set(DATASET_COLUMNS)


def test_window_edges_are_inclusive_and_use_the_utc_offset(tmp_path):
    # Polls exactly on the window's edges belong to it; the ones a poll outside do not.
    # With the wrong offset sign, every line would fall two hours off the window.
    rec = record(timed_end_unix_s=START_UNIX_S + 0.2, utc_offset_s=-3600)
    times = [START_UNIX_S + POLL_S * i for i in range(-1, 12)]
    powers = [10.0, *[float(100 + i) for i in range(11)], 20.0]
    lines = [HEADER] + [
        log_line(t, p, utc_offset_s=-3600) for t, p in zip(times, powers, strict=True)
    ]
    json_path, csv_path = write_pair(tmp_path, rec, lines)
    row = evaluate_measurement(json_path, csv_path)
    assert row["n_power_samples"] == 11
    assert row["power_unfiltered_w"] == pytest.approx(105.0, rel=1e-12)


def test_probe_h100_first_burst(tmp_path):
    """The real H100 log: window = the first matmul burst the probe recorded."""
    log_text = (PROBE / "probe.log").read_text()
    bursts = json.loads(next(line for line in log_text.splitlines() if line.startswith("[[")))
    utc_offset_s = int(re.search(r"^tz (-?\d+)", log_text, re.MULTILINE).group(1))
    start, end, e0_mj, e1_mj = bursts[0]
    n_iter = 1000
    rec = record(
        timed_start_unix_s=start,
        timed_end_unix_s=end,
        total_time_s=end - start,
        sigma_total_time_s=0.0,
        iterations=n_iter,
        utc_offset_s=utc_offset_s,
        energy_counter_start_mj=e0_mj,
        energy_counter_end_mj=e1_mj,
    )
    json_path = tmp_path / "probe.json"
    json_path.write_text(json.dumps(rec))

    row = evaluate_measurement(json_path, PROBE / "trace.csv")

    with (PROBE / "trace.csv").open(newline="") as f:
        rows = list(csv.reader(f, skipinitialspace=True))
    header, body = rows[0], rows[1:]
    col = header.index("power.draw.instant [W]")
    unix = np.array(
        [
            datetime.strptime(r[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()
            - utc_offset_s
            for r in body
        ]
    )
    inside = (unix >= start) & (unix <= end)
    w = np.array([float(r[col]) for r in body])[inside]
    x = expected_power(w, unix[inside] - start, end - start)
    sm = np.array([float(r[header.index("clocks.current.sm [MHz]")]) for r in body])[inside]
    temp = np.array([float(r[header.index("temperature.gpu")]) for r in body])[inside]

    assert row["n_power_samples"] == inside.sum() == 1130
    assert row["n_power_updates"] == x["n_updates"]
    assert row["n_filtered_out"] == x["n_out"] > 0  # the ramp from idle is filtered out
    assert row["power_unfiltered_w"] == pytest.approx(x["mean"], rel=1e-12)
    assert row["sigma_power_unfiltered_w"] == pytest.approx(x["sigma"], rel=1e-12)
    assert row["power_w"] == pytest.approx(x["mean_f"], rel=1e-12)
    assert row["sigma_power_w"] == pytest.approx(x["sigma_f"], rel=1e-12)
    assert row["sem_power_w"] == pytest.approx(x["sem"], rel=1e-12)
    assert row["energy_total_j"] == pytest.approx(x["mean_f"] * (end - start), rel=1e-12)
    assert row["energy_j"] == pytest.approx(x["mean_f"] * (end - start) / n_iter, rel=1e-12)
    assert row["sigma_energy_j"] == pytest.approx(x["sigma_f"] * (end - start) / n_iter, rel=1e-12)
    assert row["energy_integrated_j"] == pytest.approx(x["integrated_j"] / n_iter, rel=1e-9)
    assert row["energy_nvml_j"] == pytest.approx((e1_mj - e0_mj) / 1000 / n_iter, rel=1e-12)
    assert row["sm_clock_mhz"] == pytest.approx(sm.mean(), rel=1e-12)
    assert row["temperature_c"] == pytest.approx(temp.mean(), rel=1e-12)
    assert math.isnan(row["power_limit_w"])  # not logged by the probe
    # The real data's own cross-check: integrating power.draw.instant over the window
    # agrees with the NVML energy counter to well under 1 %.
    assert row["energy_integrated_j"] == pytest.approx(row["energy_nvml_j"], rel=0.01)


@SETTINGS
@given(
    power_w=st.floats(10, 700).map(lambda x: round(x, 2)),
    n=st.integers(2, 150),
    total_time_s=st.floats(0.01, 10),
    iterations=st.integers(1, 10_000),
)
def test_constant_power_has_no_spread(tmp_path, power_w, n, total_time_s, iterations):
    end_unix_s = START_UNIX_S + POLL_S * (n - 1)
    window_s = end_unix_s - START_UNIX_S  # as recorded: float64 at 2e9 s has 0.2 µs steps
    rec = record(
        timed_end_unix_s=end_unix_s,
        total_time_s=total_time_s,
        iterations=iterations,
    )
    lines = [HEADER] + [log_line(START_UNIX_S + POLL_S * i, power_w) for i in range(n)]
    json_path, csv_path = write_pair(tmp_path, rec, lines)
    row = evaluate_measurement(json_path, csv_path)
    assert row["n_filtered_out"] == 0
    assert row["n_power_updates"] == 1
    assert row["low_power_samples"] is True
    assert row["sigma_power_w"] == pytest.approx(0, abs=1e-9 * power_w)
    assert row["sigma_energy_j"] == pytest.approx(0, abs=1e-9 * power_w * total_time_s)
    assert row["power_w"] == pytest.approx(power_w, rel=1e-12)
    assert row["energy_total_j"] == pytest.approx(power_w * total_time_s, rel=1e-12)
    assert row["energy_j"] == pytest.approx(power_w * total_time_s / iterations, rel=1e-12)
    assert row["energy_integrated_j"] == pytest.approx(power_w * window_s / iterations, rel=1e-9)


@SETTINGS
@given(
    base_w=st.floats(100, 600),
    amplitude_w=st.floats(0.5, 20),
    n_high=st.integers(20, 80),
    n_low=st.integers(20, 80),
    jitter=st.lists(st.floats(-0.1, 0.1), min_size=160, max_size=160),
    order=st.randoms(use_true_random=False),
    outlier_sign=st.sampled_from([-1, 1]),
    outlier_at=st.floats(0, 1),
)
def test_outlier_ten_sigma_away_is_filtered_out(
    tmp_path, base_w, amplitude_w, n_high, n_low, jitter, order, outlier_sign, outlier_at
):
    # Two levels with jitter: every clean sample lies within 3σ of the clean mean (the
    # minority level is at most 2.6σ away), so the filter keeps them all, with and
    # without the outlier.
    z = [1.0] * n_high + [-1.0] * n_low
    order.shuffle(z)
    clean = base_w + amplitude_w * (np.array(z) + np.array(jitter[: len(z)]))
    clean = np.round(clean, 2)
    mean, sigma = clean.mean(), clean.std(ddof=1)
    outlier = round(mean + outlier_sign * 10 * sigma, 2)
    position = int(outlier_at * len(clean))
    with_outlier = np.insert(clean, position, outlier)

    results = []
    for i, values in enumerate((clean, with_outlier)):
        window_s = POLL_S * (len(values) - 1)
        rec = record(timed_end_unix_s=START_UNIX_S + window_s)
        lines = [HEADER] + [log_line(START_UNIX_S + POLL_S * k, v) for k, v in enumerate(values)]
        json_path, csv_path = write_pair(tmp_path / str(i), rec, lines)
        results.append(evaluate_measurement(json_path, csv_path))
    without, with_ = results
    assert without["n_filtered_out"] == 0
    assert with_["n_filtered_out"] == 1
    assert with_["power_w"] == pytest.approx(clean.mean(), rel=1e-12)
    assert without["power_w"] == pytest.approx(clean.mean(), rel=1e-12)
    assert with_["sigma_power_w"] == pytest.approx(sigma, rel=1e-9)
    assert with_["power_unfiltered_w"] == pytest.approx(with_outlier.mean(), rel=1e-12)


def test_few_power_updates_are_flagged(tmp_path):
    # 50 polls, but the GPU updated its reading only every 10th poll: 5 readings.
    rec = record(timed_end_unix_s=START_UNIX_S + POLL_S * 49)
    powers = [300.0 + (i // 10) for i in range(50)]
    lines = [HEADER] + [log_line(START_UNIX_S + POLL_S * i, p) for i, p in enumerate(powers)]
    json_path, csv_path = write_pair(tmp_path, rec, lines)
    row = evaluate_measurement(json_path, csv_path)
    assert row["n_power_updates"] == 5
    assert row["low_power_samples"] is True
    assert row["power_w"] == pytest.approx(302.0, rel=1e-12)
    # Five independent readings, not fifty.
    assert row["sem_power_w"] == pytest.approx(np.std(powers, ddof=1) / math.sqrt(5), rel=1e-12)
    row = evaluate_measurement(json_path, csv_path, min_power_updates=5)
    assert row["low_power_samples"] is False


POWER_AND_ENERGY = [
    "power_w",
    "sigma_power_w",
    "sem_power_w",
    "power_unfiltered_w",
    "sigma_power_unfiltered_w",
    "energy_total_j",
    "sigma_energy_total_j",
    "energy_j",
    "sigma_energy_j",
    "energy_nvml_j",
    "energy_integrated_j",
    "sm_clock_mhz",
    "temperature_c",
]


@pytest.mark.parametrize(
    ("overrides", "lines"),
    [
        ({"device": "cpu", "power_available": False}, ["# no power log: device is cpu"]),
        ({"power_available": False}, [HEADER, log_line(START_UNIX_S + 0.5, 200.0)]),
        ({}, ["# no power log: nvidia-smi not found"]),
    ],
)
def test_time_only_measurement_has_nan_power(tmp_path, overrides, lines):
    rec = record(**overrides)
    json_path, csv_path = write_pair(tmp_path, rec, lines)
    row = evaluate_measurement(json_path, csv_path)
    assert row["time_s"] == pytest.approx(1.0 / 200, rel=1e-12)
    for column in POWER_AND_ENERGY:
        assert math.isnan(row[column]), column
    assert row["power_field"] is None
    assert row["n_power_samples"] == 0
    assert row["low_power_samples"] is False


def network_record(**overrides) -> dict:
    fields = {"kind": "network", "op_id": None, "spec": None}
    return record(**{"model_input": "resnet18_32x3x224x224", **fields, **overrides})


def build_tree(raw: Path) -> None:
    """Five measurements: two ops, one failed op, one network, one time-only network."""
    ok = [HEADER] + [log_line(START_UNIX_S + POLL_S * i, 250.0 + i % 7) for i in range(51)]
    write_pair(raw / "default/inference/ops", record(), ok)
    other = "fedcba9876543210"
    write_pair(
        raw / "sm1410/training/ops",
        record(op_id=other, setting="sm1410", mode="training"),
        ok,
        other,
    )
    failed = record(
        op_id="00000000000000ff",
        status="failed",
        failure_reason="CUDA out of memory: tried to allocate 2.00 GiB",
        iterations=None,
        total_time_s=None,
    )
    write_pair(
        raw / "default/inference/ops", failed, ["# no power log: job failed"], "00000000000000ff"
    )
    write_pair(raw / "default/inference/networks", network_record(), ok, "resnet18_32x3x224x224")
    cpu = network_record(model_input="vgg11_1x3x32x32", device="cpu", power_available=False)
    write_pair(raw / "default/inference/networks", cpu, ["# no power log: cpu"], "vgg11_1x3x32x32")


def test_evaluate_gpu_splits_dataset_and_failures(tmp_path):
    raw = tmp_path / "results/raw/h100"
    build_tree(raw)
    dataset, failures = evaluate_gpu(raw, "h100")
    assert list(dataset.columns) == list(DATASET_COLUMNS)
    assert list(failures.columns) == list(FAILURE_COLUMNS)
    assert len(dataset) == 4
    assert set(dataset["status"]) == {"ok"}
    assert sorted(dataset["op_id"].dropna()) == [OP_ID, "fedcba9876543210"]
    assert sorted(dataset["model_input"].dropna()) == ["resnet18_32x3x224x224", "vgg11_1x3x32x32"]
    networks = dataset[dataset["kind"] == "network"]
    assert networks["op_type"].isna().all()
    assert networks["spec"].isna().all()
    cpu = dataset[dataset["model_input"] == "vgg11_1x3x32x32"].iloc[0]
    assert math.isnan(cpu["power_w"])
    assert math.isnan(cpu["energy_j"])
    gpu_rows = dataset[dataset["device"] == "cuda"]
    expected_w = np.mean([250.0 + i % 7 for i in range(51)])
    np.testing.assert_allclose(gpu_rows["power_w"], expected_w, rtol=1e-12)
    assert len(failures) == 1
    failure = failures.iloc[0]
    assert failure["op_id"] == "00000000000000ff"
    assert failure["failure_reason"].startswith("CUDA out of memory")
    assert failure["json_path"].endswith("default/inference/ops/00000000000000ff.json")
    assert pd.isna(failure["model_input"])


def test_a_misplaced_json_is_an_error(tmp_path):
    raw = tmp_path / "h100"
    ok = [HEADER] + [log_line(START_UNIX_S + POLL_S * i, 250.0) for i in range(51)]
    write_pair(raw / "default/training/ops", record(mode="inference"), ok)
    with pytest.raises(EvaluationError, match=r"mode='inference', not 'training'"):
        evaluate_gpu(raw, "h100")


def test_write_dataset_round_trips_and_leaves_no_temporary_file(tmp_path):
    raw = tmp_path / "raw/h100"
    build_tree(raw)
    dataset, failures = evaluate_gpu(raw, "h100")
    out = tmp_path / "results/dataset/h100.parquet"
    failed = tmp_path / "results/dataset/h100.failed.parquet"
    write_dataset(dataset, failures, out, failed)
    pd.testing.assert_frame_equal(pd.read_parquet(out), dataset, check_dtype=False)
    pd.testing.assert_frame_equal(pd.read_parquet(failed), failures, check_dtype=False)
    assert sorted(p.name for p in out.parent.iterdir()) == ["h100.failed.parquet", "h100.parquet"]


def test_empty_gpu_gives_empty_tables_with_all_columns(tmp_path):
    (tmp_path / "h100").mkdir()
    dataset, failures = evaluate_gpu(tmp_path / "h100", "h100")
    assert dataset.empty
    assert list(dataset.columns) == list(DATASET_COLUMNS)
    assert failures.empty
    assert list(failures.columns) == list(FAILURE_COLUMNS)


def test_dataset_columns_are_those_declared_in_schemas():
    assert tuple(DATASET_COLUMNS) == opcost.schemas.DATASET.names
    assert tuple(FAILURE_COLUMNS) == opcost.schemas.FAILED.names
