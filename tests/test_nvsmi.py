"""The nvidia-smi adapter against the fake nvidia-smi, which replays a real H100 log.

Expected values come from the recorded probe (tests/data/h100_probe/probe.log and
trace.csv), not from the adapter.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

import pytest

from opcost.nvsmi import (
    DEFAULT_FIELDS,
    GpuListing,
    NvidiaSmiError,
    PowerLogger,
    check_gpu,
    gpu_info,
    list_gpus,
    supported_fields,
)

FAKES = Path(__file__).parent / "fakes"
PROBE = Path(__file__).parent / "data" / "h100_probe"
UUID = "GPU-57781e38-0b78-5d74-ed7b-e2db6ddbacd3"  # from `nvidia-smi -L` in probe.log
# The fields of the recorded trace, in its order (probe.sh).
TRACE_FIELDS = [
    "timestamp",
    "power.draw",
    "power.draw.instant",
    "clocks.sm",
    "clocks.mem",
    "temperature.gpu",
    "utilization.gpu",
]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Put the fake nvidia-smi first on PATH; return the file its calls are recorded in."""
    assert os.access(FAKES / "nvidia-smi", os.X_OK), "tests/fakes/nvidia-smi must be executable"
    # The fake's `#!/usr/bin/env python3` then finds this interpreter (not a slow shim).
    python_dir = Path(sys.executable).parent
    monkeypatch.setenv("PATH", os.pathsep.join([str(FAKES), str(python_dir), os.environ["PATH"]]))
    for name in ("FAKE_NVSMI_MODE", "FAKE_NVSMI_LOG", "FAKE_NVSMI_NA_FIELDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("FAKE_NVSMI_IGNORE_TERM", raising=False)
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_NVSMI_CALLS", str(path))
    return path


def recorded(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for_lines(path: Path, n: int, then_s: float = 0.2) -> None:
    """Wait (at most 5 s) until ``path`` has ``n`` lines, then ``then_s`` more."""
    deadline = time.monotonic() + 5
    while len(path.read_text().splitlines()) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(then_s)


def rows(text: str) -> list[list[str]]:
    return [line.split(", ") for line in text.splitlines()]


def test_power_logger_writes_real_header_and_replayed_rows(calls: Path, tmp_path: Path) -> None:
    path = tmp_path / "raw" / "op.csv"
    with PowerLogger(path, "0", TRACE_FIELDS, interval_ms=20) as logger:
        time.sleep(0.3)
    assert logger.returncode is not None
    size = path.stat().st_size
    time.sleep(0.1)
    assert path.stat().st_size == size, "nvidia-smi still writes after the block ended"

    real = rows((PROBE / "trace.csv").read_text())
    logged = rows(path.read_text())
    assert logged[0] == real[0]  # the real header, units and all
    assert len(logged) >= 3
    for got, want in zip(logged[1:], real[1:], strict=False):
        assert got[1:] == want[1:]
    stamps = [datetime.datetime.strptime(r[0], "%Y/%m/%d %H:%M:%S.%f") for r in logged[1:]]
    assert all(b > a for a, b in zip(stamps, stamps[1:], strict=False))
    assert abs((stamps[0] - datetime.datetime.now()).total_seconds()) < 60

    assert recorded(calls) == [
        [
            "--query-gpu=" + ",".join(TRACE_FIELDS),
            "--format=csv,nounits",
            "-lms",
            "20",
            "-i",
            "0",
            "-f",
            str(path),
        ]
    ]


def test_power_logger_passes_bad_rows_through_untouched(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVSMI_MODE", "na_rows")
    path = tmp_path / "op.csv"
    with PowerLogger(path, UUID, TRACE_FIELDS, interval_ms=5):
        wait_for_lines(path, 8, then_s=0.0)
    logged = rows(path.read_text())
    # Data row 5 reads [N/A], row 7 [Unknown Error] for the power fields (fakes/README.md).
    assert logged[5][1:3] == ["[N/A]", "[N/A]"]
    assert logged[7][1:3] == ["[Unknown Error]", "[Unknown Error]"]
    assert logged[4][1:3] == ["121.09", "80.05"]


def test_exit_early_is_reported_with_code_and_message(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVSMI_MODE", "exit_early")
    logger = PowerLogger(tmp_path / "op.csv", "0", TRACE_FIELDS)
    # It dies 0.2 s after starting: caught at start or, at the latest, when stopped.
    with pytest.raises(NvidiaSmiError, match=r"(exited with|exit) code 1") as info, logger:
        time.sleep(0.6)
    assert "Unknown Error" in str(info.value)


def test_unknown_gpu_fails_at_start(calls: Path, tmp_path: Path) -> None:
    # The grace time covers the fake's Python start-up on a busy test machine.
    logger = PowerLogger(tmp_path / "op.csv", "3", TRACE_FIELDS, start_grace_s=3.0)
    with pytest.raises(NvidiaSmiError, match="code 6.*No devices were found"):
        logger.start()


def test_logger_that_writes_nothing_fails_on_exit(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVSMI_MODE", "hang")
    path = tmp_path / "op.csv"
    # A stale file from an earlier attempt must not pass for a log of this measurement.
    path.write_text("timestamp, power.draw [W]\n2026/11/22 09:41:24.502, 121.09\n")
    logger = PowerLogger(path, "0", ["timestamp", "power.draw"])
    with pytest.raises(NvidiaSmiError, match="no power sample"), logger:
        time.sleep(0.3)
    assert logger.returncode is not None


def test_log_is_complete_after_stop_although_nvidia_smi_buffers(
    calls: Path, tmp_path: Path
) -> None:
    """Like the real one, the fake writes nothing to -f until 4 KiB or its exit."""
    path = tmp_path / "op.csv"
    with PowerLogger(path, "0", TRACE_FIELDS, interval_ms=20):
        time.sleep(0.5)
        assert path.stat().st_size == 0
    rows = path.read_text().splitlines()
    assert rows[0].startswith("timestamp, power.draw [W]")
    assert len(rows) >= 10


def test_logger_that_dies_midway_fails_on_exit(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVSMI_MODE", "die_midway")
    path = tmp_path / "op.csv"
    logger = PowerLogger(path, "0", TRACE_FIELDS, interval_ms=60)
    with pytest.raises(NvidiaSmiError, match="on its own.*GPU is lost"), logger:
        wait_for_lines(path, 11)
    # The fake dies after 10 rows; the log keeps exactly what it wrote.
    assert len(path.read_text().splitlines()) == 11


def test_early_death_is_added_to_the_body_error(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVSMI_MODE", "die_midway")
    path = tmp_path / "op.csv"

    def measure() -> None:
        with PowerLogger(path, "0", TRACE_FIELDS, interval_ms=60):
            wait_for_lines(path, 11)
            _ = 1 / 0

    with pytest.raises(ZeroDivisionError) as info:
        measure()
    assert any("on its own" in note for note in info.value.__notes__)


def test_logger_ignoring_sigterm_is_killed(
    calls: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVSMI_IGNORE_TERM", "1")
    logger = PowerLogger(tmp_path / "op.csv", "0", TRACE_FIELDS, stop_timeout_s=0.3)
    # Killed, it cannot write out its buffer: the log is empty, and that is an error.
    with pytest.raises(NvidiaSmiError, match="no power sample"), logger:
        pass
    assert logger.returncode == -9


def test_missing_binary_suggests_cpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    for call in (
        lambda: PowerLogger(tmp_path / "op.csv", "0", TRACE_FIELDS).start(),
        lambda: supported_fields("0"),
        lambda: gpu_info("0"),
    ):
        with pytest.raises(NvidiaSmiError, match="not found.*device: cpu"):
            call()


def test_supported_fields_all_on_h100(calls: Path) -> None:
    assert supported_fields("0") == list(DEFAULT_FIELDS)


def test_supported_fields_drops_invalid_field(calls: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVSMI_MODE", "no_instant")
    want = [f for f in DEFAULT_FIELDS if f != "power.draw.instant"]
    assert supported_fields(UUID) == want
    queries = [c[0] for c in recorded(calls)]
    assert queries == ["--query-gpu=" + ",".join(DEFAULT_FIELDS), "--query-gpu=" + ",".join(want)]


def test_supported_fields_drops_na_field(calls: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVSMI_NA_FIELDS", "power.limit,clocks.current.memory")
    assert supported_fields("0", ["timestamp", "power.draw", "clocks.mem", "power.limit"]) == [
        "timestamp",
        "power.draw",
    ]


def test_gpu_info_matches_probe(calls: Path) -> None:
    info = gpu_info("0")
    # Values of the one-shot query in probe.log.
    assert info.name == "NVIDIA H100 80GB HBM3"
    assert info.uuid == UUID
    assert info.driver_version == "580.159.04"
    assert (info.power_limit_w, info.power_min_limit_w, info.power_max_limit_w) == (
        700.0,
        200.0,
        700.0,
    )
    assert info.power_default_limit_w == 700.0
    assert info.max_sm_clock_mhz == 1980
    clocks = info.supported_sm_clocks_mhz
    assert clocks[:4] == (1980, 1965, 1950, 1935)  # head of --query-supported-clocks
    assert all(a > b for a, b in zip(clocks, clocks[1:], strict=False))


def test_list_gpus(calls: Path) -> None:
    assert list_gpus() == [GpuListing(0, "NVIDIA H100 80GB HBM3", UUID)]


@pytest.mark.parametrize(
    "gpu", ["0;rm -rf /", "-1", "01", " 0", "GPU-57781E38-0B78-5D74-ED7B-E2DB6DDBACD3", "", 0]
)
def test_check_gpu_refuses(gpu: object) -> None:
    with pytest.raises(NvidiaSmiError):
        check_gpu(gpu)


@pytest.mark.parametrize("fields", [["power.draw,clocks.sm"], ["--help"], [], "power.draw"])
def test_malformed_fields_refused_before_any_call(
    calls: Path, tmp_path: Path, fields: list[str]
) -> None:
    with pytest.raises(NvidiaSmiError):
        PowerLogger(tmp_path / "op.csv", "0", fields)
    assert recorded(calls) == []
