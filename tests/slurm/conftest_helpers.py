"""Helpers for tests that run Snakemake on the local SLURM test cluster.

The tests run the users' profile (profiles/slurm/config.yaml) edited as the README tells
a user to edit it, and no further: the partitions, the account line deleted (the test
cluster has no accounts) and the status command (it keeps no accounting).
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

REPO_ROOT = Path(__file__).resolve().parents[2]
USERS_PROFILE = REPO_ROOT / "profiles" / "slurm" / "config.yaml"
# The test cluster of .ci/slurm-up.sh: one partition for CPU and GPU jobs.
TEST_PARTITION = "debug"


def edit_users_profile(
    text: str,
    cpu_partition: str,
    gpu_partition: str,
    account: str | None,
    status_command: str | None,
) -> str:
    """The users' profile text with the site values of its edit block filled in.

    Args:
        text: profiles/slurm/config.yaml as shipped.
        cpu_partition: replaces ``EDIT_ME_cpu_partition``.
        gpu_partition: replaces ``EDIT_ME_gpu_partition`` (every occurrence).
        account: replaces ``EDIT_ME_account``; ``None`` deletes the ``slurm_account`` line,
            as a user of a cluster without accounts does.
        status_command: the value of ``slurm-status-command``; ``None`` keeps the shipped one.

    Raises:
        AssertionError: a value to edit is not where the README says it is.
    """

    def replace(old: str, new: str, count: int | None = None) -> None:
        nonlocal text
        found = text.count(old)
        assert found, f"{old!r} not in the profile"
        assert count is None or found == count, f"{old!r} found {found} times"
        text = text.replace(old, new)

    replace("'EDIT_ME_cpu_partition'", f"'{cpu_partition}'", 1)
    replace("'EDIT_ME_gpu_partition'", f"'{gpu_partition}'")
    if account is None:
        line = re.search(r"^ *slurm_account: \"'EDIT_ME_account'\"\n", text, re.M)
        assert line, "no slurm_account line to delete"
        text = text[: line.start()] + text[line.end() :]
    else:
        replace("'EDIT_ME_account'", f"'{account}'", 1)
    if status_command is not None:
        replace("\nslurm-status-command: sacct\n", f"\nslurm-status-command: {status_command}\n", 1)
    return text


def make_test_profile(tmp_path: Path, status_command: str | None = "squeue") -> Path:
    """Write the users' profile, edited for the test cluster as a user edits it.

    Args:
        tmp_path: directory to create the profile in (e.g. pytest's ``tmp_path``).
        status_command: ``squeue`` (the test cluster keeps no accounting), or ``None``
            to keep the shipped ``sacct``.

    Returns:
        The profile directory, ready for ``snakemake --profile``.
    """
    text = edit_users_profile(
        USERS_PROFILE.read_text(),
        cpu_partition=TEST_PARTITION,
        gpu_partition=TEST_PARTITION,
        account=None,
        status_command=status_command,
    )
    profile_dir = tmp_path / "slurm-test-profile"
    profile_dir.mkdir(parents=True, exist_ok=True)
    (profile_dir / "config.yaml").write_text(text)
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
