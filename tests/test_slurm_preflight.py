"""The pre-flight check of a run through the SLURM plugin (opcost.slurm).

Where the cluster keeps no accounting, ``sacct`` cannot answer, and a run whose plugin
asks ``sacct`` for job states would wait forever. The check must stop such a run before
it submits anything, with one line that names the fix. The fakes in tests/fakes/slurm
replay the answers recorded on the test cluster (slurm-wlm 22.05.8 without accounting);
the tests marked ``slurm`` run against the real one (``.ci/slurm-up.sh``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from slurm import conftest_helpers as helpers

from opcost import slurm as preflight

REPO_ROOT = Path(__file__).resolve().parents[1]
FAKE_SLURM = REPO_ROOT / "tests" / "fakes" / "slurm"
TINY_STUDY = REPO_ROOT / "tests" / "data" / "configs" / "tiny.yaml"
# Parsing the workflow and loading the study take well under a minute here; a run that
# reaches this limit is waiting for job states that never come.
RUN_TIMEOUT_S = 300
#: The first words of the message for a status command of sacct without accounting.
SACCT_MESSAGE = "opcost: the SLURM plugin's status command is sacct, but sacct exits with code 1"


@pytest.fixture
def fake_slurm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The fake SLURM commands first on PATH; returns the file that records their calls."""
    python_dir = Path(sys.executable).parent
    monkeypatch.setenv(
        "PATH", os.pathsep.join([str(FAKE_SLURM), str(python_dir), os.environ["PATH"]])
    )
    for name in ("FAKE_SACCT_MODE", "FAKE_SCONTROL_MIN_JOB_AGE"):
        monkeypatch.delenv(name, raising=False)
    calls = tmp_path / "slurm-calls.jsonl"
    monkeypatch.setenv("FAKE_SLURM_CALLS", str(calls))
    return calls


