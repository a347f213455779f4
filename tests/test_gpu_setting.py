"""The privileged GPU-setting script and the job-side wrapper, against the fake nvidia-smi.

What nvidia-smi was asked to do is read back from the fake's call record; the H100's
supported clocks and default limit (700 W) come from tests/data/h100_probe/probe.log.
The ``calls`` fixture is in tests/conftest.py. What happens on errors, SIGTERM, SIGKILL
and a stale marker is tested in tests/test_faults.py; the refusal of hostile arguments in
tests/test_security.py. ``--require-job-gpu`` (the GPU must be one of the caller's SLURM
job) is tested at the end.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import changes, recorded

from opcost.gpu_setting import GpuSettingError, applied_setting, marker_path
from opcost.gpu_setting_script import main
from opcost.names import parse_setting

UUID = "GPU-57781e38-0b78-5d74-ed7b-e2db6ddbacd3"
COMMAND = (sys.executable, "-m", "opcost.gpu_setting_script")
LOCK_1410 = ["-i", "0", "-lgc", "1410,1410"]
RESET = [["-i", "0", "-rgc"], ["-i", "0", "-pl", "700"]]


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


def test_script_does_not_import_torch(calls: Path) -> None:
    code = (
        "import sys; from opcost.gpu_setting_script import main; "
        "rc = main(['--gpu', '0', '--reset']); "
        "print(rc, 'torch' in sys.modules, 'pandas' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.splitlines()[-1] == "0 False False"


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


def test_wrapper_default_does_nothing(calls: Path) -> None:
    with applied_setting(parse_setting("default"), UUID, COMMAND) as setting:
        assert setting.kind == "default"
    assert recorded(calls) == []
    assert not marker_path(UUID).exists()


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


# --- --require-job-gpu: only a GPU the caller's SLURM job holds ------------------------------

OTHER_UUID = "GPU-00000000-1111-2222-3333-444444444444"


def _job_env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        if name in values:
            monkeypatch.setenv(name, values[name])
        else:
            monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("gpu", "job"),
    [
        ("0", {"SLURM_JOB_GPUS": "0"}),
        ("0", {"SLURM_JOB_GPUS": "3,0"}),
        (UUID, {"SLURM_JOB_GPUS": "0"}),  # the fake's GPU 0 has this UUID (nvidia-smi -L)
        ("0", {"CUDA_VISIBLE_DEVICES": UUID}),
        (UUID, {"CUDA_VISIBLE_DEVICES": "0"}),
    ],
    ids=repr,
)
def test_job_check_allows_a_gpu_of_the_job(
    calls: Path, monkeypatch: pytest.MonkeyPatch, gpu: str, job: dict[str, str]
) -> None:
    _job_env(monkeypatch, **job)
    assert main(["--require-job-gpu", "--gpu", gpu, "--lock-sm-clock", "1410"]) == 0
    assert changes(calls) == [["-i", gpu, "-lgc", "1410,1410"]]


@pytest.mark.parametrize(
    ("job", "why"),
    [
        ({"SLURM_JOB_GPUS": "1"}, "not one of the caller's job's GPUs (SLURM_JOB_GPUS='1')"),
        ({"SLURM_JOB_GPUS": "1,2,3"}, "not one of the caller's job's GPUs"),
        ({"SLURM_JOB_GPUS": ""}, "not one of the caller's job's GPUs"),
        # SLURM_JOB_GPUS wins: CUDA_VISIBLE_DEVICES may count within the job's own GPUs.
        ({"SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0"}, "SLURM_JOB_GPUS='1'"),
        ({"CUDA_VISIBLE_DEVICES": OTHER_UUID}, "not one of the caller's job's GPUs"),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, "'NoDevFiles' is neither a GPU index"),
        ({}, "none of SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES is set"),
    ],
    ids=repr,
)
def test_job_check_refuses_a_gpu_outside_the_job(
    calls: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    job: dict[str, str],
    why: str,
) -> None:
    _job_env(monkeypatch, **job)
    for action in (["--lock-sm-clock", "1410"], ["--power-limit", "300"], ["--reset"]):
        with pytest.raises(SystemExit) as info:
            main(["--require-job-gpu", "--gpu", "0", *action])
        assert info.value.code == 2
        assert why in capsys.readouterr().err
    assert changes(calls) == []


def test_job_check_is_off_by_default(calls: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _job_env(monkeypatch, SLURM_JOB_GPUS="1")
    assert main(["--gpu", "0", "--lock-sm-clock", "1410"]) == 0
    assert changes(calls) == [LOCK_1410]


def test_job_check_through_the_setting_command(
    calls: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a study configures it: setting_command: [sudo, -n, opcost-gpu-setting, --require-job-gpu]
    command = (*COMMAND, "--require-job-gpu")
    _job_env(monkeypatch, SLURM_JOB_GPUS="0")
    with applied_setting(parse_setting("sm1410"), UUID, command):
        pass
    assert changes(calls) == [
        ["-i", UUID, "-lgc", "1410,1410"],
        ["-i", UUID, "-rgc"],
        ["-i", UUID, "-pl", "700"],
    ]
    _job_env(monkeypatch, SLURM_JOB_GPUS="1")
    with (
        pytest.raises(GpuSettingError, match="not one of the caller's job's GPUs"),
        applied_setting(parse_setting("sm1410"), UUID, command),
    ):
        pass
    assert len(changes(calls)) == 3
