"""Profiling efficiency: the sum of timed windows over the profiling stage's wall time.

    python bench/efficiency.py [RAW_DIR]

Default: the committed real H100 sample (tests/data/h100/raw). Reads every benchmark JSON,
and prints the sum of timed windows, the wall time from the first job's start to the last
job's end, their ratio (1.0 is the limit), and the median per-job overhead in seconds
(job wall time minus its timed window).
"""

import json
import statistics
import sys
from pathlib import Path

raw = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/h100/raw")
records = [json.loads(p.read_text()) for p in sorted(raw.rglob("*.json"))]
ok = [r for r in records if r["status"] == "ok"]
timed_s = sum(r["timed_end_unix_s"] - r["timed_start_unix_s"] for r in ok)
wall_s = max(r["finished_unix_s"] for r in records) - min(r["started_unix_s"] for r in records)
in_job = [
    (r["finished_unix_s"] - r["started_unix_s"]) - (r["timed_end_unix_s"] - r["timed_start_unix_s"])
    for r in ok
]
starts = sorted((r["started_unix_s"], r["finished_unix_s"]) for r in records)
between = [b[0] - a[1] for a, b in zip(starts, starts[1:], strict=False)]
print(f"{raw}: {len(records)} jobs ({len(ok)} ok)")
print(f"sum of timed windows   {timed_s:8.1f} s")
print(f"profiling wall time    {wall_s:8.1f} s")
print(f"efficiency             {timed_s / wall_s:8.3f}")
print(f"median overhead in job {statistics.median(in_job):8.3f} s (warm-up, block, logger)")
print(f"median gap between jobs{statistics.median(between):8.3f} s (Snakemake scheduling)")
