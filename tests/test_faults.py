"""Reliability, faults: what goes wrong outside the code, and what the pipeline does then.

Issue #8, category 2. Per case, the guard (file:function) it checks.

nvidia-smi (against the fake, tests/fakes/nvidia-smi; the job fails naming the cause):

- missing: nvsmi.py:nvidia_smi_path (``test_missing_binary_suggests_cpu``)
- exits at start (unknown GPU, lost driver): nvsmi_logger.py:PowerLogger._watch_start
  (``test_unknown_gpu_fails_at_start``, ``test_exit_early_is_reported_with_code_and_message``)
- dies midway, so the log ends before the measurement: nvsmi_logger.py:PowerLogger.stop
  (``test_logger_that_dies_midway_fails_on_exit``, ``test_early_death_is_added_to_the_body_error``)
- writes no sample (hung driver), or ignores SIGTERM: nvsmi_logger.py:PowerLogger._check_written
  and ._terminate (``test_logger_that_writes_nothing_fails_on_exit``,
  ``test_logger_ignoring_sigterm_is_killed``)
- prints ``[N/A]`` / ``[Unknown Error]`` rows: the raw CSV keeps them untouched
  (``test_power_logger_passes_bad_rows_through_untouched``); reading drops and counts them:
  powerlog.py:read_power_log (``test_junk_rows_are_dropped_and_counted``,
  ``test_cut_off_last_line_is_dropped_even_when_it_parses``,
  ``test_junk_anywhere_is_dropped_and_counted``); the counts reach the dataset row:
  evaluate.py:evaluate_measurement (``test_junk_rows_are_counted_in_the_row``)
- never a plausible empty result: a log without a usable row, or with none in the timed
  window, or missing, fails naming the file: powerlog.py:read_power_log
  (``n_usable == 0``; ``test_unusable_log_fails_naming_the_file``,
  ``test_missing_log_fails_naming_the_file``), method.py:power_columns
  (``test_no_row_in_window_fails_naming_the_file``), evaluate.py:evaluate_measurement
  (``test_power_log_missing_for_a_power_measurement_fails``,
  ``test_an_unusable_log_fails_the_gpu_naming_the_file``)

A profiling job:

- an op out of GPU memory, or one that cannot run here, is recorded ``status: failed`` and
  the job succeeds: profile.py:profile_job (``except (RuntimeError, ...)``) and
  profile.py:_op_cannot_run (``test_out_of_memory_is_recorded_as_failed_and_the_job_succeeds``,
  ``test_op_that_cannot_run_here_is_recorded_as_failed``); any other error fails the job
  (``test_other_errors_fail_the_job_loudly``)
- killed (SIGTERM, SIGKILL) mid-measurement, it leaves no final output: profile.py:_power_log
  (temporary CSV) and opcost.io.staged_path
  (``test_job_killed_mid_measurement_leaves_no_final_output``)
- a changed GPU setting is restored: after an error, gpu_setting.py:applied_setting
  (``test_wrapper_resets_after_error_in_block``,
  ``test_failed_apply_still_resets_and_keeps_marker``);
  on SIGTERM, its ``on_sigterm`` handler (``test_sigterm_mid_setting_resets``,
  ``test_sigterm_unwinds``); after SIGKILL, by the next job from the marker:
  gpu_setting.py:recover_stale_setting (``test_sigkill_leaves_marker_and_next_job_recovers``,
  ``test_corrupt_marker_is_treated_as_stale``); for a thread that never finished, at exit
  (``test_setting_held_by_abandoned_thread_is_reset_at_exit``); a missing script says what
  to do (``test_missing_command_says_what_to_do``)
- a job on another GPU than its configuration names (``gpus.<name>.gpu_name``) measures
  nothing and fails naming both: profile.py:check_gpu_name, called by profiling, trace
  and op-space jobs (``test_a_job_on_another_gpu_than_its_configuration_measures_nothing``)
- a second job on a GPU whose setting a running job holds is refused:
  gpu_setting.py:recover_stale_setting (``_owner_alive``;
  ``test_marker_of_running_process_is_not_stale``)

The pipeline (Snakemake on the CPU):

- an op out of memory: the study goes on, the op and the network are listed in
  ``results/dataset/{gpu}.failed.parquet`` with the reason: profile.py:profile_job and
  evaluate.py:evaluate_files (``test_out_of_memory_study_goes_on_and_lists_the_failure``);
  in the Snakemake report: not yet (``test_failure_table_is_in_the_report``, an expected
  failure until a rule writes ``results/dataset/{gpu}.failed.csv`` marked for the report;
  see docs/reliability.md)
- raw logs are write-protected and a forced rerun refuses to overwrite them (as root,
  which Snakemake lets write anyway, only the modes are checked):
  workflow/rules/profile.smk ``protected(...)``
  (``test_raw_logs_are_write_protected_and_a_rerun_refuses_to_overwrite``)
- a run killed mid-profiling resumes and completes, keeping what was measured
  (``test_run_killed_mid_profiling_resumes_and_completes``)
- two profiling jobs never share a GPU: the ``gpu=1`` resource of the profile rules and
  the default profile, and the per-GPU lock of each job (opcost.device_lock, tested in
  tests/test_device_lock.py) (``test_profiling_jobs_never_overlap_without_resources_flag``)
- a SLURM job that hits its time limit is retried with a longer runtime: in
  tests/test_slurm_toy.py (needs a running SLURM controller)
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import as_ordinary_user, changes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_evaluate import (
    HEADER as EVALUATE_HEADER,
)
from test_evaluate import (
    OP_ID,
    POLL_S,
    START_UNIX_S,
    build_tree,
    log_line,
    record,
    write_pair,
)
from test_evaluate_h100 import by_hand
from test_harness import CONV_SPEC, _job
from test_nvsmi import TRACE_FIELDS, UUID, rows
from test_powerlog import HEADER, T0, clean_line, stamp, write
from test_workflow import snakemake, snakemake_argv, snakemake_env

from opcost import harness
from opcost.evaluate import EvaluationError, evaluate_gpu, evaluate_measurement
from opcost.gpu_setting import (
    GpuSettingError,
    applied_setting,
    marker_path,
    recover_stale_setting,
    sigterm_unwinds,
)
from opcost.names import parse_setting
from opcost.nvsmi import NvidiaSmiError, gpu_info, supported_fields
from opcost.nvsmi_logger import PowerLogger
from opcost.powerlog import PowerLogError, read_power_log

COMMAND = (sys.executable, "-m", "opcost.gpu_setting_script")
LOCK_1410 = ["-i", "0", "-lgc", "1410,1410"]
RESET = [["-i", "0", "-rgc"], ["-i", "0", "-pl", "700"]]


# --- nvidia-smi fails ----------------------------------------------------------------------


def wait_for_lines(path: Path, n: int, then_s: float = 0.2) -> None:
    """Wait (at most 5 s) until ``path`` has ``n`` lines, then ``then_s`` more."""
    deadline = time.monotonic() + 5
    while len(path.read_text().splitlines()) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(then_s)


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


# --- bad rows in a log: dropped and counted, or the log fails ------------------------------


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


@pytest.mark.parametrize(
    "lines",
    [
        [HEADER],  # header only
        [HEADER, f"{stamp(T0)}, [N/A], [N/A], 1980, 2619, 36, 0"],  # no power at all
        [HEADER, "[Unknown Error]", "[Unknown Error]"],
        [HEADER.replace(" [W]", ""), f"{stamp(T0)}, 121.09 W, 80.05 W, 450 MHz, 2619 MHz, 36, 0"],
        [""],  # empty file
        ["power.draw [W]", "121.09"],  # no timestamp column
        # Numbers in every power field, but no row with a valid timestamp: no usable row.
        [HEADER, "2026/13/45 99:99:99.000, 121.09, 80.05, 1980, 2619, 36, 0"],
        [
            HEADER,
            "2026/13/45 99:99:99.000, 121.09, 80.05, 1980, 2619, 36, 0",
            f"{stamp(T0)}, 121.09, 80.05, [Unknown Error], 2619, 36, 0",
        ],
    ],
)
def test_unusable_log_fails_naming_the_file(tmp_path, lines):
    path = write(tmp_path / "unusable_log.csv", lines)
    with pytest.raises(PowerLogError, match="unusable_log.csv"):
        read_power_log(path)


def test_missing_log_fails_naming_the_file(tmp_path):
    with pytest.raises(PowerLogError, match="absent.csv"):
        read_power_log(tmp_path / "absent.csv")


def test_junk_rows_are_counted_in_the_row(tmp_path):
    rec = record(timed_end_unix_s=START_UNIX_S + 0.2)
    lines = [EVALUATE_HEADER] + [log_line(START_UNIX_S + POLL_S * i, 200.0 + i) for i in range(11)]
    lines.insert(3, lines[3].replace("202.00", "[N/A]"))
    lines.insert(6, "[Unknown Error]")
    json_path, csv_path = write_pair(tmp_path, rec, lines)
    csv_path.write_text(csv_path.read_text() + lines[-1][:20])  # cut-off last line
    row = evaluate_measurement(json_path, csv_path)
    assert (row["n_rows_total"], row["n_rows_dropped"], row["n_power_samples"]) == (14, 3, 11)
    assert row["power_unfiltered_w"] == pytest.approx(205.0, rel=1e-12)


def test_no_row_in_window_fails_naming_the_file(tmp_path):
    rec = record()
    lines = [EVALUATE_HEADER] + [log_line(START_UNIX_S + 5 + POLL_S * i, 200.0) for i in range(20)]
    json_path, csv_path = write_pair(tmp_path, rec, lines, name="late_log")
    with pytest.raises(PowerLogError, match=r"late_log\.csv"):
        evaluate_measurement(json_path, csv_path)


def test_power_log_missing_for_a_power_measurement_fails(tmp_path):
    json_path, csv_path = write_pair(tmp_path, record(), None, name="no_csv")
    with pytest.raises(PowerLogError, match=r"no_csv\.json"):
        evaluate_measurement(json_path, None)
    with pytest.raises(PowerLogError, match=r"no_csv\.csv"):
        evaluate_measurement(json_path, csv_path)


def test_an_unusable_log_fails_the_gpu_naming_the_file(tmp_path):
    raw = tmp_path / "h100"
    build_tree(raw)
    bad = raw / "default/inference/ops" / f"{OP_ID}.csv"
    bad.write_text(EVALUATE_HEADER + "\n[Unknown Error]\n")
    with pytest.raises(PowerLogError, match=re.escape(str(bad))):
        evaluate_gpu(raw, "h100")


# --- a profiling job: an op that cannot run, a job killed ----------------------------------


def test_out_of_memory_is_recorded_as_failed_and_the_job_succeeds(tmp_path, monkeypatch):
    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    monkeypatch.setattr(harness, "measure", oom)
    record = _job(tmp_path)
    assert record["status"] == "failed"
    assert "out of memory" in record["failure_reason"]
    assert json.loads((tmp_path / "op.json").read_text())["status"] == "failed"


def test_op_that_cannot_run_here_is_recorded_as_failed(tmp_path):
    # Batch norm in training needs more than one value per channel.
    spec = {
        "kind": "module",
        "type": "torch.nn.modules.batchnorm.BatchNorm2d",
        "attrs": {
            "num_features": 4,
            "eps": 1e-5,
            "momentum": 0.1,
            "affine": True,
            "track_running_stats": True,
        },
        "args": [{"__tensor__": 0}],
        "kwargs": {},
        "inputs": [{"shape": [1, 4, 1, 1], "dtype": "float32", "param": False}],
        "outputs": [{"shape": [1, 4, 1, 1], "dtype": "float32"}],
    }
    record = _job(tmp_path, spec=spec, mode="training")
    assert record["status"] == "failed"
    assert "more than 1 value per channel" in record["failure_reason"]


def test_other_errors_fail_the_job_loudly(tmp_path, monkeypatch):
    class Broken(Exception):
        pass

    def broken(*args, **kwargs):
        raise Broken("a bug")

    monkeypatch.setattr(harness, "measure", broken)
    with pytest.raises(Broken):
        _job(tmp_path)
    assert not (tmp_path / "op.json").exists()


KILL_SCRIPT = """
import sys
from pathlib import Path
from opcost import profile
from opcost.config import GpuConfig
from opcost.names import parse_setting
out = Path(sys.argv[1])
spec = {spec}
profile.profile_job(kind="op", gpu=GpuConfig("cpu", "cpu", True, "float32", (), None, None),
    setting=parse_setting("default"), mode="inference",
    profile_config={{"min_run_time_s": 30.0, "warmup_s": 0.01}},
    csv_path=out / "op.csv", json_path=out / "op.json", spec=spec, op_id="0123456789abcdef")
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_job_killed_mid_measurement_leaves_no_final_output(tmp_path, sig):
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT.format(spec=repr(CONV_SPEC)), str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # Wait until it is measuring (it has written its first file, the CSV: under a
    # temporary name, unless that guard is gone), then kill it.
    deadline = time.monotonic() + 60
    while not list(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.iterdir()), "the job never started measuring"
    time.sleep(0.5)
    os.kill(proc.pid, sig)
    proc.wait(timeout=30)
    assert not (tmp_path / "op.json").exists()
    assert not (tmp_path / "op.csv").exists()


