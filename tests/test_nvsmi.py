"""The nvidia-smi adapter against the fake nvidia-smi, which replays a real H100 log.

Expected values come from the recorded probe (tests/data/h100_probe/probe.log and
trace.csv), not from the adapter. The ``calls`` fixture is in tests/conftest.py. How the
adapter fails (nvidia-smi missing, exiting early, dying, hanging) is tested in
tests/test_faults.py, its refusal of hostile GPU ids and fields in tests/test_security.py.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pytest
from conftest import recorded

from opcost.nvsmi import (
    DEFAULT_FIELDS,
    GpuListing,
    gpu_info,
    list_gpus,
    supported_fields,
)
from opcost.nvsmi_logger import PowerLogger

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
