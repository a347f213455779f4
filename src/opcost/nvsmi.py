"""The adapter to the ``nvidia-smi`` binary: one-shot queries and the checks of their input.

Everything here calls ``nvidia-smi`` with an argument list (never through a shell) and
turns its failures into :class:`NvidiaSmiError` with a message that says what to do next.
The background power logger is :class:`opcost.nvsmi_logger.PowerLogger`.
Tests put a fake ``nvidia-smi`` (``tests/fakes/nvidia-smi``) first on ``PATH``; it replays a
power log recorded on a real H100, so the formats handled here are the real ones:

- a query header names each field with its unit: ``clocks.sm`` becomes
  ``clocks.current.sm [MHz]``; ``nounits`` strips the unit from the values only;
- an unknown field makes ``nvidia-smi`` exit 2 with
  ``Field "x" is not a valid field to query.``;
- a field the GPU or driver does not support reads ``[N/A]`` or ``[Not Supported]``.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from opcost.errors import OpcostError

#: A GPU as ``nvidia-smi -i`` takes it here: an index without leading zeros, or a UUID.
GPU_UUID_PATTERN = r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
GPU_INDEX_PATTERN = r"0|[1-9][0-9]{0,2}"
#: A query field name such as ``power.draw.instant`` (also guards the comma-joined list).
FIELD_PATTERN = r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*"

#: The fields a power log asks for, in this order, where the GPU supports them.
DEFAULT_FIELDS: tuple[str, ...] = (
    "timestamp",
    "power.draw",
    "power.draw.instant",
    "clocks.sm",
    "clocks.mem",
    "temperature.gpu",
    "utilization.gpu",
    "power.limit",
)

#: Values that mean "this GPU or driver does not report this field".
UNSUPPORTED_VALUES = frozenset({"[N/A]", "[Not Supported]", "N/A"})

#: How long a one-shot query may take before the driver is presumed hung.
QUERY_TIMEOUT_S = 30.0

_GPU_RE = re.compile(f"{GPU_INDEX_PATTERN}|{GPU_UUID_PATTERN}")
_FIELD_RE = re.compile(FIELD_PATTERN)
_INVALID_FIELD_RE = re.compile(r'Field "([^"]*)" is not a valid field to query')
_LIST_RE = re.compile(r"GPU (\d+): (.*) \(UUID: (" + GPU_UUID_PATTERN + r")\)")

#: The error when ``nvidia-smi`` is not installed.
MISSING_MESSAGE = (
    "nvidia-smi was not found on PATH, so power cannot be measured here; install the "
    "NVIDIA driver utilities, or set `device: cpu` for this GPU configuration to measure "
    "time only"
)


class NvidiaSmiError(OpcostError, RuntimeError):
    """``nvidia-smi`` is missing, failed, or answered something this module cannot read."""


@dataclass(frozen=True)
class GpuListing:
    """One line of ``nvidia-smi -L``."""

    index: int
    name: str
    uuid: str


@dataclass(frozen=True)
class GpuInfo:
    """What ``nvidia-smi`` says about one GPU: identity, power limits, SM clocks.

    Power limits are ``None`` where the GPU does not report them (``[N/A]``).
    ``supported_sm_clocks_mhz`` lists the distinct graphics clocks of
    ``--query-supported-clocks``, highest first; empty where the GPU reports none.
    """

    name: str
    uuid: str
    driver_version: str
    power_limit_w: float | None
    power_min_limit_w: float | None
    power_max_limit_w: float | None
    power_default_limit_w: float | None
    max_sm_clock_mhz: int | None
    supported_sm_clocks_mhz: tuple[int, ...]


def check_gpu(gpu: object) -> str:
    """Return ``gpu`` if it is an index (``0``, ``3``) or a UUID (``GPU-57781e38-...``).

    Raises:
        NvidiaSmiError: anything else (it would reach ``nvidia-smi -i`` otherwise).
    """
    if not isinstance(gpu, str) or not _GPU_RE.fullmatch(gpu):
        raise NvidiaSmiError(
            f"GPU {gpu!r} is neither an index (0, 1, ...) nor a UUID (GPU-xxxxxxxx-xxxx-xxxx-"
            f"xxxx-xxxxxxxxxxxx, as `nvidia-smi -L` prints it)"
        )
    return gpu


def check_fields(fields: Sequence[str]) -> list[str]:
    """Return ``fields`` as a list if every one is a well-formed query field name."""
    if isinstance(fields, str):
        raise NvidiaSmiError(f"fields must be a list of names, not the string {fields!r}")
    bad = [f for f in fields if not isinstance(f, str) or not _FIELD_RE.fullmatch(f)]
    if bad or not fields:
        raise NvidiaSmiError(
            f"query fields {bad or list(fields)!r} are malformed; use nvidia-smi field names "
            f"such as 'power.draw' (see `nvidia-smi --help-query-gpu`)"
        )
    return list(fields)


def nvidia_smi_path() -> str:
    """The absolute path of ``nvidia-smi`` on ``PATH``.

    For code that runs with its caller's own rights (profiling jobs, power logs): it
    runs whatever the caller's ``PATH`` names, as a shell would. The privileged script
    resolves ``nvidia-smi`` itself (:func:`opcost.gpu_setting_script.trusted_nvidia_smi`).

    Raises:
        NvidiaSmiError: it is not installed; the message suggests ``device: cpu``.
    """
    found = shutil.which("nvidia-smi")
    if found is None:
        raise NvidiaSmiError(MISSING_MESSAGE)
    return os.path.abspath(found)


def run_captured(argv: Sequence[str], *, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as an argument list, never through a shell, with no input; return the
    finished process with its output as text (any exit code).

    Raises:
        FileNotFoundError: the program is missing.
        subprocess.TimeoutExpired: it ran longer than ``timeout_s``.
    """
    return subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def process_output(proc: subprocess.CompletedProcess[str]) -> str:
    """Stdout and stderr of a finished process on one line (nvidia-smi prints some errors
    on stdout, others on stderr)."""
    return " ".join(s.strip() for s in (proc.stdout, proc.stderr) if s and s.strip())


