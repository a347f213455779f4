"""Tests for opcost.sweep and opcost.sweep_record: the proportionality fit, the run grid,
the power-trace schedule, and the sweeps on the CPU and against the fake nvidia-smi (a
replayed H100 log).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from opcost import device_lock, nvsmi_logger
from opcost.config import ConfigError, load_schema, load_study_file
from opcost.harness import HarnessOptions, Workload
from opcost.sweep import (
    PowerTrace,
    SweepConfig,
    SweepError,
    fit_proportionality,
    gpu_config,
    power_trace_schedule,
    proportionality_table,
    read_power_trace,
    read_record,
    run_power_trace,
    run_proportionality,
    sweep_gpu,
    sweep_op,
)

REPO = Path(__file__).resolve().parents[1]
FAKES = REPO / "tests" / "fakes"
FAKE_UUID = "GPU-57781e38-0b78-5d74-ed7b-e2db6ddbacd3"  # tests/fakes/README.md
TINY = SweepConfig.from_config(
    {
        "input": [2, 3, 32, 32],
        "shortest_run_s": 1e-4,
        "longest_run_s": 0.012,
        "points": 6,
        "short_points": 1,
        "repeats": 2,
        "idle_s": 0.05,
        "run_s": 0.02,
        "cycles": 2,
        "overlay_runs": 2,
    }
)
CPU = gpu_config("cpu", {"device": "cpu", "tf32": True, "dtype": "float32"})
PROFILE = {"min_run_time_s": 0.02, "warmup_s": 0.005, "block_size": 0, "max_block_size": 4}


# --- the fit (thesis 3.2.3) ------------------------------------------------------------


def test_fit_recovers_slope_and_finds_the_broken_short_runs():
    # 12 proportional runs at a = 2 ms with ±0.1 % scatter, 2 short runs with a 1 ms
    # fixed cost on top (+50 % and +10 %): the fit set is the 12 (= 6/7 of 14).
    n = np.array([1, 5, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100, 1200])
    scatter = np.array([0, 0, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1]) * 1e-3
    t = 2e-3 * n * (1 + scatter)
    t[:2] += 1e-3
    fit = fit_proportionality(n, t)
    assert fit.fitted.tolist() == [False, False] + [True] * 12
    nf, tf = n[2:], t[2:]
    slope = np.sum(nf / tf) / np.sum(nf**2 / tf**2)  # minimum of Σ ((t - aN) / t)²
    assert fit.time_per_iteration_s == pytest.approx(slope, rel=1e-12)
    residual = t / (slope * n) - 1
    assert fit.sigma_rel == pytest.approx(np.std(residual[2:], ddof=1), rel=1e-9)
    assert fit.outlier.tolist() == [True, True] + [False] * 12
    assert fit.threshold_s == pytest.approx(t[1])


def test_fit_without_outliers_has_no_threshold():
    n = np.arange(1, 15) * 100
    fit = fit_proportionality(n, 1e-3 * n)
    assert not fit.outlier.any()
    assert math.isnan(fit.threshold_s)


def test_fit_needs_enough_positive_measurements():
    with pytest.raises(SweepError, match="too few"):
        fit_proportionality([1, 2], [1.0, 2.0])
    with pytest.raises(SweepError, match="positive"):
        fit_proportionality([1, 2, 3, 4], [1.0, 0.0, 3.0, 4.0])


# --- the grid ---------------------------------------------------------------------------


def test_default_grid_puts_six_sevenths_of_the_runs_in_the_linear_part():
    cfg = SweepConfig.from_config()
    times = cfg.run_times_s()
    assert len(times) == cfg.points + cfg.short_points == 28
    assert times == sorted(times)
    assert times[0] == pytest.approx(cfg.shortest_run_s)
    assert times[-1] == pytest.approx(cfg.longest_run_s)
    linear = times[cfg.short_points :]
    assert np.diff(linear) == pytest.approx(cfg.longest_run_s / cfg.points)
    assert math.ceil(6 / 7 * len(times)) == cfg.points  # the thesis's fit set
    short = np.array(times[: cfg.short_points + 1])
    ratios = short[1:] / short[:-1]
    assert ratios == pytest.approx(ratios[0])  # geometric up to the linear part


def test_config_rejects_unknown_keys_and_bad_values():
    with pytest.raises(ConfigError, match="unknown keys"):
        SweepConfig.from_config({"pionts": 3})
    with pytest.raises(ConfigError, match="shortest_run_s"):
        SweepConfig.from_config({"shortest_run_s": 2.0, "longest_run_s": 1.0})
    with pytest.raises(ConfigError, match="points"):
        SweepConfig.from_config({"points": 1})
    assert SweepConfig.from_config(None) == SweepConfig.from_config({})
    assert SweepConfig.from_config({"input": [1, 3, 8, 8]}).input == (1, 3, 8, 8)


def test_defaults_are_the_config_schemas():
    # The schema's documented defaults (src/opcost/config.schema.yaml, `sweep`).
    cfg = SweepConfig.from_config()
    assert (cfg.gpu, cfg.model, cfg.input, cfg.op_index, cfg.mode) == (
        None,
        "resnet18",
        (32, 3, 224, 224),
        0,
        "inference",
    )
    assert (cfg.shortest_run_s, cfg.longest_run_s, cfg.points, cfg.short_points) == (
        1e-5,
        1.0,
        24,
        4,
    )
    assert (cfg.repeats, cfg.idle_s, cfg.run_s, cfg.cycles, cfg.overlay_runs) == (3, 2.0, 2.0, 3, 5)


def test_defaults_live_only_in_the_schema(monkeypatch):
    # A default changed in the schema (as opcost.config loads it) changes the sweep's.
    schema = copy.deepcopy(load_schema())
    schema["properties"]["sweep"]["properties"]["points"]["default"] = 12
    monkeypatch.setattr("opcost.config.load_schema", lambda: schema)
    assert SweepConfig.from_config().points == 12
    assert SweepConfig.from_config({"points": 5}).points == 5


def test_sweep_gpu_is_the_first_unless_named():
    study = load_study_file(REPO / "tests/data/configs/tiny.yaml", check_models=False)
    assert sweep_gpu(study, SweepConfig.from_config()) == "cpu"
    with pytest.raises(ConfigError, match="sweep.gpu"):
        sweep_gpu(study, SweepConfig.from_config({"gpu": "h100"}))


def test_sweep_op_is_the_networks_first_layer():
    op_id, spec = sweep_op(TINY)
    assert spec["type"] == "torch.nn.modules.conv.Conv2d"
    assert spec["inputs"][0]["shape"] == [2, 3, 32, 32]
    assert len(op_id) == 16
    with pytest.raises(SweepError, match="op_index"):
        sweep_op(dataclasses.replace(TINY, op_index=10_000))


# --- the power-trace schedule -----------------------------------------------------------


class FakeClock:
    """time.time and time.sleep that advance a counter instead of waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_schedule_alternates_idle_and_runs_then_runs_back_to_back(monkeypatch):
    clock = FakeClock()
    calls = []

    def step() -> None:
        calls.append(clock.now)
        clock.now += 0.001

    monkeypatch.setattr("opcost.harness.time.time", clock.time)
    monkeypatch.setattr("opcost.harness.time.perf_counter", clock.time)
    workload = Workload(step=step, block_size=1, backward=False, inplace_substituted=False)
    opts = HarnessOptions(min_run_time_s=1.0, warmup_s=0.0)
    cfg = dataclasses.replace(TINY, cycles=3, overlay_runs=5, idle_s=2.0, run_s=0.05)
    events = power_trace_schedule(workload, opts, cfg, sleep=clock.sleep, clock=clock.time)
    phases = [(e["part"], e["phase"]) for e in events]
    assert (
        phases
        == [("alternating", "idle"), ("alternating", "run")] * 3
        + [("alternating", "idle")]
        + [("overlay", "run")] * 5
    )
    for e in events:
        assert e["end_unix_s"] >= e["start_unix_s"]
        if e["phase"] == "idle":
            assert e["end_unix_s"] - e["start_unix_s"] == pytest.approx(2.0)
        else:
            # run_s replaces the harness's min_run_time_s; the timed region is inside the run.
            assert e["total_time_s"] >= 0.05
            assert e["start_unix_s"] <= e["timed_start_unix_s"] <= e["timed_end_unix_s"]
            assert e["timed_end_unix_s"] <= e["end_unix_s"]
    overlay = [e for e in events if e["part"] == "overlay"]
    for before, after in zip(overlay, overlay[1:], strict=False):
        assert after["start_unix_s"] == pytest.approx(before["end_unix_s"])  # back to back


