"""The measurement worker (opcost.worker): a process of its own for the profiling jobs.

Every test starts real worker processes (``python -m opcost.worker``) and talks to them
through the real protocol; the measurements are real ones on the CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from test_harness import CONV_SPEC

from opcost import worker
from opcost.config import GpuConfig
from opcost.names import Setting, parse_setting

CPU = GpuConfig("cpu", "cpu", True, "float32", (parse_setting("default"),), None, None)


@pytest.fixture
def client():
    w = worker.Worker()
    yield w
    w.close()


def profile_kwargs(tmp_path: Path, min_run_time_s: float) -> dict:
    return dict(
        kind="op",
        gpu=CPU,
        setting=parse_setting("default"),
        mode="inference",
        profile_config={"min_run_time_s": min_run_time_s, "warmup_s": 0.05},
        csv_path=str(tmp_path / "op.csv"),
        json_path=str(tmp_path / "op.json"),
        spec=CONV_SPEC,
        op_id="conv",
    )


def wait_for(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_calls_run_in_one_other_process(client):
    first = client.call("opcost.worker:ping")
    assert first != os.getpid()
    assert client.pid == first
    # Reused: the second call finds the same process.
    assert client.call("opcost.worker:ping") == first
    # Arguments and results travel as they are.
    assert client.call("opcost.names:parse_setting", text="sm1410") == Setting("sm1410", "sm", 1410)


def test_a_measurement_in_the_worker_writes_its_record(client, tmp_path):
    record = client.call("opcost.profile:profile_job", **profile_kwargs(tmp_path, 0.1))
    assert record["status"] == "ok"
    assert record["total_time_s"] >= 0.1
    assert json.loads((tmp_path / "op.json").read_text()) == record


def test_an_exception_comes_back_with_its_type_message_and_where(client):
    with pytest.raises(ValueError, match="bogus") as info:
        client.call("opcost.names:parse_setting", text="bogus")
    assert any("measurement worker" in note for note in info.value.__notes__)
    # The worker survives a failed request.
    assert client.call("opcost.worker:ping") == client.pid


def test_only_opcost_functions_run(client):
    with pytest.raises(ValueError, match="opcost functions"):
        client.call("os:getpid")


def test_what_the_code_prints_cannot_corrupt_an_answer(client, capfd):
    # `opcost extract` prints its table on stdout; in the worker that goes to stderr.
    code = client.call(
        "opcost.cli:main", argv=["extract", "--model", "squeezenet1_1", "--input", "1,3,32,32"]
    )
    assert code == 0
    assert "distinct operations" in capfd.readouterr().err
    assert client.call("opcost.worker:ping") == client.pid


def test_a_worker_killed_between_jobs_is_replaced(client):
    first = client.call("opcost.worker:ping")
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: client.pid is None)
    second = client.call("opcost.worker:ping")
    assert second not in (first, os.getpid())


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGKILL, -9)])
def test_a_worker_killed_mid_job_fails_the_job_and_leaves_no_output(client, tmp_path, sig, code):
    pid = client.call("opcost.worker:ping")
    errors: list[BaseException] = []

    def job():
        try:
            client.call("opcost.profile:profile_job", **profile_kwargs(tmp_path, 60.0))
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=job)
    thread.start()
    # Killed while measuring: the power-log stand-in (temporary CSV) exists by then.
    wait_for(lambda: any(tmp_path.glob(".op.csv.tmp-*")))
    os.kill(pid, sig)
    thread.join(timeout=60)
    assert not thread.is_alive()
    (error,) = errors
    assert isinstance(error, worker.WorkerError)
    assert f"exited with code {code}" in str(error)
    if sig == signal.SIGTERM:
        # SIGTERM unwinds the job: its temporary files go too.
        assert list(tmp_path.iterdir()) == []
    else:
        assert not (tmp_path / "op.json").exists()
        assert not (tmp_path / "op.csv").exists()
    # The next job gets a new worker.
    assert client.call("opcost.worker:ping") != pid


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "mid-job"])
def test_the_worker_ends_when_its_parent_dies(tmp_path, busy):
    # A parent that starts a worker, reports its pid, and is then killed outright: while
    # the worker waits for a request, or in the middle of a 60 s measurement.
    script = textwrap.dedent(
        f"""
        import sys, time
        from opcost import worker
        from opcost.config import GpuConfig
        from opcost.names import parse_setting
        print(worker.call("opcost.worker:ping"), flush=True)
        if {busy}:
            worker.call(
                "opcost.profile:profile_job", kind="op",
                gpu=GpuConfig("cpu", "cpu", True, "float32", (), None, None),
                setting=parse_setting("default"), mode="inference",
                profile_config={{"min_run_time_s": 60.0, "warmup_s": 0.05}},
                csv_path="{tmp_path}/op.csv", json_path="{tmp_path}/op.json",
                spec={CONV_SPEC!r}, op_id="conv",
            )
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        if busy:
            wait_for(lambda: any(tmp_path.glob(".op.csv.tmp-*")))
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        wait_for(lambda: not _alive(child), timeout_s=15)
        # Mid-job, it unwound the job (SIGTERM to itself): nothing left behind.
        assert list(tmp_path.iterdir()) == []
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][0] != "Z"


# --- issue 20: SIGTERM ------------------------------------------------------------------


def test_a_stopped_client_starts_no_further_measurement(client):
    """Issue 20: once SIGINT or SIGTERM has stopped a process's measurement, a job that
    Snakemake starts afterwards (it may be selecting one as the signal comes) measures
    nothing: no worker starts, and the job fails at once."""
    client.interrupt()
    with pytest.raises(worker.WorkerError, match="measurement not started"):
        client.call("opcost.worker:ping")
    assert client.pid is None
