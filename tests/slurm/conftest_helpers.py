"""Helpers for tests that run Snakemake on the local SLURM test cluster.

Snakemake profiles cannot inherit from one another, so the site settings of the test
cluster (tests/slurm/profile/config.yaml) are merged over the users' profile
(profiles/slurm/config.yaml) into a temporary profile. The tests thereby exercise the
profile users get, with only the values a site must edit replaced.
"""

from __future__ import annotations

import shutil
import subprocess
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