# --- the sweeps on the CPU --------------------------------------------------------------


def test_proportionality_sweep_on_the_cpu(tmp_path):
    path = tmp_path / "proportionality.json"
    record = run_proportionality(CPU, PROFILE, TINY, path)
    assert read_record(path, "proportionality") == json.loads(path.read_text())
    assert record["device"] == "cpu"
    assert record["op_type"] == "torch.nn.modules.conv.Conv2d"
    table = proportionality_table(record)
    assert len(table) == (TINY.points + TINY.short_points) * TINY.repeats
    # The harness times blocks until they reach the requested minimum run time.
    assert (table["total_time_s"] >= table["min_run_time_s"]).all()
    for m in record["measurements"]:
        assert m["iterations"] == len(m["block_times_s"]) * m["number_per_run"]
        assert m["total_time_s"] == pytest.approx(math.fsum(m["block_times_s"]))
    with pytest.raises(SweepError, match="power_trace"):
        read_record(path, "power_trace")


@pytest.mark.parametrize("sweep", ["proportionality", "power_trace"])
def test_a_sweep_waits_for_its_device(tmp_path, monkeypatch, sweep):
    # A profiling job (here: a thread holding the lock) has the device: the sweep waits.
    monkeypatch.setenv("OPCOST_LOCK_DIR", str(tmp_path / "locks"))
    held, release = threading.Event(), threading.Event()

    def hold():
        with device_lock.exclusive("cpu"):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    threading.Timer(1.0, release.set).start()
    if sweep == "proportionality":
        record = run_proportionality(CPU, PROFILE, TINY, tmp_path / "p.json")
    else:
        record = run_power_trace(CPU, PROFILE, TINY, tmp_path / "t.csv", tmp_path / "t.json")
    holder.join()
    assert record["device_lock_wait_s"] >= 0.9