# --- the GPU setting is restored -----------------------------------------------------------


def test_wrapper_resets_after_error_in_block(calls: Path) -> None:
    with pytest.raises(ZeroDivisionError), applied_setting(parse_setting("pl300"), "0", COMMAND):
        _ = 1 / 0
    assert changes(calls) == [["-i", "0", "-pl", "300"], *RESET]
    assert not marker_path("0").exists()


def test_failed_apply_still_resets_and_keeps_marker(
    calls: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NVSMI_MODE", "no_permission")
    with (
        pytest.raises(GpuSettingError, match="Insufficient Permissions") as info,
        applied_setting(parse_setting("sm1410"), "0", COMMAND),
    ):
        pytest.fail("the block must not run")
    assert changes(calls) == [LOCK_1410, *RESET]  # all refused by the fake
    assert any("resetting GPU 0 failed" in note for note in info.value.__notes__)
    # The card may still be locked: the marker stays so that the next job resets it.
    assert marker_path("0").exists()


def test_missing_command_says_what_to_do(calls: Path) -> None:
    with (
        pytest.raises(GpuSettingError, match="setting `default`"),
        applied_setting(parse_setting("sm1410"), "0", ["/nonexistent/opcost-gpu-setting"]),
    ):
        pass


JOB = """
import sys, time
from opcost.gpu_setting import applied_setting
from opcost.names import parse_setting
with applied_setting(parse_setting("sm1410"), "0", {command!r}):
    print("applied", flush=True)
    time.sleep(30)
print("not reached", flush=True)
"""


def start_job(tmp_path: Path) -> subprocess.Popen[str]:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB.format(command=COMMAND)))
    job = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert job.stdout is not None
    line = job.stdout.readline()
    if line != "applied\n":
        job.kill()
        pytest.fail(f"job did not apply the setting: {line!r} {job.communicate()[1]}")
    return job


