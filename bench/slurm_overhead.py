"""Overhead per profiled operation through SLURM, one operation per job vs batches of N.

Profiles the operations of a small CPU study (tests' toy MLP, both modes: 12 op jobs)
through the SLURM profile, once per batch size, and prints for each how long the run took
per operation beyond the operation's own timed window (``min_run_time_s``). Three ways:

- ``slurm, batches of 1``: one SLURM job per operation (no batching);
- ``slurm, batches of N, process per job``: the plugin's own way to run a group job, a
  new ``srun ... snakemake`` process per member (a copy of the workflow without the
  profiling rules' ``workflow.localrules`` line in workflow/rules/profile.smk);
- ``slurm, batches of N``: as shipped, the batch's members run in threads of the batch's
  one Snakemake process.

So:

    overhead per op = wall time of the run / number of ops - mean timed window

The wall time runs from starting Snakemake to its exit, minus the start-up of the main
Snakemake process (measured once, as a dry run with nothing to do), so what remains is
what SLURM and the per-job processes cost. Snakemake submits one SLURM job at a time
(``--jobs 1``), so that the time per op is its cost, not that cost shared among GPUs
working side by side. Batch size 1 is "no batching": one SLURM job per operation. A
``local`` row runs the same jobs without SLURM, as threads of one Snakemake process
(profiles/default), for comparison.

Also printed: the time the SLURM jobs held their GPU (allocation, from ``scontrol``) per
op, which is what a cluster charges; and, for batches, the median gap between two
members of one batch (for a process per job: that process's start-up).

Needs a SLURM cluster. By default it uses the users' profile edited for the local test
cluster (``.ci/slurm-up.sh``, tests/slurm/conftest_helpers.py); ``--profile`` runs it with
any profile, e.g. your site's ``profiles/slurm`` on a real cluster, where the numbers then
include real queue waits.

Usage:
    python bench/slurm_overhead.py                  # batch sizes 1 and 12, and local
    python bench/slurm_overhead.py --sizes 1 12 --no-local --profile profiles/slurm
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
STUDY = {
    "models": [{"model": "toymodels.nets:tiny_mlp", "inputs": [[8, 16]]}],
    "modes": ["inference", "training"],
    "gpus": {"cpu": {"device": "cpu"}},
    "profile": {"min_run_time_s": 0.05, "warmup_s": 0.01},
}
GROUP = "profile_{gpu}"  # the profiling rules' group, as the profile names it


def _helpers():
    path = REPO / "tests" / "slurm" / "conftest_helpers.py"
    spec = importlib.util.spec_from_file_location("opcost_slurm_test_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _snakemake(snakefile: Path, workdir: Path, config: Path, *args: str) -> tuple[float, str]:
    """Run Snakemake on the workflow; return wall seconds and its log."""
    env = {
        **os.environ,
        # The toy model lives in tests/; sbatch --export=ALL hands this to the jobs.
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH")) if p
        ),
    }
    cmd = [sys.executable, "-m", "snakemake", "-s", str(snakefile), "-d", str(workdir)]
    cmd += [*args, "--configfile", str(config)]
    start_s = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall_s = time.monotonic() - start_s
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.exit(f"snakemake {' '.join(args)} failed after {wall_s:.0f} s:\n{log[-4000:]}")
    return wall_s, log


def _op_targets(workdir: Path) -> list[Path]:
    ops = pd.read_parquet(workdir / "results/ops/unique.parquet")["op_id"]
    return [
        workdir / f"results/raw/cpu/default/{mode}/ops/{op_id}.json"
        for mode in STUDY["modes"]
        for op_id in ops
    ]


def _remove_outputs(targets: list[Path]) -> None:
    # Raw logs are write-protected, but removing a file needs only its directory writable.
    for json_path in targets:
        json_path.unlink(missing_ok=True)
        json_path.with_suffix(".csv").unlink(missing_ok=True)


def _timed_window_s(targets: list[Path]) -> float:
    windows = []
    for path in targets:
        record = json.loads(path.read_text())
        windows.append(record["timed_end_unix_s"] - record["timed_start_unix_s"])
    return sum(windows) / len(windows)


def _member_gaps_s(helpers, workdir: Path, log: str) -> list[float]:
    """Seconds between one member's measurement and the next's, inside each batch.

    A batch runs its members one after another. With a process per member, the gap is
    that process's start-up (Python, Snakemake, the Snakefile, torch) and wind-down.
    """
    gaps = []
    for sub in helpers.submissions(log):
        records = []
        for member in helpers.target_jobs(sub.slurm_log):
            _, wc = helpers.job_wildcards(member)
            path = workdir / (
                f"results/raw/{wc['gpu']}/{wc['setting']}/{wc['mode']}/ops/{wc['op_id']}.json"
            )
            records.append(json.loads(path.read_text()))
        records.sort(key=lambda r: r["started_unix_s"])
        gaps += [b["started_unix_s"] - a["finished_unix_s"] for a, b in pairwise(records)]
    return gaps


def _workflow_with_a_process_per_job(tmp: Path) -> Path:
    """A copy of the workflow whose profiling rules are never local: the plugin's way."""
    copy = tmp / "workflow-process-per-job"
    (copy / "workflow").mkdir(parents=True)
    shutil.copy(REPO / "Snakefile", copy / "Snakefile")
    for sub in ("rules", "schemas", "scripts", "report"):
        shutil.copytree(REPO / "workflow" / sub, copy / "workflow" / sub)
    shutil.copytree(REPO / "config", copy / "config")
    shutil.copy(REPO / "environment.yml", copy / "environment.yml")
    rules = copy / "workflow/rules/profile.smk"
    text = rules.read_text()
    line = '    workflow.localrules("profile_op", "profile_network")\n'
    if text.count(line) != 1:
        sys.exit(f"{rules}: expected the line {line!r} once; update this benchmark")
    rules.write_text(text.replace(line, "    pass\n"))
    return copy / "Snakefile"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 12], help="batch sizes")
    parser.add_argument("--profile", type=Path, help="SLURM profile (default: test cluster's)")
    parser.add_argument("--no-local", action="store_true", help="skip the run without SLURM")
    parser.add_argument("--workdir", type=Path, help="keep the working directory here")
    parser.add_argument(
        "--snakefile", type=Path, default=REPO / "Snakefile", help="workflow to run"
    )
    args = parser.parse_args(argv)
    snakemake = functools.partial(_snakemake, args.snakefile.resolve())

    helpers = _helpers()
    if args.profile is None:
        up, reason = helpers.slurm_controller_up()
        if not up:
            sys.exit(f"no SLURM cluster: {reason}")
    tmp = Path(tempfile.mkdtemp(prefix="slurm-overhead-"))
    profile = args.profile or helpers.make_test_profile(tmp)
    workdir = args.workdir or tmp / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "study.yaml"
    config.write_text(yaml.safe_dump(STUDY, sort_keys=False))

    # The op list (extract + checkpoint), locally: not part of what is measured.
    snakemake(workdir, config, "--cores", "2", "results/ops/unique.parquet")
    targets = _op_targets(workdir)
    n_ops = len(targets)
    rel_targets = [str(t.relative_to(workdir)) for t in targets]
    # Start-up of the main Snakemake process (parse, DAG), paid once per run whatever
    # the batch size: a dry run of the same targets once they exist.
    snakemake(workdir, config, "--cores", "2", *rel_targets)
    startup_s, _ = snakemake(workdir, config, "--dry-run", *rel_targets)

    per_job = functools.partial(_snakemake, _workflow_with_a_process_per_job(tmp))
    rows = []
    variants = [("local", None, snakemake)] if not args.no_local else []
    for n in args.sizes:
        if n > 1:
            variants.append((f"slurm, batches of {n}, process per job", n, per_job))
        variants.append((f"slurm, batches of {n}", n, snakemake))
    for label, size, run in variants:
        _remove_outputs(targets)
        if size is None:
            wall_s, log = run(workdir, config, "--cores", "2", *rel_targets)
            n_sub = 0
        else:
            wall_s, log = run(
                workdir,
                config,
                "--profile",
                str(profile),
                "--group-components",
                f"{GROUP}={size}",
                "--jobs",
                "1",
                # Successful jobs' logs name the members of each batch.
                "--slurm-keep-successful-logs",
                *rel_targets,
            )
            n_sub = len(re.findall(r"has been submitted with SLURM jobid", log))
            expected = math.ceil(n_ops / size)
            if n_sub != expected:
                print(f"note: {label}: {n_sub} submissions, expected {expected}")
        window_s = _timed_window_s(targets)
        per_op_s = (wall_s - startup_s) / n_ops
        gaps = _member_gaps_s(helpers, workdir, log) if size else []
        alloc_s = None
        if size:
            jobs = helpers.slurm_jobs([s.slurm_job_id for s in helpers.submissions(log)])
            alloc_s = sum(j.end_unix_s - j.start_unix_s for j in jobs.values())
        rows.append(
            {
                "variant": label,
                "ops": n_ops,
                "sbatch": n_sub,
                "wall_s": round(wall_s, 1),
                "per_op_s": round(per_op_s, 2),
                "timed_window_s": round(window_s, 3),
                "overhead_per_op_s": round(per_op_s - window_s, 2),
                "alloc_per_op_s": round(alloc_s / n_ops, 1) if alloc_s else None,
                "member_gap_s": round(statistics.median(gaps), 1) if gaps else None,
            }
        )
        print(f"{label}: {wall_s:.1f} s", file=sys.stderr)

    table = pd.DataFrame(rows)
    print(f"\nmain Snakemake start-up (subtracted from wall_s): {startup_s:.1f} s")
    print(f"load average after the runs: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