def run_nvidia_smi(
    args: Sequence[str], *, smi: str | None = None, timeout_s: float = QUERY_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run ``nvidia-smi *args`` once and return the finished process (any exit code).

    Args:
        args: the arguments, each one list item; no shell ever sees them.
        smi: the binary to run; default: :func:`nvidia_smi_path`.
        timeout_s: how long to wait before the driver is presumed hung.

    Raises:
        NvidiaSmiError: the binary is missing or did not answer in time.
    """
    exe = smi if smi is not None else nvidia_smi_path()
    try:
        return run_captured([exe, *args], timeout_s=timeout_s)
    except FileNotFoundError as e:
        raise NvidiaSmiError(MISSING_MESSAGE) from e
    except subprocess.TimeoutExpired as e:
        raise NvidiaSmiError(
            f"`nvidia-smi {' '.join(args)}` did not answer within {timeout_s:g} s; the driver "
            f"may be hung: run `nvidia-smi` by hand and ask the admin if it hangs too"
        ) from e


def _checked(
    args: Sequence[str], *, smi: str | None = None, timeout_s: float = QUERY_TIMEOUT_S
) -> str:
    proc = run_nvidia_smi(args, smi=smi, timeout_s=timeout_s)
    if proc.returncode != 0:
        raise NvidiaSmiError(
            f"`nvidia-smi {' '.join(args)}` failed with exit code {proc.returncode}: "
            f"{process_output(proc) or '(no output)'}"
        )
    return proc.stdout


def _csv_rows(text: str) -> list[list[str]]:
    return [row for row in csv.reader(text.splitlines(), skipinitialspace=True) if row]


def list_gpus(*, smi: str | None = None) -> list[GpuListing]:
    """The GPUs of ``nvidia-smi -L`` (MIG instances, listed indented, are left out)."""
    out = _checked(["-L"], smi=smi)
    gpus = []
    for line in out.splitlines():
        match = _LIST_RE.fullmatch(line.strip())
        if match and not line.startswith((" ", "\t")):
            gpus.append(GpuListing(int(match[1]), match[2], match[3]))
    return gpus


def supported_fields(
    gpu: str, wanted: Sequence[str] = DEFAULT_FIELDS, *, smi: str | None = None
) -> list[str]:
    """The fields of ``wanted`` that this GPU and driver report, in the order given.

    A field the driver does not know makes ``nvidia-smi`` exit 2 naming that one field;
    it is dropped and the query repeated. A field that reads ``[N/A]`` or
    ``[Not Supported]`` in the remaining one-shot query is dropped as well.

    Args:
        gpu: an index or a UUID (``GPU-...``).
        wanted: query field names (default :data:`DEFAULT_FIELDS`).
        smi: the binary to run; default: the one on ``PATH``.

    Raises:
        NvidiaSmiError: ``nvidia-smi`` is missing or fails for another reason, or a
            field reports an error other than "not supported" (e.g. ``[Unknown Error]``).
    """
    check_gpu(gpu)
    remaining = check_fields(wanted)
    # Each round drops one invalid field, so len(wanted) + 1 rounds always suffice.
    for _ in range(len(remaining) + 1):
        if not remaining:
            return []
        args = [f"--query-gpu={','.join(remaining)}", "--format=csv,noheader,nounits", "-i", gpu]
        proc = run_nvidia_smi(args, smi=smi)
        if proc.returncode == 0:
            break
        invalid = _INVALID_FIELD_RE.search(process_output(proc))
        if proc.returncode == 2 and invalid and invalid[1] in remaining:
            remaining.remove(invalid[1])
            continue
        raise NvidiaSmiError(
            f"`nvidia-smi {' '.join(args)}` failed with exit code {proc.returncode}: "
            f"{process_output(proc) or '(no output)'}"
        )
    rows = _csv_rows(proc.stdout)
    if len(rows) != 1 or len(rows[0]) != len(remaining):
        raise NvidiaSmiError(
            f"expected one row of {len(remaining)} values from nvidia-smi for GPU {gpu}, "
            f"got {proc.stdout!r}"
        )
    kept = []
    for field, value in zip(remaining, rows[0], strict=True):
        if value in UNSUPPORTED_VALUES:
            continue
        if value.startswith("[") and value.endswith("]"):
            raise NvidiaSmiError(
                f"GPU {gpu} reports {value} for {field}; run `nvidia-smi -q -i {gpu}` to see "
                f"its state (it may need a reset by the admin)"
            )
        kept.append(field)
    return kept


def _number(value: str) -> float | None:
    if value in UNSUPPORTED_VALUES:
        return None
    try:
        return float(value)
    except ValueError as e:
        raise NvidiaSmiError(f"nvidia-smi answered {value!r} where a number was expected") from e


_INFO_FIELDS = (
    "name",
    "uuid",
    "driver_version",
    "power.limit",
    "power.min_limit",
    "power.max_limit",
    "power.default_limit",
    "clocks.max.sm",
)


def supported_sm_clocks_mhz(gpu: str, *, smi: str | None = None) -> tuple[int, ...]:
    """Distinct SM (graphics) clocks the GPU can be locked to, highest first, MHz."""
    check_gpu(gpu)
    out = _checked(
        ["--query-supported-clocks=mem,gr", "--format=csv,noheader,nounits", "-i", gpu], smi=smi
    )
    clocks: set[int] = set()
    for row in _csv_rows(out):
        if len(row) == 2 and row[1].isdigit():
            clocks.add(int(row[1]))
        elif any(v in UNSUPPORTED_VALUES for v in row):
            # GPUs without application clocks answer [N/A]: nothing can be locked.
            return ()
        else:
            raise NvidiaSmiError(f"cannot read supported clocks of GPU {gpu} from {out!r}")
    return tuple(sorted(clocks, reverse=True))


def gpu_info(gpu: str, *, smi: str | None = None) -> GpuInfo:
    """Identity, power limits and SM clocks of one GPU, from two ``nvidia-smi`` queries.

    Args:
        gpu: an index or a UUID (``GPU-...``).
        smi: the binary to run; default: the one on ``PATH``.

    Raises:
        NvidiaSmiError: ``nvidia-smi`` is missing, fails, or answers in an unknown format.
    """
    check_gpu(gpu)
    out = _checked(
        [f"--query-gpu={','.join(_INFO_FIELDS)}", "--format=csv,noheader,nounits", "-i", gpu],
        smi=smi,
    )
    rows = _csv_rows(out)
    if len(rows) != 1 or len(rows[0]) != len(_INFO_FIELDS):
        raise NvidiaSmiError(f"cannot read the properties of GPU {gpu} from {out!r}")
    name, uuid, driver, limit, min_limit, max_limit, default_limit, max_sm = rows[0]
    max_sm_mhz = _number(max_sm)
    return GpuInfo(
        name=name,
        uuid=uuid,
        driver_version=driver,
        power_limit_w=_number(limit),
        power_min_limit_w=_number(min_limit),
        power_max_limit_w=_number(max_limit),
        power_default_limit_w=_number(default_limit),
        max_sm_clock_mhz=None if max_sm_mhz is None else int(max_sm_mhz),
        supported_sm_clocks_mhz=supported_sm_clocks_mhz(gpu, smi=smi),
    )
