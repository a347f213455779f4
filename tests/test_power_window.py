"""Power windows between two changes of NVML's energy counter (opcost.power_window), on a
virtual clock and counter, and the real H100 windows of tests/data/power_window_edges."""

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from opcost import harness, opspace
from opcost import opspace_measure as om
from opcost import power_window as pw
from opcost.nvml import NvmlError

REPO = Path(__file__).resolve().parents[1]


class _VirtualTime:
    """A clock that only steps advance (``step_s`` each), as ``time`` for opspace_measure,
    and an energy counter of a device drawing 100 W that updates every ``interval_s``, as
    NVML's does every 100 ms: mJ = 1e5 x the time of its last update."""

    def __init__(self, start_s: float, step_s: float, interval_s: float) -> None:
        self.now, self.step_s, self.interval_s = start_s, step_s, interval_s

    def perf_counter(self) -> float:
        return self.now

    def read_mj(self) -> int:
        return round(1e5 * self.interval_s * math.floor(self.now / self.interval_s))

    def stepping(self, workload):
        step = workload.step

        def timed_step():
            step()
            self.now += self.step_s

        workload.step = timed_step
        return workload


class _StuckCounter:
    def read_mj(self):
        return 1234


def _softmax_workload():
    params = {"type": "function", "batch": 1, "heads": 1, "rows": 4, "cols": 16}
    opts = harness.HarnessOptions(device="cpu")
    return harness.prepare_op(opspace.build("softmax", params), opts)


@pytest.mark.parametrize("start_s", [0.0, 0.0137, 0.0199])
def test_a_power_window_runs_between_two_updates_of_the_counter(monkeypatch, start_s):
    """Steps of 1 ms, a counter updated every 20 ms: read at two arbitrary times, a 0.4-s
    window holds up to 20 ms of energy too much or too little at each end (up to 5 %);
    between two of its changes, each seen within a block of 2 ms, its power is within
    0.6 %, and its time per call is the steps'."""
    clock = _VirtualTime(start_s, step_s=1e-3, interval_s=0.02)
    monkeypatch.setattr(pw, "time", clock)
    monkeypatch.setattr(om, "POWER_WINDOW_S", 0.4)
    monkeypatch.setattr(pw, "BLOCK_S", 2e-3)
    workload = clock.stepping(_softmax_workload())
    row = om._power_window(workload, torch.device("cpu"), clock, step_gpu_s=1e-3)
    assert row["power_graphed"] is False  # no CUDA graph on a CPU: run eagerly
    # From the first change to the last in a 0.4-s loop: 18 to 20 update intervals.
    assert 0.36 - 2e-3 < row["power_window_s"] < 0.40 + 2e-3
    assert row["power_w"] == pytest.approx(100, rel=0.006)
    assert row["power_time_s"] == pytest.approx(1e-3)


@pytest.mark.parametrize(("step_s", "steps"), [(1e-3, 20), (0.3e-3, 67), (1e-7, 1000), (0.5, 1)])
def test_a_power_window_reads_the_counter_every_20_ms_of_steps(step_s, steps):
    assert pw.BLOCK_S == 20e-3
    assert pw.block_steps(step_s) == steps


def test_a_counter_that_does_not_change_fails_the_power_window(monkeypatch):
    monkeypatch.setattr(om, "POWER_WINDOW_S", 0.02)
    monkeypatch.setattr(pw, "TIMEOUT_S", 0.05)
    with pytest.raises(NvmlError, match="changed 0 times"):
        om._power_window(_softmax_workload(), torch.device("cpu"), _StuckCounter(), 1e-5)


def test_the_committed_edge_windows_repeat_and_agree_with_longer_ones():
    """The real H100 windows of tests/data/power_window_edges: between two changes of the
    counter, a 1-s window repeats better than one between two arbitrary reads and agrees
    with a 2-s one; the arbitrary reads give less power (their first read holds the
    energy up to an update before the loop started)."""
    t = pd.read_parquet(REPO / "tests/data/power_window_edges/h100.parquet")
    assert t["gpu_name"].eq("NVIDIA H100 80GB HBM3").all()
    wide = t.pivot_table(index=["op_id", "mode", "window"], columns="pass", values="power_w")
    spread = (wide[1] / wide[2] - 1).abs().groupby(level="window").quantile(0.9)
    assert spread["edges-1.0"] < 0.03 < spread["free-1.0"]
    mean = t.pivot_table(index=["op_id", "mode"], columns="window", values="power_w")
    assert (mean["edges-1.0"] / mean["edges-2.0"]).median() == pytest.approx(1, abs=0.01)
    assert (mean["free-1.0"] / mean["edges-2.0"]).median() < 0.99
    # The same calls per second in both: the reads did not leave the GPU idle.
    per_call = t.pivot_table(index=["op_id", "mode"], columns="window", values="power_time_s")
    assert (per_call["edges-1.0"] / per_call["free-1.0"]).median() == pytest.approx(1, abs=0.01)


def test_a_window_times_its_steps_by_blocks_between_its_two_ends(monkeypatch):
    """Steps of exactly 1 ms in blocks of 5: every block between the window's ends takes
    5 ms, so the time per step is 1 ms with no spread; the steps are whole blocks."""
    clock = _VirtualTime(0.0071, step_s=1e-3, interval_s=0.1)
    monkeypatch.setattr(pw, "time", clock)
    monkeypatch.setattr(pw, "BLOCK_S", 5e-3)
    workload = clock.stepping(_softmax_workload())
    window = pw.counter_window(workload, torch.device("cpu"), clock.read_mj, 1.0)
    assert window.block == 5
    assert window.steps == 5 * len(window.block_times_s)
    assert window.block_times_s == pytest.approx([5e-3] * len(window.block_times_s))
    assert window.step_s == pytest.approx(1e-3)
    assert window.sigma_step_s == pytest.approx(0, abs=1e-12)
    # Nine or ten updates of 100 ms between the first change seen and the last.
    assert 0.9 - 5e-3 < window.window_s < 1.0 + 5e-3
    assert window.power_w == pytest.approx(100, rel=0.006)


def test_the_committed_graph_windows_repeat_better_between_two_changes():
    """The real H100 networks of tests/data/power_window_edges/h100_graphs.parquet, replayed
    from CUDA graphs: the same time either way, but the power of a window between two
    changes of the counter repeats within 2 % where one between two reads did not."""
    t = pd.read_parquet(REPO / "tests/data/power_window_edges/h100_graphs.parquet")
    assert len(t) == 2 * 2 * 2 * 2 * 2  # networks, batches, modes, windows, passes
    keys = ["model", "batch", "mode", "window"]
    wide = t.pivot_table(index=keys, columns="pass", values=["power_w", "time_s"])
    power = (wide[("power_w", 1)] / wide[("power_w", 2)] - 1).abs()
    assert power.xs("edges", level="window").max() < 0.02
    assert power.xs("free", level="window").max() > 0.05
    mean = t.pivot_table(index=keys[:3], columns="window", values="time_s")
    assert (mean["free"] / mean["edges"]).median() == pytest.approx(1, abs=0.005)
