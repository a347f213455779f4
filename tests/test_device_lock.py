"""Two profiling jobs never measure on one device at once, whoever runs them."""

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
