"""Power of a network in training at its initial values and one step away from them (GPU).

    python experiments/init_power.py [--sizes 64x3x224x224] [--models vit_b_16 resnet18 ...]
                               [--min-run-time 1.0] [--json out.json]

Each network is measured in training as the profiling jobs measure it (``opcost.harness``,
``min_run_time_s`` 1 s unless ``--min-run-time`` says otherwise, TF32 on), once at the
values torchvision initialises it with (``leave_init=False``) and once after the harness's
step off them (``harness.leave_initialisation``), in the order init, step, step, init so
that a drift of the GPU's temperature does not pass for an effect. Energy from the NVML
counter over the timed window. Prints per network the time and power of both, their
ratio, and how far the two measurements of one condition differ in power (``repeat %``,
the larger of the two).

Why: torchvision's vit_b_16 starts with a head of zeros, so in its first backward pass
every gradient behind the head is zero and its matrix products multiply zeros. Its ops,
measured alone with random weights and random gradients, drew 10 to 15 % more power than
the measured network (docs/validation.md). Results: docs/validation.md.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from opcost import harness
from opcost.networks import build_model
from opcost.nvml import EnergyCounter, cuda_device_uuid

MODELS = (
    "alexnet",
    "vgg11",
    "resnet18",
    "squeezenet1_1",
    "shufflenet_v2_x0_5",
    "regnet_x_400mf",
    "convnext_tiny",
    "vit_b_16",
)
ORDER = (False, True, True, False)  # leave_init per measurement: init, step, step, init


def measure(
    model: str, shape: tuple[int, ...], leave_init: bool, counter, min_run_time_s: float
) -> dict:
    opts = harness.HarnessOptions(mode="training", device="cuda", min_run_time_s=min_run_time_s)
    harness.configure_numerics(opts)
    torch.manual_seed(0)
    workload = harness.prepare_network(build_model(model), shape, opts, leave_init=leave_init)
    t = harness.measure(workload, opts, counter.read_mj)
    del workload
    torch.cuda.empty_cache()
    energy_j = (t.energy_counter_end_mj - t.energy_counter_start_mj) / 1e3
    window_s = t.timed_end_unix_s - t.timed_start_unix_s
    return {"time_s": t.total_time_s / t.iterations, "power_w": energy_j / window_s}


def repeat_pct(*pairs: list[dict]) -> float:
    """The larger difference in power of two measurements of one condition, in percent."""
    return max(100 * abs(a["power_w"] / b["power_w"] - 1) for a, b in pairs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["64x3x224x224"])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--min-run-time", type=float, default=1.0, help="timed seconds each")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    rows = []
    with EnergyCounter(cuda_device_uuid(0)) as counter:
        print(torch.cuda.get_device_name(0), torch.__version__)
        print(
            f"{'network':<32} {'time init ms':>12} {'step/init':>9} "
            f"{'power init W':>12} {'power step W':>12} {'step/init':>9} {'repeat %':>8}"
        )
        for size in args.sizes:
            shape = tuple(int(n) for n in size.split("x"))
            for model in args.models:
                runs = [measure(model, shape, leave, counter, args.min_run_time) for leave in ORDER]
                init = [r for r, leave in zip(runs, ORDER, strict=True) if not leave]
                step = [r for r, leave in zip(runs, ORDER, strict=True) if leave]
                row = {"model": model, "shape": size, "runs": runs}
                for name, group in (("init", init), ("step", step)):
                    for key in ("time_s", "power_w"):
                        row[f"{key}_{name}"] = statistics.fmean(r[key] for r in group)
                rows.append(row)
                print(
                    f"{model + ' ' + size:<32} {1e3 * row['time_s_init']:12.2f} "
                    f"{row['time_s_step'] / row['time_s_init']:9.3f} "
                    f"{row['power_w_init']:12.1f} {row['power_w_step']:12.1f} "
                    f"{row['power_w_step'] / row['power_w_init']:9.3f} "
                    f"{repeat_pct(init, step):8.1f}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
