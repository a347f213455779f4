"""Helpers for tests that run Snakemake on the local SLURM test cluster.

Snakemake profiles cannot inherit from one another, so the site settings of the test
cluster (tests/slurm/profile/config.yaml) are merged over the users' profile
(profiles/slurm/config.yaml) into a temporary profile. The tests thereby exercise the
profile users get, with only the values a site must edit replaced.
"""

# No `from __future__ import annotations`: bench/slurm_overhead.py loads this file by
# path, without registering it in sys.modules, and dataclasses then cannot resolve string
# annotations. The tests import it as `slurm.conftest_helpers` (tests/ is on sys.path).
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
USERS_PROFILE = REPO_ROOT / "profiles" / "slurm" / "config.yaml"
TEST_OVERRIDES = Path(__file__).resolve().parent / "profile" / "config.yaml"


def merge_profile(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``overrides`` merged in, recursively for mappings.

    A mapping in both is merged key by key; any other override value replaces the base
    value; an override of ``None`` deletes the key (how the test profile drops the users'
    ``slurm_account``). Lists are replaced, not concatenated.

    Args:
        base: the users' profile, as parsed from YAML.
        overrides: the site settings to apply.

    Returns:
        A new mapping; neither argument is modified.
    """
    merged = dict(base)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_profile(merged[key], value)
        else:
            merged[key] = value
    return merged


def make_test_profile(
    tmp_path: Path,
    users_profile: Path = USERS_PROFILE,
    overrides: Path = TEST_OVERRIDES,
) -> Path:
    """Write the users' profile merged with the test cluster's settings.

    Args:
        tmp_path: directory to create the profile in (e.g. pytest's ``tmp_path``).
        users_profile: the users' profile config.yaml.
        overrides: the test cluster's site settings.

    Returns:
        The profile directory, ready for ``snakemake --profile``.
    """
    base = yaml.safe_load(users_profile.read_text())
    site = yaml.safe_load(overrides.read_text())
    profile_dir = tmp_path / "slurm-test-profile"
    profile_dir.mkdir(parents=True, exist_ok=True)
    merged = merge_profile(base, site)
    (profile_dir / "config.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    return profile_dir


def slurm_controller_up(timeout_s: float = 10.0) -> tuple[bool, str]:
    """Tell whether a SLURM controller answers here, and if not, why.

    Args:
        timeout_s: how long to wait for ``sinfo``.

    Returns:
        ``(True, "")`` if ``sinfo`` lists at least one node that is idle, mixed or
        allocated; otherwise ``(False, reason)``.
    """
    if shutil.which("sinfo") is None:
        return False, "sinfo not found: SLURM is not installed (run .ci/slurm-up.sh as root)"
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-o", "%T"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"sinfo did not answer in {timeout_s} s: is slurmctld running?"
    if proc.returncode != 0:
        return False, f"sinfo failed: {proc.stderr.strip()} (run .ci/slurm-up.sh as root)"
    states = proc.stdout.split()
    if not any(state in {"idle", "mixed", "allocated"} for state in states):
        return False, f"no usable SLURM node (states: {states or 'none'})"
    return True, ""


# "Job 3 has been submitted with SLURM jobid 14 (log: /w/.snakemake/slurm_logs/...log)."
_SUBMITTED_RE = re.compile(
    r"^Job (\S+) has been submitted with SLURM jobid (\d+) \(log: (.+?)\)\.?$", re.M
)


@dataclass(frozen=True)
class Submission:
    """One ``sbatch`` of a Snakemake run, as the SLURM plugin logs it."""

    snakemake_job: str  # Snakemake's job id, or a group job's UUID
    slurm_job_id: str
    slurm_log: Path  # .snakemake/slurm_logs/rule_<rule>/... or group_<group>_<rules>/...

    @property
    def is_group(self) -> bool:
        return self.slurm_log.parent.name.startswith("group_")

    @property
    def name(self) -> str:
        """``rule_<rule>`` or ``group_<group>_<rules>``: the log directory under slurm_logs."""
        parts = self.slurm_log.parts
        return parts[parts.index("slurm_logs") + 1]


def submissions(snakemake_log: str) -> list[Submission]:
    """Every SLURM submission a Snakemake run logged, in order.

    Args:
        snakemake_log: the run's stdout and stderr (or its .snakemake/log file).
    """
    return [
        Submission(m[1], m[2], Path(m[3].strip())) for m in _SUBMITTED_RE.finditer(snakemake_log)
    ]


def target_jobs(slurm_log: Path) -> list[str]:
    """The jobs a SLURM job ran: the ``--target-jobs`` of the Snakemake it started.

    The SLURM job's log begins with Snakemake's banner, whose ``Command:`` line is that of
    the process the plugin's sbatch script started (the whole group, for a group job).

    Returns:
        Items like ``profile_op:gpu=cpu,setting=default,mode=inference,op_id=...``.
    """
    text = slurm_log.read_text()
    match = re.search(r"^\s*Command: (.*)$", text, re.M)
    if match is None:
        raise AssertionError(f"{slurm_log}: no 'Command:' line; is this a Snakemake log?")
    args = shlex.split(match[1])
    start = args.index("--target-jobs") + 1
    jobs = []
    for arg in args[start:]:
        if arg.startswith("--"):
            break
        jobs.append(arg)
    return jobs


def job_wildcards(target_job: str) -> tuple[str, dict[str, str]]:
    """Split ``rule:key=value,...`` (a ``--target-jobs`` item) into rule and wildcards."""
    rule, _, spec = target_job.partition(":")
    return rule, dict(item.split("=", 1) for item in spec.split(",") if item)


@dataclass(frozen=True)
class SlurmJob:
    """What the controller still knows of a job (MinJobAge keeps finished ones)."""

    job_id: str
    state: str
    comment: str
    time_limit: str
    tres_per_job: str
    submit_unix_s: float
    start_unix_s: float
    end_unix_s: float


def slurm_jobs(job_ids: list[str]) -> dict[str, SlurmJob]:
    """``scontrol show job`` of finished or running jobs, by job id."""
    out: dict[str, SlurmJob] = {}
    for job_id in job_ids:
        text = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        fields = dict(re.findall(r"(\S+?)=(\S*)", text))
        out[job_id] = SlurmJob(
            job_id=job_id,
            state=fields["JobState"],
            comment=fields.get("Comment", ""),
            time_limit=fields["TimeLimit"],
            tres_per_job=fields.get("TresPerJob", ""),
            # Local time, whole seconds, as slurmctld prints it.
            submit_unix_s=datetime.fromisoformat(fields["SubmitTime"]).timestamp(),
            start_unix_s=datetime.fromisoformat(fields["StartTime"]).timestamp(),
            end_unix_s=datetime.fromisoformat(fields["EndTime"]).timestamp(),
        )
    return out
