"""Power windows between two reads of the energy counter against windows between two of
its changes, each measured twice on the same ops (GPU).

    python experiments/power_window_edges.py OUT [--gpu h100] [--configs 20] [--seed 0]
                                             [--windows 1.0,0.5] [--no-free]

Draws ``--configs`` configurations of the committed op space that have a power window
(rounds 4, 16 and 17: every family, dense and grouped convolutions), and measures each,
in both modes, under the configuration's numerics, with these windows, twice over, the
order rotated from one configuration to the next:

* ``free-1.0``: the energy counter read at the start and at the end of a loop of at
  least 1 s (the op-space jobs' windows before 2026-11-28);
* ``edges-S`` for each S of ``--windows``: a loop of S seconds, from the first change of
  the counter in it to the last (``opspace_measure._power_window``).

Writes ``OUT/power_window_edges.parquet`` (a row per configuration, mode, window and
pass) and prints, per window, how far its two passes differ (median, 90th percentile
and largest |1 - ratio|), its power over the longest edge window's (median, 10th and
90th percentile), and its wall time. The counter changes about every 100 ms
(``experiments/energy_counter_interval.py``), so a free 1-s window holds up to an update
interval of energy too much or too little at each end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from opcost import harness, nvml, opspace_measure, profile
from opcost.config import load_study_file

ROUNDS = ("r4", "r16", "r17")


def free_window(run: harness.Workload, device: torch.device, counter: Any) -> dict:
    """The earlier window: the counter read at the loop's start and end, 8 steps a block."""
    calls = run.calls_per_step
    with run.context(), harness._no_cyclic_gc():
        run.step()
        harness._sync(device)
        t0, e0, steps = time.perf_counter(), counter.read_mj(), 0
        while time.perf_counter() - t0 < 1.0:
            for _ in range(8):
                run.step()
            steps += 8
            harness._sync(device)
        e1, t1 = counter.read_mj(), time.perf_counter()
    return {
        "power_w": (e1 - e0) / 1e3 / (t1 - t0),
        "power_window_s": t1 - t0,
        "power_time_s": (t1 - t0) / (steps * calls),
    }


def windows(
    spec: dict,
    opts: harness.HarnessOptions,
    counter: Any,
    kinds: list[str],
    rotate: int,
) -> list[dict]:
    """Each window of ``kinds`` twice over, the order rotated by ``rotate``."""
    device = torch.device(opts.device)
    timed = opspace_measure.measure_one(spec, opts)
    if timed.get("status") != "ok":
        return []
    workload = harness.prepare_op(spec, opts)
    step_gpu_s = timed["gpu_time_s"] * workload.calls_per_step
    order = kinds[rotate % len(kinds) :] + kinds[: rotate % len(kinds)]
    rows = []
    for pass_ in (1, 2):
        for position, kind in enumerate(order):
            t = time.perf_counter()
            if kind == "free-1.0":
                repeats = opspace_measure.graph_repeats(step_gpu_s)
                try:
                    run = harness.graphed(workload, device, repeats)
                except harness.GraphCaptureFailed:
                    run = workload
                row = free_window(run, device, counter)
                del run
            else:
                seconds = float(kind.split("-")[1])
                row = opspace_measure._power_window(workload, device, counter, step_gpu_s, seconds)
            wall_s = time.perf_counter() - t
            rows.append(
                {**row, "window": kind, "pass": pass_, "position": position, "wall_s": wall_s}
            )
    del workload
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--configs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--windows", default="1.0", help="edge windows' seconds, S,S,...")
    parser.add_argument("--no-free", action="store_true", help="no free-1.0 window")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kinds = [] if args.no_free else ["free-1.0"]
    kinds += [f"edges-{float(s)}" for s in args.windows.split(",")]
    study = load_study_file("config/op-space.yaml")
    gpu = study.gpus[args.gpu]
    samples = pd.concat(
        pd.read_parquet(f"data/op-space/samples-{r}.parquet").assign(round_name=r) for r in ROUNDS
    )
    samples = samples[samples["power"]].sample(args.configs, random_state=args.seed)
    opts0 = profile.options_for(gpu, "inference", dict(study.config["profile"]))
    uuid = nvml.cuda_device_uuid(0)
    counter = nvml.EnergyCounter(uuid)
    reads = []
    for _ in range(50):
        t = time.perf_counter()
        counter.read_mj()
        reads.append(time.perf_counter() - t)
    print(f"a read of the energy counter: median {1e3 * statistics.median(reads):.3f} ms")
    rows = []
    with profile.device_to_itself(opts0.device):
        for mode in ("inference", "training"):
            opts = profile.options_for(gpu, mode, dict(study.config["profile"]))
            harness.configure_numerics(opts)
            for i, sample in enumerate(samples.itertuples(index=False)):
                spec = json.loads(sample.spec)
                for r in windows(spec, opts, counter, kinds, i):
                    rows.append({**r, "op_id": sample.op_id, "family": sample.family, "mode": mode})
    counter.close()
    table = pd.DataFrame(rows).assign(
        gpu_name=torch.cuda.get_device_name(0), gpu_uuid=uuid, measured_unix_s=time.time()
    )
    table.to_parquet(args.out / "power_window_edges.parquet")
    report(table)


def report(table: pd.DataFrame) -> None:
    """Print each window's repeat between its two passes and its power over the longest
    edge window's."""
    keys = ["op_id", "mode", "window"]
    wide = table.pivot_table(index=keys, columns="pass", values="power_w").dropna()
    mean = table.pivot_table(index=["op_id", "mode"], columns="window", values="power_w")
    edges = [w for w in table["window"].unique() if w.startswith("edges-")]
    longest = max(edges, key=lambda w: float(w.split("-")[1]))
    print(table["gpu_name"].iloc[0], f"{len(mean)} configuration-modes")
    for window in sorted(table["window"].unique()):
        r = (wide[1] / wide[2] - 1).abs().xs(window, level="window")
        ratio = (mean[window] / mean[longest]).dropna()
        wall_s = table.loc[table["window"] == window, "wall_s"].mean()
        print(
            f"{window:10s} two passes |1 - ratio| median {100 * r.median():.2f} %, 90th pct "
            f"{100 * r.quantile(0.9):.2f} %, max {100 * r.max():.2f} %; power / {longest} "
            f"median {ratio.median():.4f} (p10 {ratio.quantile(0.1):.4f}, p90 "
            f"{ratio.quantile(0.9):.4f}); {wall_s:.2f} s a window"
        )


if __name__ == "__main__":
    main()
