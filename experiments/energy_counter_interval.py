"""How often NVML's energy counter and power reading change under load (GPU).

    python experiments/energy_counter_interval.py [--seconds 4]

Keeps the GPU busy with float32 matrix products for ``--seconds`` while polling, about
every 0.2 ms, the total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``) and the
power reading (``nvmlDeviceGetPowerUsage``, what ``power.draw`` reports). Prints the median
and the 10th and 90th percentiles of the intervals between changes of each, and the error
that an update interval ``u`` allows the energy of a window of 1 s read from the counter
(up to ``u`` of energy missed or added at each end, ``2u / 1 s`` of the window's energy
at worst). Why: the profiling jobs measure 1-s windows; docs/validation.md.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import pynvml
import torch

from opcost.nvml import cuda_device_uuid


def _busy(stop: threading.Event) -> None:
    a = torch.randn(8192, 8192, device="cuda")
    while not stop.is_set():
        for _ in range(8):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize()


def _intervals_ms(changes: list[float]) -> str:
    gaps = [1e3 * (b - a) for a, b in zip(changes, changes[1:], strict=False)]
    if len(gaps) < 3:
        return f"{len(gaps)} changes"
    q = statistics.quantiles(gaps, n=10)
    median = statistics.median(gaps)
    return f"median {median:.1f} ms (p10 {q[0]:.1f}, p90 {q[-1]:.1f}), {len(gaps)} changes"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args(argv)
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByUUID(cuda_device_uuid(0))
    stop = threading.Event()
    worker = threading.Thread(target=_busy, args=(stop,))
    worker.start()
    time.sleep(1.0)  # past the ramp-up
    energy_changes: list[float] = []
    power_changes: list[float] = []
    last_energy = last_power = None
    end = time.perf_counter() + args.seconds
    while (now := time.perf_counter()) < end:
        energy = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        power = pynvml.nvmlDeviceGetPowerUsage(handle)
        if energy != last_energy:
            energy_changes.append(now)
            last_energy = energy
        if power != last_power:
            power_changes.append(now)
            last_power = power
        time.sleep(0.0002)
    stop.set()
    worker.join()
    pynvml.nvmlShutdown()
    print(torch.cuda.get_device_name(0), pynvml.nvmlSystemGetDriverVersion())
    print("energy counter:", _intervals_ms(energy_changes[1:]))
    print("power reading: ", _intervals_ms(power_changes[1:]))
    gaps = [b - a for a, b in zip(energy_changes[1:], energy_changes[2:], strict=False)]
    if gaps:
        worst_pct = 200 * statistics.median(gaps)
        print(f"energy of a 1-s window from the counter: within ±{worst_pct:.0f} % at worst")


if __name__ == "__main__":
    main()
