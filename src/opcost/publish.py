"""How opcost publishes a job's output files: whole and protected, or not at all.

A job writes each file under its staged name (:func:`opcost.io.staged_path`) and syncs it
to disk (:func:`write_synced`); :func:`publish_read_only` then makes the files read-only
and renames them into place, in order, with SIGTERM and SIGINT held until the last one is
in place, so an interrupted or crashed job never leaves a partial file, or a partial set,
that looks complete. :func:`collecting_own_garbage` frees what a job made, and only
that, when it ends.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path


def write_synced(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (its directory created) and flush it to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive in the block take effect when it ends (main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, frame: held.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(held):
            signal.raise_signal(sig)


def publish_read_only(moves: list[tuple[Path, Path]]) -> None:
    """Make each staged file read-only (0444) and rename it to its final name, in order.

    The raw logs are the study's ground truth: the job itself leaves them protected, so
    they are protected also when Snakemake cannot protect them (interrupted before it
    records the job as finished). A SIGINT or SIGTERM meanwhile waits until every file is
    in place, so an interrupted job leaves all of its files or none.
    """
    with signals_held():
        for staged, final in moves:
            os.chmod(staged, 0o444)
            os.replace(staged, final)


@contextlib.contextmanager
def collecting_own_garbage() -> Iterator[None]:
    """At the end, collect the cyclic garbage made since the start, and only that.

    The job's workload must be freed before ``empty_cache`` hands its GPU memory back. A
    plain ``gc.collect()`` would also scan every object the process had before: in the
    Snakemake process that runs the jobs, the DAG of the study, which took about 0.1 s
    per job. ``gc.freeze()`` sets those aside for the job; ``gc.unfreeze()`` returns
    them to the collector's oldest generation afterwards.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.collect()
        gc.unfreeze()