def test_sigterm_mid_setting_resets(calls: Path, tmp_path: Path) -> None:
    job = start_job(tmp_path)
    assert changes(calls) == [LOCK_1410]
    job.send_signal(signal.SIGTERM)
    out, err = job.communicate(timeout=30)
    assert job.returncode == 128 + signal.SIGTERM, err
    assert "not reached" not in out
    assert changes(calls) == [LOCK_1410, *RESET]
    assert not marker_path("0").exists()


def test_sigkill_leaves_marker_and_next_job_recovers(
    calls: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = start_job(tmp_path)
    job.kill()
    job.communicate(timeout=30)
    # SIGKILL cannot be caught: the clock stays locked, the marker says so.
    assert changes(calls) == [LOCK_1410]
    marker = json.loads(marker_path("0").read_text())
    assert (marker["pid"], marker["setting"]) == (job.pid, "sm1410")

    # The next job, even one measuring the default setting, resets first.
    with caplog.at_level(logging.WARNING), applied_setting(parse_setting("default"), "0", COMMAND):
        assert changes(calls) == [LOCK_1410, *RESET]
        assert not marker_path("0").exists()
    assert "was killed" in caplog.text
    assert changes(calls) == [LOCK_1410, *RESET]


def test_corrupt_marker_is_treated_as_stale(calls: Path) -> None:
    marker_path("0").parent.mkdir(parents=True)
    marker_path("0").write_text("{trunc")
    assert recover_stale_setting("0", COMMAND)
    assert changes(calls) == RESET
    assert not recover_stale_setting("0", COMMAND)


def test_marker_of_running_process_is_not_stale(calls: Path) -> None:
    with applied_setting(parse_setting("sm1410"), "0", COMMAND):
        with pytest.raises(GpuSettingError, match="still running"):
            recover_stale_setting("0", COMMAND)
        assert changes(calls) == [LOCK_1410]
    assert changes(calls) == [LOCK_1410, *RESET]


THREAD_JOB = """
import sys, threading, time
from opcost.gpu_setting import applied_setting
from opcost.names import parse_setting
applied = threading.Event()
def hold():
    with applied_setting(parse_setting("sm1410"), "0", {command!r}):
        applied.set()
        time.sleep(30)
threading.Thread(target=hold, daemon=True).start()
applied.wait(30)
print("exiting", flush=True)
"""


def test_setting_held_by_abandoned_thread_is_reset_at_exit(calls: Path, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(THREAD_JOB.format(command=COMMAND)))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout == "exiting\n", done.stderr
    assert changes(calls) == [LOCK_1410, *RESET]
    assert not marker_path("0").exists()


def test_sigterm_unwinds() -> None:
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []

    def job() -> None:
        with sigterm_unwinds() as installed:
            assert installed
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler interrupts this
            finally:
                cleaned.append(True)

    with pytest.raises(SystemExit) as info:
        job()
    assert info.value.code == 128 + signal.SIGTERM
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) == before


# --- the pipeline: an op out of memory, raw logs, kills, sharing a GPU ---------------------

# A user network whose second layer "runs out of GPU memory" wherever it really runs (on
# the meta device of the extract stage it does not): the profile stage meets the error
# torch raises for a GPU out of memory, on the CPU.
OOM_NETS = """
import torch
from torch import nn


class Greedy(nn.Module):
    def forward(self, x):
        if x.device.type != "meta":
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 80.00 GiB (simulated by the test)"
            )
        return x * 2


def net():
    return nn.Sequential(nn.Linear(8, 8), Greedy())
"""
OOM_CONFIG = """
models:
  - {model: "oomnets:net", inputs: [[4, 8]]}
modes: [inference]
gpus:
  cpu: {device: cpu}
profile: {min_run_time_s: 0.02, warmup_s: 0.005}
"""
OOM_TARGETS = ("results/dataset/cpu.parquet", "results/dataset/cpu.failed.parquet")


def snakemake_with(repo: Path, workdir: Path, extra_path: Path, *args: str, timeout: int = 600):
    """Snakemake on the repository's Snakefile, with ``extra_path`` importable."""
    return snakemake(repo, workdir, *args, timeout=timeout, extra_paths=(extra_path,))


