"""Tests for opcost.powerlog: reading raw nvidia-smi CSVs.

How junk rows ([N/A], [Unknown Error], cut-off lines) are dropped and counted, and how an
unusable log fails naming the file, is tested in tests/test_faults.py, which imports the
log-writing helpers below.
"""

from __future__ import annotations

import csv
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from opcost.powerlog import field_name, read_power_log

PROBE_CSV = Path(__file__).parent / "data" / "h100_probe" / "trace.csv"
HEADER = (
    "timestamp, power.draw [W], power.draw.instant [W], clocks.current.sm [MHz], "
    "clocks.current.memory [MHz], temperature.gpu, utilization.gpu [%]"
)
T0 = datetime(2026, 11, 22, 9, 41, 24, 502000)


def stamp(t: datetime) -> str:
    """nvidia-smi's timestamp format, milliseconds."""
    return t.strftime("%Y/%m/%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def clean_line(i: int, power_w: float) -> str:
    t = T0 + timedelta(milliseconds=20 * i)
    return f"{stamp(t)}, 121.09, {power_w:.2f}, 1980, 2619, 36, 0"


def write(path: Path, lines: list[str], *, final_newline: bool = True) -> Path:
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""))
    return path


def test_field_names_map_back_to_query_names():
    assert field_name(" power.draw.instant [W]") == "power.draw.instant"
    assert field_name("clocks.current.sm [MHz]") == "clocks.sm"
    assert field_name("clocks.current.memory [MHz]") == "clocks.mem"
    assert field_name("temperature.gpu") == "temperature.gpu"
    assert field_name("utilization.gpu [%]") == "utilization.gpu"


def test_real_h100_log_is_read_whole():
    with PROBE_CSV.open(newline="") as f:
        rows = list(csv.reader(f, skipinitialspace=True))
    header, body = rows[0], rows[1:]
    log = read_power_log(PROBE_CSV)
    assert log is not None
    assert log.power_field == "power.draw.instant"
    assert log.n_rows_total == len(body) == 4204
    assert log.n_rows_dropped == 0
    assert list(log.samples.columns) == [
        "timestamp",
        "power.draw",
        "power.draw.instant",
        "clocks.sm",
        "clocks.mem",
        "temperature.gpu",
        "utilization.gpu",
    ]
    instant = np.array([float(r[header.index("power.draw.instant [W]")]) for r in body])
    np.testing.assert_array_equal(log.samples["power.draw.instant"].to_numpy(), instant)
    sm = np.array([float(r[header.index("clocks.current.sm [MHz]")]) for r in body])
    np.testing.assert_array_equal(log.samples["clocks.sm"].to_numpy(), sm)
    last = datetime.strptime(body[-1][0], "%Y/%m/%d %H:%M:%S.%f")
    assert log.samples["timestamp"].iloc[-1] == last


def test_power_draw_is_used_where_instant_is_not_logged(tmp_path):
    lines = [
        "timestamp, power.draw [W], clocks.current.sm [MHz]",
        f"{stamp(T0)}, 55.50, 1410",
        f"{stamp(T0 + timedelta(milliseconds=20))}, 56.25, 1410",
    ]
    log = read_power_log(write(tmp_path / "log.csv", lines))
    assert log is not None
    assert log.power_field == "power.draw"
    np.testing.assert_array_equal(log.samples["power.draw"].to_numpy(), [55.5, 56.25])


def test_a_field_never_numerical_is_not_logged(tmp_path):
    # A GPU that reports [N/A] for power.draw.instant throughout: fall back to power.draw
    # rather than drop every row.
    lines = [
        "timestamp, name, power.draw [W], power.draw.instant [W], clocks.current.sm [MHz]",
        f"{stamp(T0)}, Tesla V100-SXM2-32GB, 55.50, [N/A], 1410",
        f"{stamp(T0 + timedelta(milliseconds=20))}, Tesla V100-SXM2-32GB, 56.25, [N/A], 1410",
    ]
    log = read_power_log(write(tmp_path / "log.csv", lines))
    assert log is not None
    assert log.power_field == "power.draw"
    assert log.n_rows_dropped == 0
    assert list(log.samples.columns) == ["timestamp", "power.draw", "clocks.sm"]


def test_time_only_placeholder_gives_none(tmp_path):
    path = write(tmp_path / "log.csv", ["# no power log: device is cpu"])
    assert read_power_log(path) is None
