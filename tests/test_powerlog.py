"""Tests for opcost.powerlog: reading raw nvidia-smi CSVs, dropping and counting junk rows."""

from __future__ import annotations

import csv
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opcost.powerlog import PowerLogError, field_name, read_power_log

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


def test_junk_rows_are_dropped_and_counted(tmp_path):
    lines = [HEADER, clean_line(0, 100.0), clean_line(1, 101.0)]
    t = stamp(T0 + timedelta(milliseconds=40))
    lines.append(f"{t}, [N/A], [N/A], 1980, 2619, 36, 0")  # power not a number
    lines.append(clean_line(3, 103.0))
    lines.append(f"{t}, 121.09, 102.00, [Unknown Error], 2619, 36, 0")  # a used field
    lines.append("Unable to determine the device handle for GPU0000:00:06.0: Unknown Error")
    lines.append(clean_line(4, 104.0))
    lines.append("2026/13/45 99:99:99.000, 121.09, 102.00, 1980, 2619, 36, 0")  # bad time
    lines.append(f"{t}, 121.09, 102.00, 1980, 2619, 36, [N/A]")  # unused field: kept
    lines.append(clean_line(6, 106.0)[:-8])  # cut off mid-line: too few fields
    log = read_power_log(write(tmp_path / "log.csv", lines, final_newline=False))
    assert log is not None
    assert log.n_rows_total == 10
    assert log.n_rows_dropped == 5
    np.testing.assert_array_equal(
        log.samples["power.draw.instant"].to_numpy(), [100.0, 101.0, 103.0, 104.0, 102.0]
    )
    assert np.isnan(log.samples["utilization.gpu"].iloc[-1])


def test_cut_off_last_line_is_dropped_even_when_it_parses(tmp_path):
    # "..., 36, 10" cut from "..., 36, 100": the field count is right but the file has no
    # final newline, so the line cannot be trusted.
    lines = [HEADER, clean_line(0, 100.0), clean_line(1, 101.0), clean_line(2, 999.0)[:-1]]
    log = read_power_log(write(tmp_path / "log.csv", lines, final_newline=False))
    assert log is not None
    assert (log.n_rows_total, log.n_rows_dropped) == (3, 1)
    np.testing.assert_array_equal(log.samples["power.draw.instant"].to_numpy(), [100.0, 101.0])


JUNK = st.sampled_from(
    [
        "{t}, [N/A], [N/A], 1980, 2619, 36, 0",
        "{t}, 121.09, [Unknown Error], 1980, 2619, 36, 0",
        "{t}, 121.09, 90.00, [N/A], 2619, 36, 0",
        "{t}, 121.09, 90.00, 1980, 2619, [Unknown Error], 0",
        "{t}, 121.09",
        "[Unknown Error]",
        "",  # a blank line: ignored, not counted
    ]
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    powers=st.lists(st.floats(10, 700).map(lambda x: round(x, 2)), min_size=1, max_size=40),
    junk=st.lists(st.tuples(st.integers(0, 40), JUNK), max_size=10),
    cut_last=st.booleans(),
)
def test_junk_anywhere_is_dropped_and_counted(tmp_path, powers, junk, cut_last):
    body = [clean_line(i, p) for i, p in enumerate(powers)]
    for position, template in sorted(junk, reverse=True):
        body.insert(min(position, len(body)), template.format(t=stamp(T0)))
    if cut_last:
        body.append(clean_line(len(powers), 555.55)[:-3])
    path = write(tmp_path / "log.csv", [HEADER, *body], final_newline=not cut_last)
    log = read_power_log(path)
    assert log is not None
    n_junk = sum(1 for _, template in junk if template) + cut_last
    assert log.n_rows_total == len(powers) + n_junk
    assert log.n_rows_dropped == n_junk
    np.testing.assert_array_equal(log.samples["power.draw.instant"].to_numpy(), powers)


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


@pytest.mark.parametrize(
    "lines",
    [
        [HEADER],  # header only
        [HEADER, f"{stamp(T0)}, [N/A], [N/A], 1980, 2619, 36, 0"],  # no power at all
        [HEADER, "[Unknown Error]", "[Unknown Error]"],
        [HEADER.replace(" [W]", ""), f"{stamp(T0)}, 121.09 W, 80.05 W, 450 MHz, 2619 MHz, 36, 0"],
        [""],  # empty file
        ["power.draw [W]", "121.09"],  # no timestamp column
    ],
)
def test_unusable_log_fails_naming_the_file(tmp_path, lines):
    path = write(tmp_path / "unusable_log.csv", lines)
    with pytest.raises(PowerLogError, match="unusable_log.csv"):
        read_power_log(path)


def test_missing_log_fails_naming_the_file(tmp_path):
    with pytest.raises(PowerLogError, match="absent.csv"):
        read_power_log(tmp_path / "absent.csv")
