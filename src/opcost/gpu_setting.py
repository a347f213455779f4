"""Changing a GPU setting (locked SM clock, power limit) for a measurement, and always
changing it back.

:func:`applied_setting`, a context manager the measuring job uses, calls the privileged
script ``opcost-gpu-setting`` (:mod:`opcost.gpu_setting_script`, through ``sudo -n`` where
the site needs it) to apply a setting, and resets the card when the block ends, also when
it ends with an error or a SIGTERM (:func:`sigterm_unwinds` gives other code the same).

Site set-up (the sudo rule, the trusted ``nvidia-smi``, ``--require-job-gpu``) and what a
killed job leaves behind (a marker, from which the next job on that GPU resets the card,
:func:`recover_stale_setting`): docs/gpu-settings.md.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from opcost.errors import OpcostError
from opcost.names import Setting
from opcost.nvsmi import NvidiaSmiError, check_gpu, process_output, run_captured

log = logging.getLogger(__name__)

DEFAULT_COMMAND: tuple[str, ...] = ("opcost-gpu-setting",)
#: How long one call of the script may take (nvidia-smi answers in well under a second).
COMMAND_TIMEOUT_S = 120.0


class GpuSettingError(OpcostError, RuntimeError):
    """A GPU setting could not be applied or reset."""


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
        proc = run_captured(argv, timeout_s=COMMAND_TIMEOUT_S)
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
        output = process_output(proc)
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
    # Imported here: the worker imports this module for every request (sigterm_unwinds),
    # and importing it alone loads no pandas.
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
    :class:`opcost.nvsmi_logger.PowerLogger` and :func:`applied_setting` clean up first. Python
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