def _calls(path: Path) -> list[list[str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_sacct_without_accounting_stops_with_the_fix(fake_slurm: Path) -> None:
    message = preflight.preflight_problem("sacct")
    assert message is not None
    assert "\n" not in message
    # The recorded answer of sacct, the consequence and the fix, in one line.
    assert "sacct exits with code 1: Slurm accounting storage is disabled" in message
    assert "wait forever" in message
    assert "`slurm-status-command: squeue`" in message
    assert "profiles/slurm/config.yaml" in message
    # It asked sacct as the plugin does: the main job only, parsable, by job name.
    (call,) = _calls(fake_slurm)
    assert call[:3] == ["sacct", "-X", "--parsable2"]
    assert call[-2:] == ["--name", preflight.PROBE_JOB_NAME]


def test_sacct_that_answers_passes(fake_slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SACCT_MODE", "ok")
    assert preflight.preflight_problem("sacct") is None


def test_sacct_that_hangs_is_a_problem_after_the_timeout(
    fake_slurm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_SACCT_MODE", "hang")
    start_s = time.monotonic()
    message = preflight.preflight_problem("sacct", timeout_s=1.0)
    assert time.monotonic() - start_s < 10
    assert message is not None
    assert "sacct did not answer within 1 s" in message


def test_squeue_with_a_long_min_job_age_passes_without_asking_sacct(fake_slurm: Path) -> None:
    # The recorded config: MinJobAge 7200 s >= 3 x 40 s, so the plugin keeps squeue.
    assert preflight.min_job_age_s() == 7200
    assert preflight.preflight_problem("squeue") is None
    # Two reads of the config (above, and the check's own), no sacct.
    assert [c[0] for c in _calls(fake_slurm)] == ["scontrol", "scontrol"]


def test_squeue_with_a_short_min_job_age_falls_back_to_sacct_and_stops(
    fake_slurm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MinJobAge 60 s < 3 x 40 s: plugin 2.8.0 then queries sacct, which cannot answer.
    monkeypatch.setenv("FAKE_SCONTROL_MIN_JOB_AGE", "60")
    message = preflight.preflight_problem("squeue", 40)
    assert message is not None
    assert "\n" not in message
    assert "MinJobAge is 60 s, below 3 x slurm-init-seconds-before-status-checks (120 s)" in (
        message
    )
    assert "Slurm accounting storage is disabled" in message
    # With a first check after 20 s (3 x 20 = 60 s <= MinJobAge) squeue stays.
    assert preflight.preflight_problem("squeue", 20) is None


@pytest.mark.parametrize(
    ("configured", "age_s", "init_s", "sacct_on_path", "used"),
    [
        ("sacct", 7200, 40, True, "sacct"),
        ("sacct", 7200, 40, False, "squeue"),
        ("squeue", 7200, 40, True, "squeue"),
        ("squeue", 119, 40, True, "sacct"),
        ("squeue", 120, 40, True, "squeue"),
        ("squeue", None, 40, True, "sacct"),
        ("squeue", None, 40, False, "squeue"),
    ],
)
def test_status_command_used_follows_the_plugin(
    configured: str, age_s: int | None, init_s: int, sacct_on_path: bool, used: str
) -> None:
    # Plugin 2.8.0, Executor.check_active_jobs: squeue -> sacct when sacct is installed
    # and MinJobAge is None or < 3 * init_seconds_before_status_checks; sacct -> squeue
    # when sacct is not installed.
    assert (
        preflight.status_command_used(
            configured, min_job_age_s=age_s, init_seconds=init_s, sacct_on_path=sacct_on_path
        )
        == used
    )


def _workflow(executor: str, status_command: str, main: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        executor_plugin=SimpleNamespace(name=executor),
        executor_settings=SimpleNamespace(
            status_command=status_command, init_seconds_before_status_checks=40
        ),
        is_main_process=main,
    )


def test_check_run_stops_only_the_main_process_of_a_slurm_run(fake_slurm: Path) -> None:
    with pytest.raises(SystemExit) as stop:
        preflight.check_run(_workflow("slurm", "sacct"))
    assert str(stop.value.code).startswith(SACCT_MESSAGE)
    # Local runs, the batch processes inside SLURM jobs: nothing is asked.
    preflight.check_run(_workflow("local", "sacct"))
    preflight.check_run(_workflow("slurm-jobstep", "sacct"))
    preflight.check_run(_workflow("slurm", "sacct", main=False))
    preflight.check_run(SimpleNamespace(executor_plugin=None))
    assert len(_calls(fake_slurm)) == 1


def test_profile_sets_the_status_command_in_its_edit_block() -> None:
    text = (REPO_ROOT / "profiles" / "slurm" / "config.yaml").read_text()
    start = text.index("EDIT FOR YOUR CLUSTER")
    end = text.index("# =====", start + 100)
    assert f"\n{preflight.STATUS_COMMAND_KEY}: sacct\n" in text[start:end]
    assert "squeue" in text[start:end]
    assert yaml.safe_load(text)[preflight.STATUS_COMMAND_KEY] == "sacct"


def _shipped_status_profile(tmp_path: Path) -> Path:
    """The users' profile edited for the test cluster, but with the status command as
    shipped (sacct)."""
    return helpers.make_test_profile(tmp_path, status_command=None)


def _run_study(profile: Path, workdir: Path, env: dict[str, str]) -> tuple[str, int, float]:
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO_ROOT / "Snakefile"),
        "--profile",
        str(profile),
        "--directory",
        str(workdir),
        "--configfile",
        str(TINY_STUDY),
    ]
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT / "tests"), env.get("PYTHONPATH")) if p)
    start_s = time.monotonic()
    proc = subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        env={**env, "PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    return proc.stdout + proc.stderr, proc.returncode, time.monotonic() - start_s


@pytest.mark.slow
def test_run_with_sacct_and_no_accounting_stops_before_submitting(
    fake_slurm: Path, tmp_path: Path
) -> None:
    profile = _shipped_status_profile(tmp_path)
    workdir = tmp_path / "work"
    workdir.mkdir()
    log, returncode, _ = _run_study(profile, workdir, dict(os.environ))
    assert returncode == 1, log[-4000:]
    lines = [line for line in log.splitlines() if line.startswith("opcost: ")]
    assert len(lines) == 1, log[-4000:]
    assert lines[0].startswith(SACCT_MESSAGE)
    # The fake sbatch refuses and records every submission: there was none.
    assert "sbatch" not in {c[0] for c in _calls(fake_slurm)}
    assert not (workdir / "results").exists()


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm_cluster")
def test_real_cluster_without_accounting_fails_sacct_and_passes_squeue() -> None:
    # The test cluster keeps no accounting and MinJobAge 7200 s (.ci/slurm-up.sh).
    message = preflight.preflight_problem("sacct")
    assert message is not None
    assert "Slurm accounting storage is disabled" in message
    assert preflight.preflight_problem("squeue", 2) is None


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.usefixtures("slurm_cluster")
def test_real_run_with_the_shipped_status_command_fails_fast(tmp_path: Path) -> None:
    profile = _shipped_status_profile(tmp_path)
    workdir = tmp_path / "work"
    workdir.mkdir()
    log, returncode, elapsed_s = _run_study(profile, workdir, dict(os.environ))
    assert returncode == 1, log[-4000:]
    lines = [line for line in log.splitlines() if line.startswith("opcost: ")]
    assert len(lines) == 1, log[-4000:]
    assert lines[0].startswith(SACCT_MESSAGE)
    assert helpers.submissions(log) == []
    # Nothing reached the controller under the run's name (its jobs would carry it).
    run_id = next(line.split()[-1] for line in log.splitlines() if "SLURM run ID:" in line)
    queued = subprocess.run(
        ["squeue", "-h", "--states=all", "--name", run_id, "-o", "%i"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert queued.strip() == ""
    assert elapsed_s < RUN_TIMEOUT_S
