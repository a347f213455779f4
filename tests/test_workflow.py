"""The pipeline through Snakemake's CLI, on the CPU, in temporary working directories.

A run killed mid-profiling and the no-overlap of profiling jobs are tested in
tests/test_faults.py, which imports :func:`snakemake` from here.
"""

import os
import re
import subprocess
import sys

import pandas as pd
import pytest


def snakemake_argv(repo, workdir, *args):
    """The command that runs the repository's workflow in ``workdir``."""
    return [sys.executable, "-m", "snakemake", "-s", str(repo / "Snakefile")] + [
        "--directory",
        str(workdir),
        *args,
    ]


def snakemake_env(repo, *extra_paths):
    """The environment it runs in: ``extra_paths``, then the tests and opcost importable."""
    path = [*map(str, extra_paths), str(repo / "tests"), str(repo / "src")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def snakemake(repo, workdir, *args, timeout=900, extra_paths=()):
    return subprocess.run(
        snakemake_argv(repo, workdir, *args),
        capture_output=True,
        text=True,
        cwd=repo,
        env=snakemake_env(repo, *extra_paths),
        timeout=timeout,
    )


def job_counts(stdout):
    """The 'Job stats' table of a dry run: rule -> number of jobs."""
    table = stdout.split("Job stats:")[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.mark.slow
def test_dry_run_of_the_default_study_lists_every_profiling_job(repo, tmp_path):
    config = ["--configfile", str(repo / "config/config.yaml")]
    first = snakemake(repo, tmp_path, "results/ops/unique.parquet", "--cores", "2", *config)
    assert first.returncode == 0, first.stderr[-3000:]
    unique = pd.read_parquet(tmp_path / "results/ops/unique.parquet")
    dry = snakemake(repo, tmp_path, "-n", *config)
    assert dry.returncode == 0, dry.stderr[-3000:]
    counts = job_counts(dry.stdout)
    # Default study: 1 GPU configuration ("local"), 1 setting, 2 modes, 3 networks.
    assert counts["profile_op"] == len(unique) * 2
    assert counts["profile_network"] == 3 * 2
    assert counts["evaluate"] == 1
    assert "extract" not in counts  # done in the first call


def test_tiny_study_runs_end_to_end_and_a_rerun_does_nothing(repo, tmp_path):
    config = ["--configfile", str(repo / "tests/data/configs/tiny.yaml")]
    run = snakemake(repo, tmp_path, "--cores", "2", *config)
    assert run.returncode == 0, run.stderr[-4000:]
    unique = pd.read_parquet(tmp_path / "results/ops/unique.parquet")
    dataset = pd.read_parquet(tmp_path / "results/dataset/cpu.parquet")
    failed = pd.read_parquet(tmp_path / "results/dataset/cpu.failed.parquet")
    assert failed.empty
    assert len(dataset) == 2 * len(unique) + 2 * 2
    assert set(dataset.loc[dataset["kind"] == "network", "model_input"]) == {
        "resnet18_2x3x32x32",
        "toymodels.nets.tiny_mlp_8x16",
    }
    assert dataset["time_s"].gt(0).all()
    assert dataset["power_w"].isna().all()  # the CPU measures time only
    # Raw logs are write-protected ground truth.
    raw = next((tmp_path / "results/raw").rglob("*.json"))
    assert not os.access(raw, os.W_OK) or os.geteuid() == 0
    assert not raw.stat().st_mode & 0o222
    again = snakemake(repo, tmp_path, "-n", *config)
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr
