"""Changing a GPU setting (locked SM clock, power limit) and always changing it back.

Two halves:

- :func:`main`, the console script ``opcost-gpu-setting``: the only code that needs
  privileges. It checks its arguments strictly, then runs ``nvidia-smi -lgc``, ``-pl`` or
  ``-rgc``. It imports neither torch nor anything heavy, so it starts fast.
- :func:`applied_setting`, a context manager the measuring job uses: it calls that script
  (through ``sudo -n`` where the site needs it) to apply a setting, and resets the card when
  the block ends, also when it ends with an error or a SIGTERM.

Site set-up (the sudo rule, the trusted ``nvidia-smi``, ``--require-job-gpu``) and what a
killed job leaves behind (a marker, from which the next job on that GPU resets the card):
docs/gpu-settings.md.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from opcost.errors import OpcostError
from opcost.names import Setting
from opcost.nvsmi import (
    GPU_INDEX_PATTERN,
    GPU_UUID_PATTERN,
    GpuListing,
    NvidiaSmiError,
    check_gpu,
    gpu_info,
    list_gpus,
    nvidia_smi_path,
    run_nvidia_smi,
)

log = logging.getLogger(__name__)

DEFAULT_COMMAND: tuple[str, ...] = ("opcost-gpu-setting",)
#: How long one call of the script may take (nvidia-smi answers in well under a second).
COMMAND_TIMEOUT_S = 120.0
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


class GpuSettingError(OpcostError, RuntimeError):
    """A GPU setting could not be applied or reset."""


# ---------------------------------------------------------------------------------------
# The privileged script


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
        output = " ".join(s.strip() for s in (proc.stdout, proc.stderr) if s and s.strip())
        raise NvidiaSmiError(
            f"`nvidia-smi {' '.join(args)}` failed with exit code {proc.returncode}: "
            f"{output or '(no output)'} (changing clocks and limits needs root)"
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


# ---------------------------------------------------------------------------------------
# The job side


def state_dir() -> Path:
    """Where markers of applied settings live: ``$OPCOST_STATE_DIR`` or ``~/.cache/opcost``."""
    configured = os.environ.get("OPCOST_STATE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "opcost"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "localhost"


def _check_gpu(gpu: object) -> str:
    try:
        return check_gpu(gpu)
    except NvidiaSmiError as e:
        raise GpuSettingError(str(e)) from e


def marker_path(gpu: str) -> Path:
    """The marker file that says a setting is applied to ``gpu`` on this host."""
    return state_dir() / f"gpu-setting-{_host()}-{_check_gpu(gpu)}.json"


def _process_start(pid: int) -> str | None:
    # Start time in clock ticks since boot (field 22 of /proc/<pid>/stat): tells a
    # process apart from a later one that got the same pid.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(marker: dict[str, Any]) -> bool:
    pid = marker.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    started = marker.get("process_start")
    if started is not None and Path("/proc/self/stat").exists():
        return _process_start(pid) == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _call(command: Sequence[str], args: list[str]) -> None:
    argv = [*command, *args]
    try:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError as e:
        raise GpuSettingError(
            f"cannot run {' '.join(command)}: {e.strerror}; install opcost where the job runs, "
            f"have the admin allow the script with sudo (see opcost.gpu_setting), or measure "
            f"with setting `default` only"
        ) from e
    except subprocess.TimeoutExpired as e:
        raise GpuSettingError(
            f"`{' '.join(argv)}` did not finish within {COMMAND_TIMEOUT_S:g} s"
        ) from e
    if proc.returncode != 0:
        output = " ".join(s.strip() for s in (proc.stdout, proc.stderr) if s and s.strip())
        hint = (
            "; sudo wants a password: the admin must allow the script without one (NOPASSWD)"
            if "password" in output
            else ""
        )
        raise GpuSettingError(
            f"`{' '.join(argv)}` failed with exit code {proc.returncode}: "
            f"{output or '(no output)'}{hint}"
        )


def _check_command(command: Sequence[str]) -> tuple[str, ...]:
    if isinstance(command, str) or not command or not all(isinstance(c, str) for c in command):
        raise GpuSettingError(
            f"the GPU setting command must be a non-empty list of arguments, e.g. "
            f"['sudo', '-n', 'opcost-gpu-setting'], not {command!r}"
        )
    return tuple(command)


def recover_stale_setting(gpu: str, command: Sequence[str] = DEFAULT_COMMAND) -> bool:
    """Reset ``gpu`` if a job that applied a setting to it died without resetting it.

    Returns:
        True if a stale marker was found and the GPU reset, False if there was none.

    Raises:
        GpuSettingError: the marker's process is still running (two jobs share the GPU),
            or the reset failed (the marker stays, so the next job tries again).
    """
    command = _check_command(command)
    path = marker_path(gpu)  # also checks gpu
    try:
        marker = json.loads(path.read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        marker = {}  # unreadable: a setting may be applied, so reset all the same
    if not isinstance(marker, dict):
        marker = {}
    if _owner_alive(marker):
        raise GpuSettingError(
            f"GPU {gpu} has setting {marker.get('setting')!r} applied by process "
            f"{marker.get('pid')}, which is still running; run one profile job per GPU at a "
            f"time, or delete {path} if that process is no opcost job"
        )
    log.warning(
        "GPU %s: a previous job (pid %s) applied %r and was killed before it reset the card; "
        "resetting it now (marker %s)",
        gpu,
        marker.get("pid"),
        marker.get("setting"),
        path,
    )
    _call(command, ["--gpu", gpu, "--reset"])
    path.unlink(missing_ok=True)
    return True


def _write_marker(path: Path, gpu: str, setting: Setting, command: tuple[str, ...]) -> None:
    """Write the marker atomically: a reader sees no marker or a whole one."""
    # Imported here: the privileged script (main) must not load pandas.
    from opcost.io import write_atomic

    marker = {
        "gpu": gpu,
        "setting": setting.name,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process_start": _process_start(os.getpid()),
        "command": list(command),
        "applied_unix_s": time.time(),
    }
    write_atomic(path, json.dumps(marker) + "\n")


def _raise_system_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[bool]:
    """Within the block, SIGTERM raises ``SystemExit(143)`` so that ``finally`` blocks run.

    By default SIGTERM ends Python at once; with this, context managers such as
    :class:`opcost.nvsmi.PowerLogger` and :func:`applied_setting` clean up first. Python
    runs signal handlers in the main thread only: elsewhere this does nothing and yields
    False (True when installed). The previous handler is restored afterwards.
    """
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.signal(signal.SIGTERM, _raise_system_exit)
    try:
        yield True
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _reset_at_exit(gpu: str, command: tuple[str, ...], path: Path) -> None:
    try:
        _call(command, ["--gpu", gpu, "--reset"])
        path.unlink(missing_ok=True)
    except GpuSettingError as e:
        log.error("GPU %s: reset at exit failed, the next job will retry: %s", gpu, e)


@contextlib.contextmanager
def applied_setting(
    setting: Setting, gpu: str, command: Sequence[str] = DEFAULT_COMMAND
) -> Iterator[Setting]:
    """Apply ``setting`` to ``gpu`` for the duration of the block, then reset the GPU.

    First, a stale marker of a killed job on this GPU triggers a reset (also for
    ``default``, which must not measure a card left locked). For ``default`` nothing else
    happens. Otherwise: write the marker, run ``command --gpu <gpu> --lock-sm-clock <MHz>``
    (or ``--power-limit <W>``), yield, and always run ``command --gpu <gpu> --reset`` and
    remove the marker afterwards.

    In the main thread a SIGTERM during the block raises ``SystemExit(143)``, so the reset
    runs before the job ends; a SIGTERM during the reset is held until the reset is done.
    In another thread Python cannot catch signals: the reset is then also registered with
    ``atexit`` (which covers an interpreter that exits while the block is still open), and
    a SIGTERM there behaves like a SIGKILL: the next job resets from the marker.

    Args:
        setting: from :func:`opcost.names.parse_setting`.
        gpu: the GPU's UUID (preferred: stable across jobs) or index.
        command: the privileged script as an argument list; a site prefixes it with
            ``sudo -n`` (see the module docstring).

    Raises:
        GpuSettingError: applying or resetting failed (a failed reset leaves the marker),
            or another running process holds a setting on this GPU.
    """
    _check_gpu(gpu)
    command = _check_command(command)
    recover_stale_setting(gpu, command)
    if setting.kind == "default":
        yield setting
        return
    if setting.kind == "sm":
        action = ["--lock-sm-clock", str(setting.value)]
    elif setting.kind == "pl":
        action = ["--power-limit", str(setting.value)]
    else:
        raise GpuSettingError(f"unknown GPU setting {setting!r}; use opcost.names.parse_setting")

    path = marker_path(gpu)
    _write_marker(path, gpu, setting, command)
    in_main = threading.current_thread() is threading.main_thread()
    resetting = False
    held: list[int] = []

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if resetting:
            held.append(signum)  # raised once the card is reset
            return
        raise SystemExit(128 + signum)

    at_exit: Callable[[], None] = lambda: _reset_at_exit(gpu, command, path)  # noqa: E731
    previous = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
    if not in_main:
        atexit.register(at_exit)
    try:
        try:
            _call(command, ["--gpu", gpu, *action])
            yield setting
        except BaseException as body_error:
            resetting = True
            try:
                _call(command, ["--gpu", gpu, "--reset"])
                path.unlink(missing_ok=True)
            except GpuSettingError as reset_error:
                body_error.add_note(f"and resetting GPU {gpu} failed too: {reset_error}")
            raise
        resetting = True
        _call(command, ["--gpu", gpu, "--reset"])
        path.unlink(missing_ok=True)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        else:
            atexit.unregister(at_exit)
    if held:
        raise SystemExit(128 + held[0])


if __name__ == "__main__":
    sys.exit(main())