@pytest.fixture(scope="module")
def oom_study(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The OOM study run once through Snakemake: its folders and the run's result."""
    root = tmp_path_factory.mktemp("oom_study")
    models = root / "models"
    models.mkdir()
    (models / "oomnets.py").write_text(OOM_NETS)
    config = root / "config.yaml"
    config.write_text(OOM_CONFIG)
    repo = Path(__file__).resolve().parents[1]
    work = root / "work"
    args = ("--configfile", str(config))
    # Targets first: --configfile and --forcerun take every word that follows them.
    run = snakemake_with(repo, work, models, *OOM_TARGETS, "--cores", "1", *args)
    return {"repo": repo, "work": work, "models": models, "args": args, "run": run}


def test_out_of_memory_study_goes_on_and_lists_the_failure(oom_study):
    run = oom_study["run"]
    assert run.returncode == 0, run.stderr[-4000:]
    work = oom_study["work"]
    unique = pd.read_parquet(work / "results/ops/unique.parquet")
    greedy = unique.loc[unique["type"] == "oomnets.Greedy", "op_id"].item()
    linear = unique.loc[unique["type"] != "oomnets.Greedy", "op_id"].item()
    dataset = pd.read_parquet(work / "results/dataset/cpu.parquet")
    failed = pd.read_parquet(work / "results/dataset/cpu.failed.parquet")
    # The Linear layer was measured; the greedy op and the whole network failed.
    assert list(dataset["op_id"]) == [linear]
    assert dataset["time_s"].gt(0).all()
    assert sorted(failed["kind"]) == ["network", "op"]
    assert failed.loc[failed["kind"] == "op", "op_id"].item() == greedy
    assert failed.loc[failed["kind"] == "network", "model_input"].item() == "oomnets.net_4x8"
    for reason in failed["failure_reason"]:
        assert "CUDA out of memory" in reason
        assert "simulated by the test" in reason
    raw = json.loads((work / f"results/raw/cpu/default/inference/ops/{greedy}.json").read_text())
    assert raw["status"] == "failed"


def _report_payloads(html: str) -> str:
    """The report's text plus every file it embeds as a base64 data URI, decoded."""
    import base64

    texts = [html]
    for match in re.finditer(r'data:[^;,"]+(?:;[^;,"]+)*;base64,([A-Za-z0-9+/=]+)', html):
        try:
            texts.append(base64.b64decode(match[1]).decode("utf-8", errors="replace"))
        except ValueError:
            continue
    return "\n".join(texts)


def test_failure_table_is_in_the_report(oom_study):
    assert oom_study["run"].returncode == 0
    work, report = oom_study["work"], oom_study["work"] / "report.html"
    repo, models, args = oom_study["repo"], oom_study["models"], oom_study["args"]
    # The failure table as the report shows it: a CSV beside the Parquet file.
    targets = (*OOM_TARGETS, "results/dataset/cpu.failed.csv")
    made = snakemake_with(repo, work, models, *targets, "--cores", "1", *args)
    assert made.returncode == 0, made.stderr[-4000:]
    made = snakemake_with(repo, work, models, *targets, "--report", str(report), *args)
    assert made.returncode == 0, made.stderr[-4000:]
    unique = pd.read_parquet(work / "results/ops/unique.parquet")
    greedy = unique.loc[unique["type"] == "oomnets.Greedy", "op_id"].item()
    shown = _report_payloads(report.read_text())
    assert greedy in shown
    assert "simulated by the test" in shown


def test_raw_logs_are_write_protected_and_a_rerun_refuses_to_overwrite(oom_study):
    assert oom_study["run"].returncode == 0
    work = oom_study["work"]
    raw = sorted(p for p in (work / "results/raw").rglob("*") if p.is_file())
    assert len(raw) == 6  # two ops and the network, each a CSV and a JSON
    for path in raw:
        assert not path.stat().st_mode & 0o222, f"{path} is writable"
    before = {p: p.read_bytes() for p in raw}
    target = next(p for p in raw if p.suffix == ".json" and "/ops/" in str(p))
    # Root may write anyway, and Snakemake asks os.access: root's rerun would overwrite
    # the logs. The rerun is a user's, who owns the files; as root, root without its
    # capabilities, whom the modes bind as they bind an owner.
    repo, argv = oom_study["repo"], (str(target.relative_to(work)), "--cores", "1")
    rerun = subprocess.run(
        as_ordinary_user(
            snakemake_argv(repo, work, *argv, *oom_study["args"], "--forcerun", "profile_op")
        ),
        capture_output=True,
        text=True,
        cwd=repo,
        env=snakemake_env(repo, oom_study["models"]),
        timeout=600,
    )
    assert rerun.returncode != 0
    assert "protected" in (rerun.stdout + rerun.stderr).lower()
    assert {p: p.read_bytes() for p in raw} == before


def _intervals(workdir):
    records = [json.loads(p.read_text()) for p in (workdir / "results/raw").rglob("*.json")]
    return sorted((r["started_unix_s"], r["finished_unix_s"]) for r in records)


def test_profiling_jobs_never_overlap_without_resources_flag(repo, tmp_path):
    """The default profile limits gpu=1: no two profiling jobs share the device."""
    config = ["--configfile", str(repo / "tests/data/configs/tiny.yaml")]
    run = snakemake(repo, tmp_path, "--cores", "4", *config)  # no --resources given
    assert run.returncode == 0, run.stderr[-4000:]
    spans = _intervals(tmp_path)
    assert len(spans) > 10
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end


def test_run_killed_mid_profiling_resumes_and_completes(repo, tmp_path):
    config = ["--configfile", str(repo / "tests/data/configs/tiny.yaml")]
    proc = subprocess.Popen(
        snakemake_argv(repo, tmp_path, "--cores", "2", *config),
        cwd=repo,
        env=snakemake_env(repo),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    raw = tmp_path / "results/raw"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and len(list(raw.rglob("*.json"))) < 5:
        time.sleep(0.2)
    # As SLURM or a user stops a run: SIGTERM (Snakemake finishes its running job), then
    # SIGKILL if it has not exited after a grace period.
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=60)
    measured_before = {p.name for p in raw.rglob("*.json")}
    assert len(measured_before) > 0
    # Nothing half-written looks complete: every final JSON parses and has its CSV.
    for p in raw.rglob("*.json"):
        assert json.loads(p.read_text())["status"] == "ok"
        assert p.with_suffix(".csv").exists()
    # After a SIGKILL Snakemake's lock remains; --unlock is the documented way on.
    assert snakemake(repo, tmp_path, "--unlock", *config).returncode == 0
    again = snakemake(repo, tmp_path, "--cores", "2", *config)
    assert again.returncode == 0, again.stderr[-4000:]
    # Only what was missing ran: the measurements made before the kill were kept.
    assert measured_before <= {p.name for p in raw.rglob("*.json")}
    dataset = pd.read_parquet(tmp_path / "results/dataset/cpu.parquet")
    unique = pd.read_parquet(tmp_path / "results/ops/unique.parquet")
    assert len(dataset) == 2 * len(unique) + 4
    assert not list(raw.rglob(".*.tmp-*"))


# --- issue 19: power logs that do not cover the window, bad record fields, merged lines ----
#
# Each starts from a real H100 measurement (tests/data/h100), copied to tmp_path and
# doctored there. Its timed window is 1.008 s; its log, polled every 20 ms, runs from
# 0.44 s before the window to 1 ms after it (72 lines).

REAL_H100 = Path(__file__).parent / "data/h100/raw/h100/default/inference/ops/025dc3cf99733f10"


def doctored_copy(tmp_path: Path, keep=None, change=None, **fields) -> tuple[Path, Path]:
    """REAL_H100 copied to tmp_path/doctored.{json,csv}: ``fields`` set in the JSON, the
    CSV's data lines filtered by ``keep(unix_s)`` and rewritten by ``change(unix_s, line)``
    (both given each line's time, UTC seconds)."""
    record = json.loads(REAL_H100.with_suffix(".json").read_text())
    record.update(fields)
    json_path = tmp_path / "doctored.json"
    json_path.write_text(json.dumps(record))
    header, *body = REAL_H100.with_suffix(".csv").read_text().splitlines()
    lines = [header]
    for line, unix_s in zip(body, line_times_s(body, record["utc_offset_s"]), strict=True):
        if keep is None or keep(unix_s):
            lines.append(change(unix_s, line) if change else line)
    csv_path = tmp_path / "doctored.csv"
    csv_path.write_text("\n".join(lines) + "\n")
    return json_path, csv_path


def line_times_s(body: list[str], utc_offset_s: int) -> np.ndarray:
    """The UTC time of each log line, from its local timestamp."""
    stamps = pd.to_datetime([line.split(",")[0] for line in body], format="%Y/%m/%d %H:%M:%S.%f")
    return stamps.to_numpy("datetime64[us]").astype(np.int64) / 1e6 - utc_offset_s


def real_window() -> tuple[float, float]:
    record = json.loads(REAL_H100.with_suffix(".json").read_text())
    return record["timed_start_unix_s"], record["timed_end_unix_s"]


START_S, END_S = real_window()
MIDDLE_S = (START_S + END_S) / 2


@pytest.mark.parametrize(
    ("keep", "fields", "says"),
    [
        (lambda t: t < START_S - 0.3, {}, "has no usable row in"),  # the first 8 lines
        (
            None,
            {"timed_start_unix_s": START_S + 1000, "timed_end_unix_s": END_S + 1000},
            "has no usable row in",
        ),
        (lambda t: t <= MIDDLE_S, {}, "covers only part of"),
        (lambda t: t >= MIDDLE_S, {}, "covers only part of"),
    ],
    ids=["cut-to-8-lines", "window-shifted-1000-s", "ends-mid-window", "starts-mid-window"],
)
def test_log_not_covering_the_window_fails_naming_the_file(request, tmp_path, keep, fields, says):
    json_path, csv_path = doctored_copy(tmp_path, keep, **fields)
    if "cut-to-8-lines" in request.node.name:
        assert len(csv_path.read_text().splitlines()) == 8
    with pytest.raises(PowerLogError, match=re.escape(str(csv_path))) as error:
        evaluate_measurement(json_path, csv_path)
    assert says in str(error.value)
    assert str(json_path) in str(error.value)


def test_log_ending_within_the_tolerance_is_evaluated(tmp_path):
    """A real logger ends up to 1.01 polling intervals before the window's end; one that
    ends 2 to 3 intervals early is still accepted, and evaluated on the rows it has."""
    json_path, csv_path = doctored_copy(tmp_path, lambda t: t <= END_S - 0.04)
    body = csv_path.read_text().splitlines()[1:]
    last_s = line_times_s(body, 0)[-1]
    assert 0.04 < END_S - last_s < 0.06
    row = evaluate_measurement(json_path, csv_path, min_power_updates=1)
    expected = by_hand(str(tmp_path / "doctored"))
    for key in ("n_power_samples", "power_w", "energy_j", "sigma_power_w"):
        assert row[key] == pytest.approx(expected[key], rel=1e-9), key
    assert row["low_power_samples"] is False


def na_power(line: str) -> str:
    """The line as nvidia-smi prints it when it cannot read power."""
    cells = line.split(", ")
    cells[2] = "[N/A]"  # power.draw.instant
    return ", ".join(cells)


def test_window_without_a_usable_row_fails_naming_the_file(tmp_path):
    # Every line of the 1 s window unreadable: the log spans the window but has no sample.
    json_path, csv_path = doctored_copy(
        tmp_path, change=lambda t, line: na_power(line) if START_S <= t <= END_S else line
    )
    with pytest.raises(PowerLogError, match=re.escape(str(csv_path))) as error:
        evaluate_measurement(json_path, csv_path)
    assert "has no usable row in" in str(error.value)


def test_hole_in_the_window_flags_the_row(tmp_path):
    """0.2 s of the window unreadable (more than 3 polls of 20 ms): the row keeps its
    values, computed on the readable rows, and is flagged low_power_samples."""
    hole = (START_S + 0.3, START_S + 0.5)
    json_path, csv_path = doctored_copy(
        tmp_path, change=lambda t, line: na_power(line) if hole[0] <= t <= hole[1] else line
    )
    n_unreadable = csv_path.read_text().count("[N/A]")
    assert n_unreadable >= 9
    row = evaluate_measurement(json_path, csv_path, min_power_updates=1)
    expected = by_hand(str(tmp_path / "doctored"))
    assert row["n_rows_dropped"] == n_unreadable
    assert row["power_w"] == pytest.approx(expected["power_w"], rel=1e-9)
    assert row["low_power_samples"] is True
    # The log without the hole is not flagged.
    real = evaluate_measurement(
        REAL_H100.with_suffix(".json"), REAL_H100.with_suffix(".csv"), min_power_updates=1
    )
    assert real["low_power_samples"] is False


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("energy_counter_start_mj", "garbage"),
        ("energy_counter_start_mj", float("nan")),
        ("energy_counter_end_mj", 1),  # below the start: the counter only grows
        ("total_time_s", -5),
        ("total_time_s", 0),
        ("sigma_total_time_s", -0.1),
        ("iterations", 0),
        ("iterations", 2.5),
        ("iterations", True),
        ("timed_start_unix_s", "soon"),
        ("timed_end_unix_s", float("inf")),
        ("utc_offset_s", 10**6),
        ("power_interval_ms", 0),
        ("block_size", -1),
        ("peak_memory_bytes", -1),
        ("tf32", "yes"),
        ("gpu", None),
        ("spec", [1, 2]),
    ],
    ids=lambda v: json.dumps(v, separators=(",", ":")).strip('"'),
)
def test_bad_benchmark_field_fails_naming_file_and_field(tmp_path, field, value):
    json_path, csv_path = doctored_copy(tmp_path, **{field: value})
    with pytest.raises(EvaluationError, match=re.escape(str(json_path))) as error:
        evaluate_measurement(json_path, csv_path)
    assert field in str(error.value)


