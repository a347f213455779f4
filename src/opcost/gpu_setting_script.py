"""The console script ``opcost-gpu-setting``: lock a GPU's SM clock, set its power limit, or
reset both, through ``nvidia-smi -lgc``, ``-pl`` or ``-rgc``.

This is the only code that needs privileges (a site runs it through ``sudo -n``). It checks
its arguments strictly before it runs anything, under sudo runs only a root-owned
``nvidia-smi`` from fixed system directories (:func:`trusted_nvidia_smi`), and with
``--require-job-gpu`` sets only a GPU of the caller's SLURM job (:func:`check_job_holds`).
It imports neither torch nor pandas, so it starts fast. The job side that calls it and
always resets the card is :mod:`opcost.gpu_setting`; site set-up: docs/gpu-settings.md.

Usage: ``opcost-gpu-setting --gpu 0 --lock-sm-clock 1410`` (or ``--power-limit 300``,
``--reset``), also as ``python -m opcost.gpu_setting_script``.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from opcost.nvsmi import (
    GPU_INDEX_PATTERN,
    GPU_UUID_PATTERN,
    GpuListing,
    NvidiaSmiError,
    gpu_info,
    list_gpus,
    nvidia_smi_path,
    process_output,
    run_nvidia_smi,
)

_INT_RE = re.compile(r"[1-9][0-9]{0,4}")
_GPU_RE = re.compile(f"{GPU_INDEX_PATTERN}|{GPU_UUID_PATTERN}")
_INDEX_RE = re.compile(GPU_INDEX_PATTERN)

#: Where the script takes ``nvidia-smi`` from when it runs with rights its caller may lack
#: (under sudo): fixed system directories, searched in this order; ``PATH`` is ignored.
TRUSTED_NVIDIA_SMI_DIRS: tuple[str, ...] = ("/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin")
#: Variables that sudo (always, also with ``env_reset``), pkexec and doas set for the
#: command they run as another user; their presence means the caller chose the environment.
ELEVATION_VARIABLES: tuple[str, ...] = ("SUDO_UID", "SUDO_USER", "PKEXEC_UID", "DOAS_USER")
#: Where ``--require-job-gpu`` reads the GPUs of the caller's job, first one set wins.
JOB_GPU_VARIABLES: tuple[str, ...] = ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES")


def _strict_int(text: str) -> int:
    # int() would take "+1", " 1", "1_0" and "١"; only plain ASCII digits pass here.
    if not _INT_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive integer (1 to 5 digits, no sign or spaces)"
        )
    return int(text)


def _gpu_arg(text: str) -> str:
    if not _GPU_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a GPU index nor a UUID like "
            f"GPU-57781e38-0b78-5d74-ed7b-e2db6ddbacd3 (see `nvidia-smi -L`)"
        )
    return text


class _Once(argparse.Action):
    """Store an option's value, refusing the option a second time (argparse keeps the last)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if getattr(namespace, self.dest) is not None:
            parser.error(f"{option_string} given twice")
        setattr(namespace, self.dest, values)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``opcost-gpu-setting``: one GPU, exactly one action."""
    parser = argparse.ArgumentParser(
        prog="opcost-gpu-setting",
        description=(
            "Lock a GPU's SM clock, set its power limit, or reset both (needs root; the "
            "opcost profile jobs call it through `sudo -n`)."
        ),
        allow_abbrev=False,
    )
    parser.add_argument(
        "--gpu", required=True, type=_gpu_arg, action=_Once, help="index or UUID (nvidia-smi -L)"
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument(
        "--lock-sm-clock",
        type=_strict_int,
        action=_Once,
        metavar="MHZ",
        help="lock the SM clock to one of the GPU's supported clocks",
    )
    action.add_argument(
        "--power-limit",
        type=_strict_int,
        action=_Once,
        metavar="W",
        help="set the power limit, within the GPU's min and max limit",
    )
    action.add_argument(
        "--reset", action="store_true", help="unlock the SM clock and restore the default limit"
    )
    parser.add_argument(
        "--require-job-gpu",
        action="store_true",
        help=(
            "refuse a GPU that the caller's SLURM job does not hold (read from "
            "SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES; sudo must keep them: env_keep)"
        ),
    )
    return parser


def runs_elevated(environ: Mapping[str, str] | None = None) -> bool:
    """True when this process may have rights its caller lacks, so its environment is untrusted.

    That is: it runs set-uid or set-gid, or one of :data:`ELEVATION_VARIABLES` is set
    (sudo sets ``SUDO_UID`` and ``SUDO_USER`` for every command it runs; a caller can
    change their values where the rule allows ``SETENV``, but cannot remove them).
    """
    env = os.environ if environ is None else environ
    if os.geteuid() != os.getuid() or os.getegid() != os.getgid():
        return True
    return any(name in env for name in ELEVATION_VARIABLES)


def _check_owned_by_root(path: str) -> None:
    # Owner root (or this process's own user, which gains nothing), writable by no one
    # else: for the path and every directory above it. A sticky directory (/tmp) may be
    # world-writable: others cannot rename or delete what root owns there.
    trusted_owners = {0, os.geteuid()}
    current = path
    while True:
        info = os.stat(current)
        if info.st_uid not in trusted_owners:
            raise NvidiaSmiError(
                f"refusing to run {path}: {current} belongs to uid {info.st_uid}, not root; "
                f"the admin must install nvidia-smi root-owned in one of "
                f"{', '.join(TRUSTED_NVIDIA_SMI_DIRS)}"
            )
        sticky_dir = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_dir:
            raise NvidiaSmiError(
                f"refusing to run {path}: {current} is writable by group or others (mode "
                f"{stat.S_IMODE(info.st_mode):o}); the admin must remove that (chmod go-w)"
            )
        parent = os.path.dirname(current)
        if parent == current:
            return
        current = parent


def trusted_nvidia_smi() -> str:
    """The ``nvidia-smi`` the script runs, as an absolute path with no symbolic links.

    Run with rights its caller may lack (:func:`runs_elevated`, e.g. through sudo): the
    first ``nvidia-smi`` in :data:`TRUSTED_NVIDIA_SMI_DIRS`, ``PATH`` ignored, and only if
    the file, the directory that names it and every directory above them are owned by
    root and writable by no one else. Run directly, with its caller's own rights (as the
    tests run it, with a fake first on ``PATH``): the one on ``PATH``, like any command.

    Raises:
        NvidiaSmiError: none found, or the one found could be changed by someone but root.
    """
    if not runs_elevated():
        return nvidia_smi_path()
    for directory in TRUSTED_NVIDIA_SMI_DIRS:
        candidate = os.path.join(directory, "nvidia-smi")
        if os.path.isfile(candidate):
            break
    else:
        raise NvidiaSmiError(
            f"nvidia-smi is in none of {', '.join(TRUSTED_NVIDIA_SMI_DIRS)}; run through "
            f"sudo, this script ignores PATH: the admin must install nvidia-smi in one of them"
        )
    real = os.path.realpath(candidate)
    # Whoever can write the directory holding the name could swap a link there.
    _check_owned_by_root(os.path.realpath(directory))
    _check_owned_by_root(real)
    return real


def _job_gpus(environ: Mapping[str, str]) -> tuple[str, str] | None:
    for name in JOB_GPU_VARIABLES:
        if name in environ:
            return name, environ[name]
    return None


def check_job_holds(
    gpu: str, listed: Sequence[GpuListing], environ: Mapping[str, str] | None = None
) -> str | None:
    """Return None if the caller's job holds ``gpu``, else why not (one line).

    The job's GPUs come from ``SLURM_JOB_GPUS`` (SLURM's indices on the host, as
    ``nvidia-smi -i`` takes them), else ``CUDA_VISIBLE_DEVICES``, each a comma-separated
    list of indices or UUIDs; ``listed`` (``nvidia-smi -L``) maps indices to UUIDs, so a
    GPU given either way matches a job GPU given either way. These variables come from
    the caller: the check stops a job from setting a GPU it does not hold by mistake, not
    a user who sets them by hand.
    """
    env = os.environ if environ is None else environ
    found = _job_gpus(env)
    if found is None:
        return (
            f"--require-job-gpu: none of {', '.join(JOB_GPU_VARIABLES)} is set, so the GPUs "
            f"of the caller's job are unknown; run inside a SLURM job that holds a GPU, and "
            f"have sudo keep these variables (env_keep, see docs/slurm.md)"
        )
    name, value = found
    by_uuid = {g.uuid: g.index for g in listed}
    held: set[int] = set()
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        if _INDEX_RE.fullmatch(entry):
            held.add(int(entry))
        elif re.fullmatch(GPU_UUID_PATTERN, entry):
            if entry in by_uuid:
                held.add(by_uuid[entry])
        else:
            return (
                f"--require-job-gpu: {name} entry {entry!r} is neither a GPU index nor a "
                f"GPU UUID (MIG devices are not supported); no GPU is changed"
            )
    index = by_uuid[gpu] if gpu.startswith("GPU-") else int(gpu)
    if index not in held:
        return (
            f"GPU {gpu} is not one of the caller's job's GPUs ({name}={value!r}); "
            f"set only a GPU the job holds"
        )
    return None


def _smi(smi: str, args: list[str]) -> None:
    proc = run_nvidia_smi(args, smi=smi)
    if proc.returncode != 0:
        raise NvidiaSmiError(
            f"`nvidia-smi {' '.join(args)}` failed with exit code {proc.returncode}: "
            f"{process_output(proc) or '(no output)'} (changing clocks and limits needs root)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``opcost-gpu-setting``; returns the exit status.

    Exit status: 0 done, 1 ``nvidia-smi`` failed or is not trusted (nothing run), 2 refused
    arguments, or with ``--require-job-gpu`` a GPU the caller's job does not hold (nothing
    changed).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    gpu: str = args.gpu
    try:
        # Resolved once: every later call runs this same binary.
        smi = trusted_nvidia_smi()
        listed = list_gpus(smi=smi)
        if gpu.startswith("GPU-"):
            exists = any(g.uuid == gpu for g in listed)
        else:
            exists = any(g.index == int(gpu) for g in listed)
        if not exists:
            parser.error(f"GPU {gpu} does not exist here (`nvidia-smi -L` lists {len(listed)})")
        if args.require_job_gpu:
            refusal = check_job_holds(gpu, listed)
            if refusal is not None:
                parser.error(refusal)
        info = gpu_info(gpu, smi=smi)
        if args.lock_sm_clock is not None:
            mhz = args.lock_sm_clock
            clocks = info.supported_sm_clocks_mhz
            if mhz not in clocks:
                parser.error(
                    f"{mhz} MHz is not a supported SM clock of GPU {gpu} ({info.name}); "
                    + (
                        f"supported: {min(clocks)} to {max(clocks)} MHz, e.g. "
                        f"{', '.join(map(str, clocks[:4]))} (nvidia-smi --query-supported-clocks)"
                        if clocks
                        else "it reports none, so its clock cannot be locked"
                    )
                )
            _smi(smi, ["-i", gpu, "-lgc", f"{mhz},{mhz}"])
            print(f"GPU {gpu}: SM clock locked at {mhz} MHz")
        elif args.power_limit is not None:
            watts = args.power_limit
            low, high = info.power_min_limit_w, info.power_max_limit_w
            if low is None or high is None:
                parser.error(f"GPU {gpu} ({info.name}) reports no power limit range")
            if not low <= watts <= high:
                parser.error(
                    f"{watts} W is outside the power limit range of GPU {gpu} ({info.name}): "
                    f"{low:g} to {high:g} W"
                )
            _smi(smi, ["-i", gpu, "-pl", str(watts)])
            print(f"GPU {gpu}: power limit set to {watts} W")
        else:
            # Both steps are tried even if the first fails: a half-reset card is worse.
            errors = []
            for step in (
                ["-i", gpu, "-rgc"],
                *(
                    [["-i", gpu, "-pl", f"{info.power_default_limit_w:g}"]]
                    if info.power_default_limit_w is not None
                    else []
                ),
            ):
                try:
                    _smi(smi, step)
                except NvidiaSmiError as e:
                    errors.append(str(e))
            if errors:
                raise NvidiaSmiError("; ".join(errors))
            print(f"GPU {gpu}: SM clock unlocked, power limit {info.power_default_limit_w} W")
    except NvidiaSmiError as e:
        print(f"opcost-gpu-setting: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
