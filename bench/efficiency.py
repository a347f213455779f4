"""Profiling efficiency: the sum of timed windows over the profiling stage's wall time.

    python bench/efficiency.py [RAW_DIR | RAW_TAR_GZ] [--max-gap-s S]

Default: the committed real H100 sample (tests/data/h100/raw). A ``.tar.gz`` (a committed
study's ``raw_and_logs.tar.gz``, e.g. data/hopper/h100/) is read without unpacking
it to disk. Reads every benchmark JSON,
and prints the sum of timed windows, the profiling wall time, their ratio (1.0 is the
limit), and the median per-job overhead in seconds (job wall time minus its timed window).

The wall time runs from the first job's start to the last job's end, less any pause
between two jobs longer than ``--max-gap-s`` (default 30 s): a study profiled in several
runs (stopped and resumed, as on a GPU host lent 10 minutes at a time) is timed by its
runs, not by the hours between them. The pauses left out are printed, and each run's
own figures (a run whose measurements were partly deleted and remeasured later shows
low: its wall time still holds the deleted jobs).
"""

import argparse
import json
import statistics
import tarfile
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("raw", nargs="?", default="tests/data/h100/raw", type=Path)
parser.add_argument("--max-gap-s", type=float, default=30.0)
args = parser.parse_args()
if args.raw.name.endswith(".tar.gz"):
    with tarfile.open(args.raw) as tar:
        members = sorted(
            (m for m in tar.getmembers() if m.isfile() and m.name.endswith(".json")),
            key=lambda m: m.name,
        )
        # Benchmark JSONs only: the raw results, not the logs beside them.
        records = [
            json.load(tar.extractfile(m)) for m in members if m.name.startswith("results/raw/")
        ]
else:
    records = [json.loads(p.read_text()) for p in sorted(args.raw.rglob("*.json"))]
if not records:
    raise SystemExit(f"{args.raw}: no benchmark JSON files")
ok = [r for r in records if r["status"] == "ok"]
timed_s = sum(r["timed_end_unix_s"] - r["timed_start_unix_s"] for r in ok)
in_job = [
    (r["finished_unix_s"] - r["started_unix_s"]) - (r["timed_end_unix_s"] - r["timed_start_unix_s"])
    for r in ok
]
spans = sorted((r["started_unix_s"], r["finished_unix_s"]) for r in records)
between = [b[0] - a[1] for a, b in zip(spans, spans[1:], strict=False)]
pauses = [g for g in between if g > args.max_gap_s]
wall_s = spans[-1][1] - spans[0][0] - sum(pauses)
print(f"{args.raw}: {len(records)} jobs ({len(ok)} ok)")
print(f"sum of timed windows   {timed_s:8.1f} s")
print(f"profiling wall time    {wall_s:8.1f} s", end="")
print(f" (less {len(pauses)} pauses between runs, {sum(pauses):.0f} s)" if pauses else "")
print(f"efficiency             {timed_s / wall_s:8.3f}")
print(f"median overhead in job {statistics.median(in_job):8.3f} s (warm-up, block, logger)")
print(f"median gap between jobs{statistics.median(between):8.3f} s (Snakemake scheduling)")
if pauses:
    print("per run (split at the pauses):")
    runs, current = [], [0]
    for i, gap in enumerate(between, start=1):
        if gap > args.max_gap_s:
            runs.append(current)
            current = []
        current.append(i)
    runs.append(current)
    ordered = sorted(records, key=lambda r: r["started_unix_s"])
    for n, members in enumerate(runs, start=1):
        run = [ordered[i] for i in members]
        run_wall = max(r["finished_unix_s"] for r in run) - min(r["started_unix_s"] for r in run)
        run_timed = sum(
            r["timed_end_unix_s"] - r["timed_start_unix_s"] for r in run if r["status"] == "ok"
        )
        print(
            f"  run {n}: {len(run):5d} jobs, timed {run_timed:7.1f} s, wall {run_wall:7.1f} s, "
            f"efficiency {run_timed / run_wall:.3f}"
        )