def overwrite(path: Path, at: int, junk: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[at : at + len(junk)] = junk
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("before_newline", [1, 20, 39])
def test_lines_merged_by_junk_count_every_poll_lost(tmp_path, before_newline):
    """40 junk bytes written over the newline between two lines of a real log (and over
    the first line's end, or the second's timestamp): two polls lost, two dropped."""
    _, csv_path = doctored_copy(tmp_path)
    original = read_power_log(csv_path)
    assert (original.n_rows_total, original.n_rows_dropped) == (72, 0)
    text = csv_path.read_bytes()
    newline = [i for i, byte in enumerate(text) if byte == ord("\n")][10]  # after line 10
    overwrite(csv_path, newline - before_newline, b"\xff\x00#junk" * 6 + b"junk")
    assert len(csv_path.read_bytes()) == len(text)
    log = read_power_log(csv_path)
    assert (log.n_rows_total, log.n_rows_dropped) == (72, 2)
    kept = np.delete(original.samples["power.draw.instant"].to_numpy(), [9, 10])
    np.testing.assert_array_equal(log.samples["power.draw.instant"].to_numpy(), kept)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("", "holds its header but no sample"),
        ("\n\n", "holds its header but no sample"),
        ("[Unknown Error]\n", "has no usable row"),
    ],
    ids=["header-only", "header-and-blank-lines", "junk-only"],
)
def test_log_without_a_sample_says_so(tmp_path, body, says):
    _, csv_path = doctored_copy(tmp_path)
    header = csv_path.read_text().splitlines()[0]
    csv_path.write_text(header + "\n" + body)
    with pytest.raises(PowerLogError, match=re.escape(str(csv_path))) as error:
        read_power_log(csv_path)
    assert says in str(error.value)
    assert "nounits" not in str(error.value)


# --- issue 19: predictor integrity ----------------------------------------------------------


def test_predictor_file_changed_in_place_is_refused_naming_it(predictors, tmp_path):
    """The time model's leaf values overwritten in place (same length; the file stays
    well-formed, and today predicts other times with exit code 0): refused, naming the
    file, before anything is parsed (model/format.py:_read_manifest)."""
    import shutil

    from opcost.model import PredictorError
    from opcost.model.format import TIME_FILE, load_predictor

    shutil.copytree(predictors / "h100", tmp_path / "h100")
    d = tmp_path / "h100"
    values = load_predictor(d).time_model.value
    data = bytearray((d / TIME_FILE).read_bytes())
    at = data.find(values.tobytes())
    assert at > 0
    data[at : at + values.nbytes] = (values * 2).tobytes()
    (d / TIME_FILE).write_bytes(bytes(data))
    assert len(data) == (predictors / "h100" / TIME_FILE).stat().st_size
    with pytest.raises(PredictorError) as error:
        load_predictor(d)
    message = str(error.value)
    assert message.startswith(f"{d / TIME_FILE}: does not match its SHA-256 in manifest.json")
    assert message.endswith("retrain it (snakemake -f results/predictors/<gpu>/manifest.json)")


@pytest.mark.parametrize("fault", ["no-manifest", "other-version", "save-interrupted", "added"])
def test_predictor_without_a_matching_manifest_is_refused(predictors, tmp_path, monkeypatch, fault):
    """No manifest (an older opcost's predictor), another format version, a save that
    stopped before the manifest was written, or a file the loader reads that the
    manifest does not list: refused, naming the file (model/format.py:_read_manifest,
    :save_predictor)."""
    import shutil
    from dataclasses import replace

    import opcost.io
    from opcost.model import PredictorError
    from opcost.model.format import load_predictor, save_predictor

    shutil.copytree(predictors / "h100", tmp_path / "h100")
    d = tmp_path / "h100"
    manifest = json.loads((d / "manifest.json").read_text())
    if fault == "no-manifest":
        (d / "manifest.json").unlink()
        expected = f"{d}: no manifest.json"
    elif fault == "other-version":
        manifest["format_version"] = 2
        (d / "manifest.json").write_text(json.dumps(manifest))
        expected = f"{d / 'manifest.json'}: predictor format version 2, this opcost reads 1"
    elif fault == "save-interrupted":
        # Saving another predictor over this one stops after its models are written.
        p = load_predictor(d)
        other = replace(p, time_model=p.power_model)
        real = opcost.io.write_atomic

        def fail_on_features(path, data):
            if path.name == "features.json":
                raise OSError(28, "No space left on device")
            real(path, data)

        monkeypatch.setattr(opcost.io, "write_atomic", fail_on_features)
        with pytest.raises(OSError, match="No space"):
            save_predictor(other, d)
        expected = f"{d}: no manifest.json"
    else:
        (d / "metrics.json").write_text(json.dumps({"lono": {}}))
        expected = f"{d / 'metrics.json'}: not in manifest.json"
    with pytest.raises(PredictorError) as error:
        load_predictor(d)
    assert str(error.value).startswith(expected)


# --- issue 19: interrupting a run, two runs in one directory -------------------------------

# One tiny network, one mode: seven profiling jobs, each measuring for about a second, so a
# signal can reach a run mid-measurement.
INTERRUPT_STUDY = """
models:
  - {model: "toymodels.nets:tiny_mlp", inputs: [[8, 16]]}
  - {model: "toymodels.nets:tiny_mlp", inputs: [[4, 16]]}
modes: [inference]
gpus:
  cpu: {device: cpu}
profile: {min_run_time_s: 1.0, warmup_s: 0.005}
"""


def _start(repo: Path, work: Path, args: tuple[str, ...], log: Path) -> subprocess.Popen:
    """Snakemake in the background, with SIGINT as a terminal leaves it (its default
    action): the tests may run where SIGINT is ignored (a shell's background job), which
    Snakemake would inherit."""
    with open(log, "w") as out:
        return subprocess.Popen(
            snakemake_argv(repo, work, *args),
            cwd=repo,
            env=snakemake_env(repo),
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )


def _wait_for(paths, what: str, timeout_s: float = 600) -> list[Path]:
    """Poll ``paths()`` until it returns something; that list."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = paths()
        if found:
            return found
        time.sleep(0.05)
    pytest.fail(f"never saw {what}")


def _raw_logs(work: Path) -> list[Path]:
    """The raw logs under their final names (not a job's temporary files)."""
    return [
        p for p in (work / "results/raw").rglob("*") if p.is_file() and not p.name.startswith(".")
    ]


@pytest.mark.slow
def test_sigint_to_snakemake_alone_stops_the_measurement_and_a_rerun_completes(repo, tmp_path):
    """SIGINT to the Snakemake process only (not its group): the measurement worker stops
    too, the interrupted job leaves no raw log, and the same command then completes with
    every raw log write-protected."""
    config = tmp_path / "study.yaml"
    config.write_text(INTERRUPT_STUDY)
    work = tmp_path / "work"
    args = ("results/dataset/cpu.parquet", "--cores", "2", "--configfile", str(config))
    proc = _start(repo, work, args, tmp_path / "run1.log")
    staged = _wait_for(
        lambda: list((work / "results/raw").rglob(".*.tmp-*")), "a profiling job measuring"
    )
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=300) != 0
    # The job that was measuring (its temporary CSV named it) left no file, nor a temporary.
    interrupted = staged[0].name.split(".tmp-")[0].lstrip(".").rsplit(".", 1)[0]
    assert not list((work / "results/raw").rglob(f"{interrupted}.*"))
    assert not list((work / "results/raw").rglob(".*.tmp-*"))
    for path in _raw_logs(work):
        assert not path.stat().st_mode & 0o222, f"{path} is writable"

    again = snakemake(repo, work, *args)
    assert again.returncode == 0, again.stderr[-4000:]
    raw = _raw_logs(work)
    unique = pd.read_parquet(work / "results/ops/unique.parquet")
    assert len(raw) == 2 * (len(unique) + 2)
    for path in raw:
        assert not path.stat().st_mode & 0o222, f"{path} is writable"
    dataset = pd.read_parquet(work / "results/dataset/cpu.parquet")
    assert len(dataset) == len(unique) + 2
    assert all((work / p).exists() for p in dataset["json_path"])


