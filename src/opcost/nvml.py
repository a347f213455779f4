"""The adapter to NVML (``pynvml`` from ``nvidia-ml-py``): the GPU's total-energy counter.

The counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver was
loaded) cross-checks the energy integrated from the ``nvidia-smi`` power log. Where NVML
or the counter is missing, :class:`EnergyCounter` says so (``available`` is False and
:meth:`EnergyCounter.read_mj` returns None); it never substitutes a number. Other NVML
failures become :class:`NvmlError`.

Tests replace the module object :data:`_pynvml` with ``unittest.mock.create_autospec`` of
the real ``pynvml``; the exception class and error codes used here are bound from the real
module at import, so an autospec'd module can raise real ``pynvml.NVMLError`` instances.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

from opcost.errors import OpcostError
from opcost.nvsmi import GPU_UUID_PATTERN

_pynvml: ModuleType | None
try:
    import pynvml as _pynvml
    from pynvml import NVMLError as _NVMLError
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
    _pynvml = None

    class _NVMLError(Exception):  # type: ignore[no-redef]
        """Stands in for pynvml.NVMLError where pynvml is missing; never raised."""


def _codes(*names: str) -> frozenset[int]:
    return frozenset(getattr(_pynvml, n) for n in names if hasattr(_pynvml, n))


#: NVML answers meaning "no counter here" rather than "something broke".
_UNAVAILABLE = _codes(
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NO_PERMISSION",
)
_NOT_FOUND = _codes("NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT")
_UUID_RE = re.compile(GPU_UUID_PATTERN)


class NvmlError(OpcostError, RuntimeError):
    """NVML failed in a way that is not simply "no energy counter on this machine"."""


def _code(e: BaseException) -> int | None:
    value = getattr(e, "value", None)
    return value if isinstance(value, int) else None


class EnergyCounter:
    """The NVML total-energy counter of one GPU. Units: mJ.

    Construction initialises NVML, finds the GPU by UUID and reads the counter once. If
    NVML or the counter is missing (no library, no driver, a GPU older than Volta, no
    permission), ``available`` is False, ``unavailable_reason`` says why, and
    :meth:`read_mj` returns None. Use as a context manager, or call :meth:`close`.

    Args:
        uuid: ``GPU-...`` as ``nvidia-smi -L`` and :func:`cuda_device_uuid` give it.

    Raises:
        NvmlError: the UUID is malformed or unknown to NVML, or NVML fails otherwise.
    """

    def __init__(self, uuid: str) -> None:
        if not isinstance(uuid, str) or not _UUID_RE.fullmatch(uuid):
            raise NvmlError(
                f"{uuid!r} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx); get it "
                f"from opcost.nvml.cuda_device_uuid"
            )
        self.uuid = uuid
        self.unavailable_reason: str | None = None
        self._handle: Any = None
        self._initialised = False
        if _pynvml is None:
            self.unavailable_reason = "pynvml is not installed (pip install nvidia-ml-py)"
            return
        try:
            _pynvml.nvmlInit()
        except _NVMLError as e:
            if _code(e) in _UNAVAILABLE:
                self.unavailable_reason = f"NVML cannot start: {e}"
                return
            raise NvmlError(f"NVML failed to start: {e}") from e
        self._initialised = True
        try:
            handle = _pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except _NVMLError as e:
            self.close()
            if _code(e) in _NOT_FOUND:
                raise NvmlError(
                    f"NVML knows no GPU {uuid} ({e}); check it against `nvidia-smi -L` on this "
                    f"host (under CUDA_VISIBLE_DEVICES take the UUID from cuda_device_uuid)"
                ) from e
            raise NvmlError(f"NVML cannot open GPU {uuid}: {e}") from e
        try:
            _pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except _NVMLError as e:
            self.close()
            if _code(e) in _UNAVAILABLE:
                self.unavailable_reason = f"GPU {uuid} has no energy counter: {e}"
                return
            raise NvmlError(f"reading the energy counter of GPU {uuid} failed: {e}") from e
        self._handle = handle

    @property
    def available(self) -> bool:
        """Whether the counter can be read."""
        return self._handle is not None

    def read_mj(self) -> int | None:
        """The counter now, in millijoules since the driver loaded; None if unavailable.

        Raises:
            NvmlError: the counter was readable at construction and now fails.
        """
        if self._handle is None or _pynvml is None:
            return None
        try:
            return int(_pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except _NVMLError as e:
            raise NvmlError(f"reading the energy counter of GPU {self.uuid} failed: {e}") from e

    def close(self) -> None:
        """Release NVML (its init is reference-counted, so other users are unaffected)."""
        self._handle = None
        if self._initialised and _pynvml is not None:
            self._initialised = False
            try:
                _pynvml.nvmlShutdown()
            except _NVMLError as e:
                raise NvmlError(f"NVML failed to shut down: {e}") from e

    def __enter__(self) -> EnergyCounter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def cuda_device_uuid(torch_index: int) -> str:
    """The UUID (``GPU-...``) of the GPU that torch calls ``cuda:<torch_index>``.

    Under ``CUDA_VISIBLE_DEVICES`` torch's index 0 may be the host's GPU 3; the UUID names
    the same card for torch, ``nvidia-smi -i`` and NVML, so the job logs its own GPU.

    Raises:
        NvmlError: CUDA is not available, the index does not exist, or torch gives no
            UUID of the expected form (e.g. a MIG instance or a non-NVIDIA device).
    """
    import torch  # here, not at module level: the privileged script must not load torch

    if not torch.cuda.is_available():
        raise NvmlError("CUDA is not available here; set `device: cpu` to measure time only")
    count = torch.cuda.device_count()
    if not isinstance(torch_index, int) or not 0 <= torch_index < count:
        raise NvmlError(f"no CUDA device {torch_index!r}: torch sees {count} device(s)")
    raw = str(torch.cuda.get_device_properties(torch_index).uuid)
    uuid = raw if raw.startswith("GPU-") else f"GPU-{raw}"
    if not _UUID_RE.fullmatch(uuid):
        raise NvmlError(
            f"torch gives {raw!r} as the UUID of cuda:{torch_index}, not the GPU-xxxxxxxx-... "
            f"form nvidia-smi uses (MIG instances are not supported)"
        )
    return uuid
