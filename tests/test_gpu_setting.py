"""The privileged GPU-setting script and the job-side wrapper, against the fake nvidia-smi.

What nvidia-smi was asked to do is read back from the fake's call record; the H100's
supported clocks and default limit (700 W) come from tests/data/h100_probe/probe.log.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from opcost.gpu_setting import (
    GpuSettingError,
    applied_setting,
    main,
    marker_path,
    recover_stale_setting,
    sigterm_unwinds,
)
from opcost.names import parse_setting

FAKES = Path(__file__).parent / "fakes"
UUID = "GPU-57781e38-0b78-5d74-ed7b-e2db6ddbacd3"
COMMAND = (sys.executable, "-m", "opcost.gpu_setting")
LOCK_1410 = ["-i", "0", "-lgc", "1410,1410"]
RESET = [["-i", "0", "-rgc"], ["-i", "0", "-pl", "700"]]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Fake nvidia-smi first on PATH, a private state dir; return the call record's path."""
    assert os.access(FAKES / "nvidia-smi", os.X_OK), "tests/fakes/nvidia-smi must be executable"
    # The fake's `#!/usr/bin/env python3` then finds this interpreter (not a slow shim).
    python_dir = Path(sys.executable).parent
    monkeypatch.setenv("PATH", os.pathsep.join([str(FAKES), str(python_dir), os.environ["PATH"]]))
    for name in ("FAKE_NVSMI_MODE", "FAKE_NVSMI_LOG", "FAKE_NVSMI_NA_FIELDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPCOST_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_NVSMI_CALLS", str(path))
    return path


