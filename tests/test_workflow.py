"""The pipeline through Snakemake's CLI, on the CPU, in temporary working directories."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest


def snakemake(repo, workdir, *args, timeout=900):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "tests"), str(repo / "src")])}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(repo / "Snakefile"),
            "--directory",
            str(workdir),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        env=env,
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


def _intervals(workdir):
    records = [json.loads(p.read_text()) for p in (workdir / "results/raw").rglob("*.json")]
    return sorted((r["started_unix_s"], r["finished_unix_s"]) for r in records)


def test_profiling_jobs_never_overlap_without_resources_flag(repo, tmp_path):
    """The default profile limits gpu=1: no two profiling jobs share the device."""
    config = ["--configfile", str(repo / "tests/data/configs/tiny.yaml")]
    run = snakemake(repo, tmp_path, "--cores", "4", *config)  # no --resources given
    assert run.returncode == 0, run.stderr[-4000:]
    spans = _intervals(tmp_path)
    assert len(spans) > 10
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end


def test_run_killed_mid_profiling_resumes_and_completes(repo, tmp_path):
    config = ["--configfile", str(repo / "tests/data/configs/tiny.yaml")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "tests"), str(repo / "src")])}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(repo / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--cores",
            "2",
            *config,
        ],
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    raw = tmp_path / "results/raw"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and len(list(raw.rglob("*.json"))) < 5:
        time.sleep(0.2)
    # As SLURM or a user stops a run: SIGTERM (Snakemake finishes its running job), then
    # SIGKILL if it has not exited after a grace period.
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=60)
    measured_before = {p.name for p in raw.rglob("*.json")}
    assert len(measured_before) > 0
    # Nothing half-written looks complete: every final JSON parses and has its CSV.
    for p in raw.rglob("*.json"):
        assert json.loads(p.read_text())["status"] == "ok"
        assert p.with_suffix(".csv").exists()
    # After a SIGKILL Snakemake's lock remains; --unlock is the documented way on.
    assert snakemake(repo, tmp_path, "--unlock", *config).returncode == 0
    again = snakemake(repo, tmp_path, "--cores", "2", *config)
    assert again.returncode == 0, again.stderr[-4000:]
    # Only what was missing ran: the measurements made before the kill were kept.
    assert measured_before <= {p.name for p in raw.rglob("*.json")}
    dataset = pd.read_parquet(tmp_path / "results/dataset/cpu.parquet")
    unique = pd.read_parquet(tmp_path / "results/ops/unique.parquet")
    assert len(dataset) == 2 * len(unique) + 4
    assert not list(raw.rglob(".*.tmp-*"))