def _incomplete_marker(work: Path, output: str) -> Path:
    """Where Snakemake marks ``output`` as written by a job that has not finished yet."""
    import base64

    return work / ".snakemake/incomplete" / base64.urlsafe_b64encode(output.encode()).decode()


@pytest.mark.slow
def test_sigkill_during_train_then_the_lock_first_and_the_same_command_completes(repo, tmp_path):
    """SIGKILL to Snakemake alone while `train` runs: the training script finishes on its
    own and leaves its outputs marked incomplete, and the lock stays. The rerun's first
    (and only) complaint is the lock, as for a second run in a directory where another
    runs; after `--unlock` the same command completes, training again."""
    config = tmp_path / "study.yaml"
    config.write_text(INTERRUPT_STUDY.replace("min_run_time_s: 1.0", "min_run_time_s: 0.01"))
    work = tmp_path / "work"
    metrics = "results/predictors/cpu/metrics.json"
    args = (metrics, "--cores", "2", "--configfile", str(config))
    proc = _start(repo, work, args, tmp_path / "run1.log")
    marker = _incomplete_marker(work, metrics)
    # Snakemake marks the outputs before it starts the script: the script's own log,
    # which it opens once it runs, says that it does.
    train_log = work / "logs/train/cpu.log"
    _wait_for(lambda: [train_log] if marker.exists() and train_log.exists() else [], "train")
    proc.kill()
    proc.wait(timeout=60)
    # The orphaned training script writes its outputs all the same.
    _wait_for(lambda: [work / metrics] if (work / metrics).exists() else [], metrics, 300)
    time.sleep(2)
    assert marker.exists()

    again = snakemake(repo, work, *args)
    assert again.returncode != 0
    said = again.stdout + again.stderr
    assert "LockException" in said
    assert "IncompleteFilesException" not in said
    assert "--rerun-incomplete" not in said

    assert snakemake(repo, work, "--unlock", *args).returncode == 0
    done = snakemake(repo, work, *args)
    assert done.returncode == 0, done.stderr[-4000:]
    assert re.search(r"^\s*(local)?rule train:", done.stdout + done.stderr, re.M)
    assert not marker.exists()
    assert json.loads((work / metrics).read_text())["gpu"] == "cpu"


