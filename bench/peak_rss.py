"""Run a command and print the peak resident memory of its whole process tree.

SLURM charges a job's memory request against the sum over its processes (the batch's
Snakemake and its measurement worker, for a profiling batch), which ``/usr/bin/time``
does not give: it reports the largest single process. This samples ``/proc`` every
``--interval-s`` and prints the peak of the sum, in MB, for sizing ``mem_mb`` in
``profiles/slurm/config.yaml`` (docs/slurm.md, "Memory").

Usage::

    python bench/peak_rss.py -- snakemake results/raw/... --configfile study.yaml --cores 4
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return kids


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kb(root: int) -> tuple[int, int]:
    """Sum of VmRSS over ``root`` and all its descendants, and how many processes."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo += _children(pid)
    return sum(_rss_kb(p) for p in seen), len(seen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval-s", type=float, default=0.1)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    start_s = time.monotonic()
    proc = subprocess.Popen(command)
    peak_kb, peak_n = 0, 0
    while proc.poll() is None:
        kb, n = tree_rss_kb(proc.pid)
        if kb > peak_kb:
            peak_kb, peak_n = kb, n
        time.sleep(args.interval_s)
    print(
        f"peak_rss_mb={peak_kb / 1024:.0f} processes_at_peak={peak_n} "
        f"wall_s={time.monotonic() - start_s:.0f} exit={proc.returncode} "
        f"command={' '.join(command)[:200]}",
        file=sys.stderr,
        flush=True,
    )
    return proc.returncode


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