def test_power_trace_on_the_cpu_is_time_only(tmp_path):
    record = run_power_trace(CPU, PROFILE, TINY, tmp_path / "t.csv", tmp_path / "t.json")
    assert record["power_available"] is False
    assert (tmp_path / "t.csv").read_text().startswith("# no power log")
    trace = read_power_trace(tmp_path / "t.csv", tmp_path / "t.json")
    assert trace.samples is None
    assert len(trace.events) == 2 * TINY.cycles + 1 + TINY.overlay_runs


@pytest.fixture
def fake_nvidia_smi(monkeypatch):
    """The fake nvidia-smi first on PATH, in a time zone two hours ahead of UTC."""
    python_dir = Path(sys.executable).parent
    monkeypatch.setenv("PATH", os.pathsep.join([str(FAKES), str(python_dir), os.environ["PATH"]]))
    for name in ("FAKE_NVSMI_MODE", "FAKE_NVSMI_LOG", "FAKE_NVSMI_NA_FIELDS", "FAKE_NVSMI_CALLS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TZ", "Etc/GMT-2")  # POSIX sign: UTC+2
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_power_trace_with_the_fake_nvidia_smi(tmp_path, fake_nvidia_smi):
    fields = ["timestamp", "power.draw", "power.draw.instant", "clocks.sm"]

    @contextlib.contextmanager
    def fake_log(csv_path, device, setting, profile_config, record):
        record.update(power_available=True, power_fields=fields, power_interval_ms=20)
        with nvsmi_logger.PowerLogger(csv_path, FAKE_UUID, fields, 20, start_grace_s=0.5):
            yield lambda: None

    cfg = dataclasses.replace(TINY, idle_s=0.3, run_s=0.2)
    record = run_power_trace(
        CPU, PROFILE, cfg, tmp_path / "t.csv", tmp_path / "t.json", power_log=fake_log
    )
    assert record["utc_offset_s"] == 7200
    trace = read_power_trace(tmp_path / "t.csv", tmp_path / "t.json")
    assert isinstance(trace, PowerTrace)
    assert trace.power_field == "power.draw.instant"
    # The log's local timestamps, shifted back by two hours, fall within the job.
    assert trace.samples["unix_s"].min() >= record["started_unix_s"] - 1
    assert trace.samples["unix_s"].max() <= record["finished_unix_s"] + 1
    for run in trace.events[trace.events["phase"] == "run"].itertuples():
        inside = trace.samples["unix_s"].between(run.start_unix_s, run.end_unix_s)
        assert inside.sum() >= 3  # 20 ms polling over runs of 0.2 s and more
    # The replayed recording starts at 80.05 W (tests/data/h100_probe/trace.csv, row 1).
    assert trace.samples["power_w"].iloc[0] == pytest.approx(80.05)
