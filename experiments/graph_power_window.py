"""A network replayed from a CUDA graph: its time and power over a window between two reads
of the energy counter against :func:`opcost.tracing.graph_figures`' window between two
of its changes, each twice (GPU).

    python experiments/graph_power_window.py OUT [--models resnet18 vgg11] [--batches 8 64]

For each network, batch and mode (TF32 on): ``free``, the counter read at the start and
the end of a 1-s timed loop of the graph (``harness.measure``, as ``graph_figures``
measured before 2026-11-28), then ``edges`` (``graph_figures``), then both again.
Writes ``OUT/graph_power_window.parquet`` and prints, per window, the median ratio of its
power and time to the ``edges`` ones and how far its two passes differ.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import torch
import torchvision

from opcost import harness, nvml, tracing


def free(workload: harness.Workload, opts: harness.HarnessOptions, counter) -> dict:
    graph = harness.graphed(workload, torch.device(opts.device))
    timing = harness.measure(
        graph, replace(opts, min_run_time_s=1.0, warmup_s=0.05), counter.read_mj
    )
    per_call = timing.iterations * graph.calls_per_step
    energy_j = (timing.energy_counter_end_mj - timing.energy_counter_start_mj) / 1e3
    return {"time_s": timing.total_time_s / per_call, "power_w": energy_j / timing.total_time_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--models", nargs="+", default=["resnet18", "vgg11"])
    parser.add_argument("--batches", nargs="+", type=int, default=[8, 64])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    counter = nvml.EnergyCounter(nvml.cuda_device_uuid(0))
    rows = []
    for model in args.models:
        for batch in args.batches:
            for mode in ("inference", "training"):
                opts = harness.HarnessOptions(mode=mode, device="cuda")
                with torch.device("cuda"):
                    net = getattr(torchvision.models, model)()
                workload = harness.prepare_network(net, (batch, 3, 224, 224), opts)
                for pass_ in (1, 2):
                    row = free(workload, opts, counter)
                    rows.append({**row, "window": "free", "pass": pass_})
                    g = tracing.graph_figures(workload, opts, counter.read_mj)
                    rows.append(
                        {
                            "time_s": g["graph_time_s"],
                            "power_w": g["graph_power_w"],
                            "window": "edges",
                            "pass": pass_,
                        }
                    )
                for r in rows[-4:]:
                    r.update(model=model, batch=batch, mode=mode)
                del workload, net
                torch.cuda.empty_cache()
    counter.close()
    table = pd.DataFrame(rows).assign(
        gpu_name=torch.cuda.get_device_name(0), measured_unix_s=time.time()
    )
    table.to_parquet(args.out / "graph_power_window.parquet")
    keys = ["model", "batch", "mode"]
    mean = table.pivot_table(index=keys, columns="window", values=["power_w", "time_s"])
    wide = table.pivot_table(index=[*keys, "window"], columns="pass", values="power_w")
    print(table["gpu_name"].iloc[0], f"{len(mean)} network-batch-modes")
    print(mean.round(6).to_string())
    for window in ("free", "edges"):
        spread = (wide[1] / wide[2] - 1).abs().xs(window, level="window")
        power = (mean[("power_w", window)] / mean[("power_w", "edges")]).median()
        time_ = (mean[("time_s", window)] / mean[("time_s", "edges")]).median()
        print(
            f"{window:6s} power / edges median {power:.4f}, time / edges median {time_:.4f}, "
            f"two passes' power |1 - ratio| median {100 * spread.median():.2f} %, "
            f"max {100 * spread.max():.2f} %"
        )


if __name__ == "__main__":
    main()
