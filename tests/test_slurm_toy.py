"""Run a toy workflow through a real SLURM cluster with the users' SLURM profile.

Needs a running controller (``.ci/slurm-up.sh`` starts a single-node one). Skipped when
there is none, unless ``OPCOST_REQUIRE_SLURM=1``, which turns the skip into a failure
(for CI, where a missing cluster is a broken setup, not an optional extra).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from slurm import conftest_helpers as helpers

REPO_ROOT = Path(__file__).resolve().parents[1]
TOY_SNAKEFILE = REPO_ROOT / "tests" / "slurm" / "toy" / "Snakefile"
# The whole run takes about a minute here; far longer means jobs hang in the queue.
RUN_TIMEOUT_S = 240


def _read(workdir: Path, name: str) -> dict:
    return json.loads((workdir / name).read_text())


def test_test_profile_is_the_users_profile_edited_in_its_edit_block_only(tmp_path: Path) -> None:
    shipped = helpers.USERS_PROFILE.read_text().splitlines()
    edited = (helpers.make_test_profile(tmp_path) / "config.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(shipped) if "EDIT FOR YOUR CLUSTER" in line)
    end = next(i for i in range(start + 1, len(shipped)) if shipped[i].startswith("# ====="))
    block = slice(start, end + 1)
    # Outside the edit block the two are the same, line for line.
    assert shipped[: block.start] == edited[: block.start]
    n_after = len(shipped) - block.stop
    assert shipped[block.stop :] == edited[len(edited) - n_after :]
    # Inside it: one line fewer (the account) and only these values changed.
    changed = sorted(set(shipped[block]) ^ set(edited[block.start : len(edited) - n_after]))
    assert changed == sorted(
        [
            "  slurm_partition: \"'EDIT_ME_cpu_partition'\"",
            "  slurm_partition: \"'debug'\"",
            "  slurm_account: \"'EDIT_ME_account'\"",
            "    slurm_partition: \"'EDIT_ME_gpu_partition'\"",
            "    slurm_partition: \"'debug'\"",
            "slurm-status-command: sacct",
            "slurm-status-command: squeue",
        ]
    )
    merged = yaml.safe_load("\n".join(edited))
    assert merged["executor"] == "slurm"
    assert "slurm_account" not in merged["default-resources"]
    assert merged["set-resources"]["profile_op"]["slurm_partition"] == "'debug'"
    assert merged["set-resources"]["profile_network"]["slurm_partition"] == "'debug'"
    assert merged["slurm-status-command"] == "squeue"


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.usefixtures("slurm_cluster")
def test_toy_workflow_runs_through_slurm(tmp_path: Path) -> None:
    profile = helpers.make_test_profile(tmp_path)
    workdir = tmp_path / "work"
    workdir.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--profile",
        str(profile),
        "--directory",
        str(workdir),
        "-s",
        str(TOY_SNAKEFILE),
    ]
    start_s = time.monotonic()
    # Run from the repository root, as users do: Snakemake then also applies the
    # workflow profile profiles/default on top of --profile, as it will for them.
    proc = subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    elapsed_s = time.monotonic() - start_s
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"snakemake failed after {elapsed_s:.0f} s:\n{log[-6000:]}"

    gpu_job = _read(workdir, "gpu_job.json")
    op1 = _read(workdir, "ops/1.json")
    op2 = _read(workdir, "ops/2.json")
    flaky = _read(workdir, "flaky.json")

    # Every job ran inside a SLURM job: the ungrouped ones each in a job step (srun) of
    # their own, as the plugin runs them.
    for rec in (gpu_job, op1, op2, flaky):
        assert rec["slurm_job_id"], rec
    for rec in (gpu_job, flaky):
        assert rec["slurm_step_id"] is not None, rec

    # gpu=1 without a gpu_model reached SLURM as a plain GPU request.
    assert gpu_job["resources"]["gpu"] == 1
    assert "gpu_model" not in gpu_job["resources"]
    jobs = helpers.slurm_jobs(
        [rec["slurm_job_id"] for rec in (gpu_job, op1, flaky)] + [flaky["first_slurm_job_id"]]
    )
    assert jobs[gpu_job["slurm_job_id"]].tres_per_job == "gres:gpu:1"

    # The two profile_op jobs shared one SLURM job (groups, group-components), which
    # asked for one GPU, not two, and for the sum of their runtimes (2 x 1 min on attempt
    # 1). Both ran in threads of that job's own Snakemake process, in its batch script
    # (which has no SLURM_STEP_ID): no srun and no new Python per member.
    assert op1["slurm_job_id"] == op2["slurm_job_id"]
    assert op1["pid"] == op2["pid"]
    assert op1["slurm_step_id"] is None
    assert op2["slurm_step_id"] is None
    assert "--target-jobs" in op1["cmdline"]
    assert op1["resources"]["gpu"] == 1
    group_job = jobs[op1["slurm_job_id"]]
    assert group_job.tres_per_job == "gres:gpu:1"
    assert group_job.time_limit == "00:02:00"

    # flaky failed once, and its retry was a new SLURM job with the runtime the profile's
    # "30 * attempt" gives attempt 2 (minutes).
    assert flaky["first_runtime"] == 30
    assert flaky["runtime"] == 60
    assert flaky["first_slurm_job_id"] != flaky["slurm_job_id"]
    assert jobs[flaky["first_slurm_job_id"]].time_limit == "00:30:00"
    assert jobs[flaky["slurm_job_id"]].time_limit == "01:00:00"
