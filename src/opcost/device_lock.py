"""One profiling job per device at a time, across the threads and processes of a host.

A measurement needs its device to itself: a second job on the same GPU would share its
time, its power draw and its clocks, and the log could not tell. Snakemake's resource
``gpu=1`` (profiles/default) keeps jobs apart only when the user's profile has it; on a
cluster the SLURM plugin runs a batch of profiling jobs in one Snakemake process whose
resources are not limited at all. So each profiling job also takes this lock, an
exclusive ``flock`` on a file named after the device, held for the whole job (setting,
numerics, measurement and restore).

``flock`` locks belong to an open file description: two threads of one process that each
open the file exclude each other, like two processes. The kernel drops the lock when the
holder dies, also by SIGKILL, so a killed job never leaves a stale lock behind.

Locks live in ``$OPCOST_LOCK_DIR``, or else in ``<tmp>/opcost-<uid>``: node-local (a
lock on a network file system may not work, and GPUs are per node), per user (SLURM gives
GPUs to one job at a time; on a shared workstation a user cannot lock another's GPU).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from opcost.errors import OpcostError


class DeviceLockError(OpcostError, RuntimeError):
    """The lock directory is unusable (not ours, or not a directory)."""


def lock_dir() -> Path:
    """``$OPCOST_LOCK_DIR``, or ``<tmp>/opcost-<uid>``, created private to the user."""
    configured = os.environ.get("OPCOST_LOCK_DIR")
    path = Path(configured) if configured else Path(tempfile.gettempdir()) / f"opcost-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    # In a shared /tmp another user could create the directory first (or a symlink to
    # elsewhere) and so see or block our locks.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise DeviceLockError(
            f"lock directory {path} is not a directory owned by you; remove it or set "
            "OPCOST_LOCK_DIR to a directory of your own on this node"
        )
    return path


def lock_path(device_key: str) -> Path:
    """The lock file of a device; ``device_key`` is a GPU UUID, or ``cpu``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", device_key)
    if not safe.strip("._"):
        raise ValueError(f"device key {device_key!r} makes no file name")
    return lock_dir() / f"device-{safe}.lock"


@contextlib.contextmanager
def exclusive(device_key: str) -> Iterator[float]:
    """Hold the device's lock for the ``with`` block; yields the seconds spent waiting.

    Blocks until every other holder on this host (thread or process) has let go.
    """
    path = lock_path(device_key)
    waited_from = time.monotonic()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        waited_s = time.monotonic() - waited_from
        # For a person wondering who holds it: the pid of the last holder.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield waited_s
    finally:
        # Closing the descriptor releases the lock.
        os.close(fd)
