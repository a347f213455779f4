"""Where does a profiling job's time go outside its timed window?

    python bench/job_overhead.py [--ops N] [--ops-table PARQUET] [--heap-objects N]

Runs :func:`opcost.profile.profile_job` in this process on the first ``--ops`` operations
of an op table (default: the issue #9 study's, data/hopper/ops/unique.parquet),
in both modes, on the local GPU (on the CPU without one: time only, no loggers), with the
study's profile settings (config/hopper.yaml). Each step of the job is wrapped with a
wall clock, and the median seconds per job of each step are printed, next to the timed
window and the job's whole wall time: the remainder is the steps not listed (device lock,
record, Python).

``--heap-objects N`` first allocates N small linked Python objects that live for the
whole run, as Snakemake's DAG does in the process that runs the profiling jobs, so that
the cost of the garbage collector over a large heap shows as it does in the pipeline.

Results go to a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

from opcost import gpu_setting, harness, nvml, nvsmi_logger, profile
from opcost.config import GpuConfig
from opcost.names import parse_setting

REPO = Path(__file__).resolve().parents[1]
STEPS: dict[str, float] = collections.defaultdict(float)


def _timed(name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            STEPS[name] += time.perf_counter() - t0

    return wrapper


def _instrument() -> None:
    nvml.EnergyCounter.__init__ = _timed("NVML energy counter open", nvml.EnergyCounter.__init__)
    nvml.EnergyCounter.close = _timed("NVML energy counter close", nvml.EnergyCounter.close)
    logger = nvsmi_logger.PowerLogger
    logger.start = _timed("nvidia-smi loggers start", logger.start)
    logger.stop = _timed("nvidia-smi loggers stop", logger.stop)
    gpu_setting.recover_stale_setting = _timed(
        "GPU setting check", gpu_setting.recover_stale_setting
    )
    harness.prepare_op = _timed("build block and inputs", harness.prepare_op)
    harness.measure = _timed("measure (warm-up + timed)", harness.measure)
    gc.collect = _timed("gc.collect after the job", gc.collect)
    torch.cuda.empty_cache = _timed("empty_cache", torch.cuda.empty_cache)
    profile.write_synced = _timed("write JSON", profile.write_synced)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=40)
    parser.add_argument("--ops-table", type=Path, default=REPO / "data/hopper/ops/unique.parquet")
    parser.add_argument("--config", type=Path, default=REPO / "config/hopper.yaml")
    parser.add_argument("--heap-objects", type=int, default=0)
    args = parser.parse_args(argv)

    heap = [[i, None] for i in range(args.heap_objects)]
    for a, b in zip(heap, heap[1:], strict=False):
        a[1] = b  # linked, so the collector has to follow them
    profile_config = yaml.safe_load(args.config.read_text()).get("profile") or {}
    ops = pd.read_parquet(args.ops_table).head(args.ops)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = GpuConfig(
        name="bench",
        device=device,
        tf32=True,
        dtype="float32",
        settings=(parse_setting("default"),),
        slurm_gpu_model=None,
        slurm_constraint=None,
    )
    _instrument()
    per_job: dict[str, list[float]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("inference", "training"):
            for row in ops.itertuples():
                STEPS.clear()
                t0 = time.perf_counter()
                record = profile.profile_job(
                    kind="op",
                    gpu=gpu,
                    setting=parse_setting("default"),
                    mode=mode,
                    profile_config=profile_config,
                    csv_path=Path(tmp, f"{mode}-{row.op_id}.csv"),
                    json_path=Path(tmp, f"{mode}-{row.op_id}.json"),
                    spec=json.loads(row.spec),
                    op_id=row.op_id,
                    job_log_path=Path(tmp, f"{mode}-{row.op_id}.job.csv"),
                )
                wall = time.perf_counter() - t0
                if record["status"] != "ok":
                    continue
                timed = record["timed_end_unix_s"] - record["timed_start_unix_s"]
                STEPS["warm-up"] = STEPS.pop("measure (warm-up + timed)", 0.0) - timed
                for name, seconds in STEPS.items():
                    per_job[name].append(seconds)
                per_job["(timed window)"].append(timed)
                per_job["(job wall time)"].append(wall)
                per_job["(rest)"].append(wall - timed - sum(STEPS.values()))
    n = len(per_job["(job wall time)"])
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"{n} ok jobs on {name}, heap of {args.heap_objects} extra objects")
    print(f"{'step':32s} {'median s/job':>12s} {'mean s/job':>10s}")
    for step, values in sorted(per_job.items(), key=lambda kv: -statistics.mean(kv[1])):
        print(f"{step:32s} {statistics.median(values):12.4f} {statistics.mean(values):10.4f}")
    timed = sum(per_job["(timed window)"])
    print(f"timed / job wall time: {timed / sum(per_job['(job wall time)']):.3f}")


if __name__ == "__main__":
    sys.exit(main())
