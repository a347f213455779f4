"""Two profiling jobs never measure on one device at once, whoever runs them."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from opcost import device_lock, profile
from opcost.config import GpuConfig
from opcost.names import parse_setting

ADD_SPEC = {
    "kind": "function",
    "type": "torch.add",
    "args": [{"__tensor__": 0}, {"__tensor__": 1}],
    "kwargs": {},
    "inputs": [
        {"shape": [64, 64], "dtype": "float32", "param": False},
        {"shape": [64, 64], "dtype": "float32", "param": False},
    ],
    "outputs": [{"shape": [64, 64], "dtype": "float32"}],
}
CPU = GpuConfig("cpu", "cpu", True, "float32", (parse_setting("default"),), None, None)


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OPCOST_LOCK_DIR", str(tmp_path / "locks"))


def _job(tmp_path, name):
    return profile.profile_job(
        kind="op",
        gpu=CPU,
        setting=parse_setting("default"),
        mode="inference",
        profile_config={"min_run_time_s": 0.3, "warmup_s": 0.05},
        csv_path=tmp_path / f"{name}.csv",
        json_path=tmp_path / f"{name}.json",
        spec=ADD_SPEC,
        op_id=f"{name:0>16}",
    )


def test_profiling_jobs_in_threads_of_one_process_take_turns(tmp_path):
    # As in a SLURM batch: one Snakemake process runs its jobs in threads, with no
    # resource limit of its own.
    records = {}
    threads = [
        threading.Thread(target=lambda n=n: records.update({n: _job(tmp_path, n)}))
        for n in ("a", "b", "c")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = sorted((r["started_unix_s"], r["finished_unix_s"]) for r in records.values())
    assert len(spans) == 3
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end
    # Each measures >= 0.3 s, so whoever came last waited for at least two of them.
    assert max(r["device_lock_wait_s"] for r in records.values()) >= 0.6


HOLD = """
import sys, time
from opcost import device_lock
with device_lock.exclusive(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def _holder(key):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, key], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_lock_held_by_another_process_blocks_until_it_dies_even_by_sigkill():
    proc = _holder("GPU-1234")
    acquired = threading.Event()

    def take():
        with device_lock.exclusive("GPU-1234"):
            acquired.set()

    taker = threading.Thread(target=take)
    taker.start()
    assert not acquired.wait(1.0)  # the other process holds it
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    # The kernel dropped the dead holder's lock: no stale lock to clean up.
    assert acquired.wait(10.0)
    taker.join()


def test_different_devices_do_not_wait_for_each_other():
    proc = _holder("GPU-aaaa")
    try:
        started = time.monotonic()
        with device_lock.exclusive("GPU-bbbb") as waited_s:
            pass
        assert waited_s < 0.5
        assert time.monotonic() - started < 2.0
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_lock_dir_that_is_a_symlink_is_refused(tmp_path, monkeypatch):
    # In a shared /tmp, someone else's symlink must not take our locks elsewhere.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    link.symlink_to(elsewhere)
    monkeypatch.setenv("OPCOST_LOCK_DIR", str(link))
    with pytest.raises(device_lock.DeviceLockError, match="OPCOST_LOCK_DIR"):
        device_lock.lock_path("cpu")


@pytest.mark.parametrize("key", ["", "..", "/"])
def test_keys_that_make_no_file_name_are_refused(key):
    with pytest.raises(ValueError, match="makes no file name"):
        device_lock.lock_path(key)


def test_key_cannot_leave_the_lock_dir():
    path = device_lock.lock_path("../../etc/passwd")
    assert path.parent == device_lock.lock_dir()


def test_a_duplicate_of_a_job_measures_nothing_and_overwrites_nothing(tmp_path, capfd, monkeypatch):
    # Issue 20: the same profiling job submitted twice at once. The device lock makes
    # them take turns; the second then finds the pair complete and leaves it as it is.
    measured = []
    real_measure = profile._measure_into

    def counted(*args, **kwargs):
        measured.append(1)
        return real_measure(*args, **kwargs)

    monkeypatch.setattr(profile, "_measure_into", counted)
    records = []
    threads = [
        threading.Thread(target=lambda: records.append(_job(tmp_path, "same"))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    written = json.loads((tmp_path / "same.json").read_text())
    assert len(records) == 2
    assert len(measured) == 1
    # Both return the one measurement on disk: the same start time, to the microsecond.
    assert [r["started_unix_s"] for r in records] == [written["started_unix_s"]] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locks", "same.csv", "same.json"]
    assert "same.json and its CSV were already measured by another job" in capfd.readouterr().err


def test_a_pair_published_during_the_measurement_is_kept(tmp_path, monkeypatch):
    # A duplicate on another GPU (so under another lock) publishes the pair while this job
    # measures: here the first job's pair is there, and this job's check before measuring
    # is made to miss it, as it would had the duplicate not finished yet.
    first = _job(tmp_path, "same")
    real_measured_pair = profile.measured_pair
    calls = []

    def missed_before_measuring(csv_path, json_path):
        calls.append(json_path)
        return None if len(calls) == 1 else real_measured_pair(csv_path, json_path)

    monkeypatch.setattr(profile, "measured_pair", missed_before_measuring)
    second = _job(tmp_path, "same")
    assert len(calls) == 2  # it measured, then checked again before publishing
    assert second["started_unix_s"] == first["started_unix_s"]
    written = json.loads((tmp_path / "same.json").read_text())
    assert written["started_unix_s"] == first["started_unix_s"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locks", "same.csv", "same.json"]
