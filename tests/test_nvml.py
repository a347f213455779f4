"""The NVML adapter with pynvml replaced by an autospec of the real module.

Counter values are those read on the H100 in tests/data/h100_probe/probe.log.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from unittest import mock

import pynvml
import pytest

import opcost.nvml
from opcost.nvml import EnergyCounter, NvmlError, cuda_device_uuid

UUID = "GPU-57781e38-0b78-5d74-ed7b-e2db6ddbacd3"


@pytest.fixture(scope="module")
def autospec_pynvml() -> mock.NonCallableMagicMock:
    # Autospeccing the whole module takes a quarter of a second: once per module.
    return mock.create_autospec(pynvml, instance=True)


@pytest.fixture
def nvml(
    monkeypatch: pytest.MonkeyPatch, autospec_pynvml: mock.NonCallableMagicMock
) -> mock.NonCallableMagicMock:
    autospec_pynvml.reset_mock(return_value=True, side_effect=True)
    monkeypatch.setattr(opcost.nvml, "_pynvml", autospec_pynvml)
    return autospec_pynvml


def nvml_error(name: str) -> pynvml.NVMLError:
    return pynvml.NVMLError(getattr(pynvml, name))


def test_reads_counter_in_millijoules(nvml: mock.NonCallableMagicMock) -> None:
    handle = object()
    nvml.nvmlDeviceGetHandleByUUID.return_value = handle
    # First read is the availability probe; then the counter as recorded on the H100.
    nvml.nvmlDeviceGetTotalEnergyConsumption.side_effect = [2547809, 2686140, 18081726]
    with EnergyCounter(UUID) as counter:
        assert counter.available
        assert counter.unavailable_reason is None
        start_mj, end_mj = counter.read_mj(), counter.read_mj()
    assert (start_mj, end_mj) == (2686140, 18081726)
    nvml.nvmlInit.assert_called_once_with()
    nvml.nvmlDeviceGetHandleByUUID.assert_called_once_with(UUID)
    assert all(c.args == (handle,) for c in nvml.nvmlDeviceGetTotalEnergyConsumption.call_args_list)
    nvml.nvmlShutdown.assert_called_once_with()


def test_counter_not_supported_is_unavailable(nvml: mock.NonCallableMagicMock) -> None:
    nvml.nvmlDeviceGetTotalEnergyConsumption.side_effect = nvml_error("NVML_ERROR_NOT_SUPPORTED")
    counter = EnergyCounter(UUID)
    assert not counter.available
    assert counter.read_mj() is None
    assert "no energy counter" in (counter.unavailable_reason or "")
    nvml.nvmlShutdown.assert_called_once_with()


def test_missing_library_is_unavailable(nvml: mock.NonCallableMagicMock) -> None:
    nvml.nvmlInit.side_effect = nvml_error("NVML_ERROR_LIBRARY_NOT_FOUND")
    counter = EnergyCounter(UUID)
    assert counter.read_mj() is None
    assert not counter.available
    nvml.nvmlDeviceGetHandleByUUID.assert_not_called()
    counter.close()
    nvml.nvmlShutdown.assert_not_called()


def test_missing_pynvml_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(opcost.nvml, "_pynvml", None)
    counter = EnergyCounter(UUID)
    assert counter.read_mj() is None
    assert "nvidia-ml-py" in (counter.unavailable_reason or "")


def test_unknown_uuid_raises_with_cause(nvml: mock.NonCallableMagicMock) -> None:
    nvml.nvmlDeviceGetHandleByUUID.side_effect = nvml_error("NVML_ERROR_NOT_FOUND")
    with pytest.raises(NvmlError, match="knows no GPU") as info:
        EnergyCounter(UUID)
    assert isinstance(info.value.__cause__, pynvml.NVMLError_NotFound)
    nvml.nvmlShutdown.assert_called_once_with()


def test_failure_after_start_raises(nvml: mock.NonCallableMagicMock) -> None:
    nvml.nvmlDeviceGetTotalEnergyConsumption.side_effect = [
        2547809,
        nvml_error("NVML_ERROR_GPU_IS_LOST"),
    ]
    counter = EnergyCounter(UUID)
    with pytest.raises(NvmlError, match="failed") as info:
        counter.read_mj()
    assert isinstance(info.value.__cause__, pynvml.NVMLError_GpuIsLost)


@pytest.mark.parametrize("uuid", ["0", "57781e38-0b78-5d74-ed7b-e2db6ddbacd3", "GPU-x", 3])
def test_malformed_uuid_refused_before_nvml(nvml: mock.NonCallableMagicMock, uuid: object) -> None:
    with pytest.raises(NvmlError, match="not a GPU UUID"):
        EnergyCounter(uuid)  # type: ignore[arg-type]
    nvml.nvmlInit.assert_not_called()


class _CudaUuid:
    """Like torch._C._CUDAUUID: str() gives the bare UUID (probe.log)."""

    def __str__(self) -> str:
        return "57781e38-0b78-5d74-ed7b-e2db6ddbacd3"


def fake_torch(available: bool = True, count: int = 2) -> SimpleNamespace:
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", uuid=_CudaUuid())
    cuda = SimpleNamespace(
        is_available=lambda: available,
        device_count=lambda: count,
        get_device_properties=mock.Mock(return_value=props),
    )
    return SimpleNamespace(cuda=cuda)


def test_cuda_device_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = fake_torch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert cuda_device_uuid(1) == UUID
    torch.cuda.get_device_properties.assert_called_once_with(1)


@pytest.mark.parametrize(
    ("available", "index", "match"), [(False, 0, "device: cpu"), (True, 2, "2")]
)
def test_cuda_device_uuid_errors(
    monkeypatch: pytest.MonkeyPatch, available: bool, index: int, match: str
) -> None:
    monkeypatch.setitem(sys.modules, "torch", fake_torch(available))
    with pytest.raises(NvmlError, match=match):
        cuda_device_uuid(index)