def recorded(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def changes(path: Path) -> list[list[str]]:
    """The calls that change the card (lock, limit, reset), in order."""
    return [c for c in recorded(path) if {"-lgc", "-rgc", "-pl"} & set(c)]


# --- the script ------------------------------------------------------------------------


def test_lock_clock(calls: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--gpu", "0", "--lock-sm-clock", "1410"]) == 0
    assert changes(calls) == [LOCK_1410]
    assert "1410 MHz" in capsys.readouterr().out


def test_power_limit_by_uuid(calls: Path) -> None:
    assert main(["--gpu", UUID, "--power-limit", "300"]) == 0
    assert changes(calls) == [["-i", UUID, "-pl", "300"]]


def test_reset_unlocks_and_restores_default_limit(calls: Path) -> None:
    assert main(["--reset", "--gpu", "0"]) == 0
    assert changes(calls) == RESET


def test_bounds_of_power_limit_are_accepted(calls: Path) -> None:
    # [200, 700] W from probe.log's power.min_limit and power.max_limit.
    assert main(["--gpu", "0", "--power-limit", "200"]) == 0
    assert main(["--gpu", "0", "--power-limit", "700"]) == 0
    assert [c[-1] for c in changes(calls)] == ["200", "700"]


def test_nvidia_smi_refusal_is_exit_1(
    calls: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAKE_NVSMI_MODE", "no_permission")
    assert main(["--gpu", "0", "--lock-sm-clock", "1410"]) == 1
    assert "Insufficient Permissions" in capsys.readouterr().err


HOSTILE_SYNTAX = [
    ["--gpu", "0", "--lock-sm-clock", "1;rm -rf /"],
    ["--gpu", "0", "--lock-sm-clock", "$(id)"],
    ["--gpu", "0", "--lock-sm-clock", "-1"],
    ["--gpu", "0", "--lock-sm-clock", "1e3"],
    ["--gpu", "0", "--lock-sm-clock", "0x10"],
    ["--gpu", "0", "--lock-sm-clock", " 1410"],
    ["--gpu", "0", "--lock-sm-clock", "1410 "],
    ["--gpu", "0", "--lock-sm-clock", "+1410"],
    ["--gpu", "0", "--lock-sm-clock", "1410.0"],
    ["--gpu", "0", "--lock-sm-clock", "1_410"],
    ["--gpu", "0", "--lock-sm-clock", "\uff11\uff14\uff11\uff10"],  # full-width digits
    ["--gpu", "0", "--lock-sm-clock", "99999999"],
    ["--gpu", "0", "--lock-sm-clock", "0"],
    ["--gpu", "0", "--power-limit", "-300"],
    ["--gpu", "0;rm -rf /", "--reset"],
    ["--gpu", "$(id)", "--reset"],
    ["--gpu", "-1", "--reset"],
    ["--gpu", "00", "--reset"],
    ["--gpu", "GPU-../../etc/passwd", "--reset"],
    [],
    ["--reset"],
    ["--gpu", "0"],
    ["--gpu", "0", "--reset", "--lock-sm-clock", "1410"],
    ["--gpu", "0", "--lock-sm-clock", "1410", "--power-limit", "300"],
    ["--gpu", "0", "--lock-sm-clock", "1410", "--lock-sm-clock", "1980"],
    ["--gpu", "0", "--gpu", "1", "--reset"],
    ["--gpu", "0", "--reset", "extra"],
    ["--gpu", "0", "--res"],
    ["--gpu=0", "--lock-sm-clock=1410;reboot"],
]


@pytest.mark.parametrize("argv", HOSTILE_SYNTAX, ids=repr)
def test_hostile_arguments_refused_without_calling_nvidia_smi(
    calls: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err
    assert recorded(calls) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpu", "0", "--lock-sm-clock", "1411"],  # between two supported clocks
        ["--gpu", "0", "--lock-sm-clock", "1995"],  # above the 1980 MHz maximum
        ["--gpu", "0", "--lock-sm-clock", "330"],  # below the lowest clock
        ["--gpu", "1", "--reset"],  # the probe machine has GPU 0 only
        ["--gpu", "GPU-00000000-0000-0000-0000-000000000000", "--reset"],
        ["--gpu", "0", "--power-limit", "199"],
        ["--gpu", "0", "--power-limit", "701"],
    ],
    ids=repr,
)
def test_invalid_values_refused_before_any_change(calls: Path, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert recorded(calls), "the checks should have queried nvidia-smi"
    assert changes(calls) == []


def test_script_does_not_import_torch(calls: Path) -> None:
    code = (
        "import sys; from opcost.gpu_setting import main; rc = main(['--gpu', '0', '--reset']); "
        "print(rc, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.splitlines()[-1] == "0 False"


# --- the wrapper -----------------------------------------------------------------------


def test_wrapper_locks_then_resets(calls: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with applied_setting(parse_setting("sm1410"), "0", COMMAND) as setting:
        assert setting.sm_clock_mhz == 1410
        assert changes(calls) == [LOCK_1410]
        assert json.loads(marker_path("0").read_text())["setting"] == "sm1410"
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
    assert changes(calls) == [LOCK_1410, *RESET]
    assert not marker_path("0").exists()
    assert signal.getsignal(signal.SIGTERM) == before


def test_wrapper_resets_after_error_in_block(calls: Path) -> None:
    with pytest.raises(ZeroDivisionError), applied_setting(parse_setting("pl300"), "0", COMMAND):
        _ = 1 / 0
    assert changes(calls) == [["-i", "0", "-pl", "300"], *RESET]
    assert not marker_path("0").exists()


def test_wrapper_default_does_nothing(calls: Path) -> None:
    with applied_setting(parse_setting("default"), UUID, COMMAND) as setting:
        assert setting.kind == "default"
    assert recorded(calls) == []
    assert not marker_path(UUID).exists()


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


@pytest.mark.parametrize("gpu", ["0;reboot", "../0", "", 0])
def test_wrapper_refuses_bad_gpu_before_any_call(calls: Path, gpu: object) -> None:
    with (
        pytest.raises(GpuSettingError, match="neither an index .* nor a UUID"),
        applied_setting(parse_setting("sm1410"), gpu, COMMAND),  # type: ignore[arg-type]
    ):
        pass
    assert recorded(calls) == []


def test_command_as_string_refused(calls: Path) -> None:
    with (
        pytest.raises(GpuSettingError, match="list of arguments"),
        applied_setting(parse_setting("sm1410"), "0", "sudo -n opcost-gpu-setting"),
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


def test_setting_in_a_thread_resets_and_leaves_signals_alone(calls: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with applied_setting(parse_setting("sm1410"), "0", COMMAND):
                assert changes(calls) == [LOCK_1410]
        except BaseException as e:  # reported to the main thread below
            errors.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert errors == []
    assert changes(calls) == [LOCK_1410, *RESET]
    assert signal.getsignal(signal.SIGTERM) == before


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