def test_a_profiling_job_leaves_its_raw_logs_read_only(tmp_path):
    """Protected by the job itself, not only by Snakemake after it (which an interrupted
    run never gets to)."""
    from opcost import profile
    from opcost.config import GpuConfig

    profile.profile_job(
        kind="op",
        gpu=GpuConfig("cpu", "cpu", True, "float32", (), None, None),
        setting=parse_setting("default"),
        mode="inference",
        profile_config={"min_run_time_s": 0.01, "warmup_s": 0.002},
        csv_path=tmp_path / "op.csv",
        json_path=tmp_path / "op.json",
        spec=CONV_SPEC,
        op_id="0123456789abcdef",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["op.csv", "op.json"]
    for path in tmp_path.iterdir():
        assert path.stat().st_mode & 0o777 == 0o444, oct(path.stat().st_mode)


def test_sigterm_while_publishing_waits_until_both_raw_logs_are_in_place(tmp_path, monkeypatch):
    """A SIGTERM between the CSV's rename and the JSON's would leave a CSV without its
    JSON: read-only, Snakemake then refuses to rerun the job. It takes effect after both."""
    from opcost import publish

    staged = {name: tmp_path / f".{name}.tmp-1" for name in ("op.csv", "op.json")}
    for path in staged.values():
        path.write_text("x\n")
    real_replace = os.replace

    def replace_then_sigterm(src, dst):
        real_replace(src, dst)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(os, "replace", replace_then_sigterm)
    with pytest.raises(SystemExit) as info, sigterm_unwinds():
        publish.publish_read_only([(staged[n], tmp_path / n) for n in ("op.csv", "op.json")])
    assert info.value.code == 128 + signal.SIGTERM
    assert sorted(p.name for p in tmp_path.iterdir()) == ["op.csv", "op.json"]
    assert all(p.stat().st_mode & 0o777 == 0o444 for p in tmp_path.iterdir())


def test_a_dataset_with_a_row_whose_raw_log_is_gone_is_refused(tmp_path):
    from opcost.workflow import MissingRawLogError, require_raw_logs

    raw = tmp_path / "results/raw/cpu/default/inference/ops"
    raw.mkdir(parents=True)
    for name in ("a.json", "a.csv", "b.json"):  # b's CSV is gone
        (raw / name).write_text("{}\n")
    dataset = tmp_path / "cpu.parquet"
    pd.DataFrame({"json_path": [str(raw / "a.json")]}).to_parquet(dataset)
    require_raw_logs(dataset)
    pd.DataFrame({"json_path": [str(raw / "a.json"), str(raw / "b.json")]}).to_parquet(dataset)
    with pytest.raises(MissingRawLogError, match=rf"{dataset}.*{raw / 'b.csv'}.*`snakemake`"):
        require_raw_logs(dataset)


# --- issue 20: SIGTERM ----------------------------------------------------------------------

# One network measured for a minute: a SIGTERM reaches its job mid-measurement.
SIGTERM_STUDY = """
models:
  - {model: "toymodels.nets:tiny_mlp", inputs: [[8, 16]]}
modes: [inference]
gpus:
  cpu: {device: cpu}
profile: {min_run_time_s: 60.0, warmup_s: 0.005}
"""
SIGTERM_JOB = (
    "profile_network:gpu=cpu,setting=default,mode=inference,"
    "model_input=toymodels.nets.tiny_mlp_8x16"
)
# The Snakemake and the worker must be gone this long after the SIGTERM: less than the
# test cluster's KillWait (10 s), after which SLURM would SIGKILL what it can reach.
SIGTERM_GONE_S = 8.0


def _children(pid: int) -> list[int]:
    """The process ids whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_ends_a_batch_and_its_measurement_at_once(repo, tmp_path):
    """Issue 20: SIGTERM to the Snakemake process running a profiling job (`scancel`, a
    time limit) stops the measurement in its worker and ends both within seconds, leaving
    no raw log. Before, Snakemake let the measurement run to its end (a minute here),
    wrote its raw log, and only then ended. The job runs as in a SLURM batch: Snakemake
    in remote mode, the job named by --target-jobs, run in Snakemake's own threads."""
    config = tmp_path / "study.yaml"
    config.write_text(SIGTERM_STUDY)
    work = tmp_path / "work"
    raw = "results/raw/cpu/default/inference/networks/toymodels.nets.tiny_mlp_8x16"
    # The command line of a batch (the SLURM plugin's), less what is SLURM's: the local
    # executor, in threads as the jobstep executor runs them.
    args = (
        "--target-jobs",
        SIGTERM_JOB,
        "--allowed-rules",
        "profile_network",
        "--mode",
        "remote",
        "--executor",
        "local",
        "--force-use-threads",
        "--cores",
        "1",
        "--nolock",
        "--no-hooks",
        "--ignore-incomplete",
        "--force",
        "--configfiles",
        str(config),
    )
    proc = _start(repo, work, args, tmp_path / "run.log")
    try:
        _wait_for(lambda: list((work / "results/raw").rglob(".*.tmp-*")), "the measurement", 120)
        workers = [p for p in _children(proc.pid) if "opcost.worker" in _cmdline(p)]
        assert len(workers) == 1, workers
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = proc.wait(timeout=120)
        ended_s = time.monotonic() - signalled
        assert ended_s < SIGTERM_GONE_S, (ended_s, (tmp_path / "run.log").read_text()[-3000:])
        while _alive(workers[0]) and time.monotonic() - signalled < SIGTERM_GONE_S:
            time.sleep(0.05)
        assert not _alive(workers[0])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code != 0
    assert "measurement stopped" in (tmp_path / "run.log").read_text()
    assert "Snakemake was interrupted" in (tmp_path / "run.log").read_text()
    assert not (work / f"{raw}.json").exists()
    assert not (work / f"{raw}.csv").exists()
    assert not list((work / "results/raw").rglob(".*.tmp-*"))


# Snakemake's scheduler as far as its SIGTERM handler sees it, the handler installed as
# JobScheduler.__init__ installs it, and a SIGTERM while the main thread holds the
# scheduler's lock (as it does while it selects jobs or finishes them).
SIGTERM_UNDER_LOCK = """
import os, signal, sys, threading
from snakemake.scheduling.job_scheduler import JobScheduler
from opcost import worker

worker.stop_on_terminate(exit_after_s={exit_after_s})

class Scheduler:
    _lock = threading.Lock()
    _open_jobs = threading.Semaphore(0)
    _user_kill = None

scheduler = Scheduler()
signal.signal(signal.SIGTERM, JobScheduler.exit_gracefully.__get__(scheduler))
with scheduler._lock:
    os.kill(os.getpid(), signal.SIGTERM)
    print("handled", flush=True)
print(scheduler._user_kill, scheduler._open_jobs.acquire(timeout=10), flush=True)
{then}
"""


def test_sigterm_while_snakemake_holds_its_scheduler_lock_is_handled():
    """Issue 20: Snakemake's SIGTERM handler takes the scheduler's lock, which the main
    thread (where Python runs handlers) holds while it selects and finishes jobs: the
    process then waited on itself forever, idle, ignoring further SIGTERMs (a batch
    outlived its `scancel` by 23 minutes). The handler now takes no lock: it marks the
    scheduler to stop and wakes it from another thread."""
    script = SIGTERM_UNDER_LOCK.format(exit_after_s=None, then="")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["handled", "graceful", "True"]


def test_a_batch_still_running_after_sigterm_ends_itself():
    """Issue 20: where SLURM tracks processes without cgroups, a batch's Snakemake whose
    shell died on SIGTERM is out of SLURM's reach (its SIGKILL after KillWait never
    comes). A batch then ends itself `exit_after_s` after a SIGTERM, whatever still runs:
    here a main thread that never returns."""
    script = SIGTERM_UNDER_LOCK.format(exit_after_s=1.0, then="import time; time.sleep(60)")
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 30
    assert run.returncode == 128 + signal.SIGTERM, run.stderr[-3000:]
    assert run.stdout.split() == ["handled", "graceful", "True"]
    assert "still running 1 s after SIGTERM" in run.stderr


# -- a job on another GPU than its configuration's --------------------------------------


def _on_gpu_named(monkeypatch, name: str) -> None:
    """This process on one CUDA GPU called ``name``, as NVML and torch would answer."""
    from types import SimpleNamespace

    from opcost import nvml, profile

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(nvml, "cuda_device_uuid", lambda index: "GPU-0000-test")
    monkeypatch.setattr(profile, "_gpu_facts", lambda uuid: (SimpleNamespace(name=name), ()))


def _h200(gpu_name="H200"):
    from opcost.config import GpuConfig

    default = (parse_setting("default"),)
    return GpuConfig("h200", "cuda", True, "float32", default, "h200", None, gpu_name)


def _run_job(job: str, gpu, out: Path):
    import pandas as pd

    from opcost import opspace_measure, profile, tracing
    from opcost.profile import profile_defaults

    config = dict(profile_defaults())
    common = {"gpu": gpu, "profile_config": config}
    if job == "op-space":
        samples = pd.DataFrame(
            {"op_id": ["x"], "family": ["conv"], "spec": ["{}"], "power": [False]}
        )
        return opspace_measure.measure_chunk(**common, samples=samples, out_path=out / "0.parquet")
    kw = {**common, "kind": "op", "setting": parse_setting("default"), "mode": "inference"}
    kw.update(spec=CONV_SPEC, op_id="0123456789abcdef", json_path=out / "op.json")
    if job == "trace":
        return tracing.trace_job(**kw)
    return profile.profile_job(**kw, csv_path=out / "op.csv")


@pytest.mark.parametrize("job", ["profile", "trace", "op-space"])
def test_a_job_on_another_gpu_than_its_configuration_measures_nothing(job, tmp_path, monkeypatch):
    """A configuration named for the H200 sent to an H100 host (a wrong SLURM GPU type,
    a job run on the wrong machine) fails before measuring, naming both GPUs, and leaves
    no file that could pass for an H200 measurement."""
    from opcost import profile

    _on_gpu_named(monkeypatch, "NVIDIA H100 80GB HBM3")
    out = tmp_path / "out"
    out.mkdir()
    expected = r"gpus\.h200\.gpu_name is 'H200', but this job runs on 'NVIDIA H100 80GB HBM3'"
    with pytest.raises(profile.ProfileError, match=expected):
        _run_job(job, _h200(), out)
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("gpu_name", ["h200", "H200", None])
def test_the_gpu_name_check_ignores_case_and_can_be_left_out(gpu_name, monkeypatch):
    from opcost import profile

    _on_gpu_named(monkeypatch, "NVIDIA H200")
    profile.check_gpu_name(_h200(gpu_name))  # no error
    _on_gpu_named(monkeypatch, "NVIDIA H100 80GB HBM3")
    if gpu_name is None:
        profile.check_gpu_name(_h200(gpu_name))
    else:
        with pytest.raises(profile.ProfileError):
            profile.check_gpu_name(_h200(gpu_name))
