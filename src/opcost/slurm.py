"""A pre-flight check of a run through the SLURM executor plugin, before anything is submitted.

The plugin (snakemake-executor-plugin-slurm 2.8) learns the state of the jobs it submitted
from its status command, ``sacct`` or ``squeue``. Where the cluster has no accounting
storage, ``sacct`` cannot answer: the plugin's queries fail, it stops watching the jobs,
and Snakemake waits forever without a word. :func:`check_run`, called from the
workflow's ``onstart`` hook (after the executor is set up, before the first job is
submitted), asks ``sacct`` the way the plugin does and stops the run with one line that
names the fix when it cannot answer.

The plugin also uses ``sacct`` when it is told ``squeue`` but ``MinJobAge`` (how long the
controller keeps finished jobs, ``scontrol show config``) is unknown or below three times
its first status-check delay (``slurm-init-seconds-before-status-checks``):
:func:`status_command_used` repeats that choice.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import datetime, timedelta
from typing import Any

#: The profile key (and, with ``--``, the command-line flag) that picks the status command.
STATUS_COMMAND_KEY = "slurm-status-command"
#: The plugin's first status check comes this long after a submission, by default (s).
DEFAULT_INIT_SECONDS = 40
#: Seconds to wait for ``sacct`` or ``scontrol``: both answer in well under a second.
PROBE_TIMEOUT_S = 15.0
#: Job name of the probe query; no job carries it, so a working ``sacct`` prints nothing.
PROBE_JOB_NAME = "opcost-preflight-probe"


def sacct_query() -> list[str]:
    """A status query like the plugin's (``query_job_status_sacct``), for a job name no
    job has."""
    start = f"{datetime.now() - timedelta(days=2):%Y-%m-%dT%H:00}"
    return [
        "sacct",
        "-X",
        "--parsable2",
        "--clusters",
        "all",
        "--noheader",
        "--format=JobIdRaw,State",
        "--starttime",
        start,
        "--endtime",
        "now",
        "--name",
        PROBE_JOB_NAME,
    ]


def sacct_problem(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why ``sacct`` cannot report job states here, in a few words, or None if it can.

    Runs :func:`sacct_query`; a non-zero exit or no answer within ``timeout_s`` is a
    problem (the plugin then fails the same way, five times per status check).
    """
    try:
        proc = subprocess.run(
            sacct_query(), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError:
        return "sacct is not installed"
    except subprocess.TimeoutExpired:
        return f"sacct did not answer within {timeout_s:g} s"
    if proc.returncode == 0:
        return None
    said = " ".join((proc.stderr or proc.stdout).split()) or "no message"
    return f"sacct exits with code {proc.returncode}: {said}"


def min_job_age_s(timeout_s: float = PROBE_TIMEOUT_S) -> int | None:
    """The controller's ``MinJobAge`` in seconds (``scontrol show config``), or None."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "config"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"^\s*MinJobAge\s*=\s*(\d+)\s*([A-Za-z]*)", out, re.M)
    if match is None:
        return None
    value = int(match[1])
    return value * 3600 if match[2].lower() in ("h", "hour", "hours") else value


def status_command_used(
    configured: str, *, min_job_age_s: int | None, init_seconds: int, sacct_on_path: bool
) -> str:
    """The command the plugin will really query, as plugin 2.8.0 chooses it.

    ``squeue`` turns into ``sacct`` when ``sacct`` is installed and ``MinJobAge`` is
    unknown or below ``3 * init_seconds``; ``sacct`` turns into ``squeue`` when ``sacct``
    is not installed.
    """
    short_age = min_job_age_s is None or min_job_age_s < 3 * init_seconds
    if configured == "squeue" and sacct_on_path and short_age:
        return "sacct"
    if configured == "sacct" and not sacct_on_path:
        return "squeue"
    return configured


def preflight_problem(
    configured: str | None,
    init_seconds: int = DEFAULT_INIT_SECONDS,
    *,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> str | None:
    """The one-line message that stops a run whose job states nobody could report, or None.

    Args:
        configured: the plugin's status command setting (``slurm-status-command``).
        init_seconds: its ``slurm-init-seconds-before-status-checks`` setting.
        timeout_s: how long to wait for ``sacct`` and ``scontrol``.
    """
    if configured not in ("sacct", "squeue"):
        return None
    sacct_on_path = shutil.which("sacct") is not None
    age_s = min_job_age_s(timeout_s) if configured == "squeue" and sacct_on_path else None
    used = status_command_used(
        configured, min_job_age_s=age_s, init_seconds=init_seconds, sacct_on_path=sacct_on_path
    )
    if used != "sacct":
        return None
    problem = sacct_problem(timeout_s)
    if problem is None:
        return None
    if configured == "sacct":
        return (
            f"the SLURM plugin's status command is sacct, but {problem} (no accounting "
            "storage?), so Snakemake would wait forever for its jobs; set "
            f"`{STATUS_COMMAND_KEY}: squeue` in the EDIT FOR YOUR CLUSTER block of the "
            "profile (profiles/slurm/config.yaml). Nothing was submitted."
        )
    age = "unknown (scontrol show config)" if age_s is None else f"{age_s} s"
    return (
        f"the profile asks for squeue, but MinJobAge is {age}, below 3 x "
        f"slurm-init-seconds-before-status-checks ({3 * init_seconds} s), so the SLURM "
        f"plugin queries sacct instead, and {problem}; set "
        "slurm-init-seconds-before-status-checks in the profile to at most a third of "
        "MinJobAge, or ask the admin for a longer MinJobAge. Nothing was submitted."
    )


def check_run(workflow: Any) -> None:
    """Stop a run through the SLURM plugin whose job states nobody could report.

    Call it from the workflow's ``onstart`` hook: Snakemake runs that after it has set up
    the executor and before it submits the first job (not in a dry run). Runs with any
    other executor, and the processes inside SLURM jobs, are left alone.

    Raises:
        SystemExit: with the message of :func:`preflight_problem`; Snakemake then exits
            with code 1 and prints that line only.
    """
    plugin = getattr(workflow, "executor_plugin", None)
    if plugin is None or plugin.name != "slurm" or not workflow.is_main_process:
        return
    settings = workflow.executor_settings
    problem = preflight_problem(
        getattr(settings, "status_command", None),
        int(getattr(settings, "init_seconds_before_status_checks", DEFAULT_INIT_SECONDS)),
    )
    if problem is not None:
        raise SystemExit(f"opcost: {problem}")
