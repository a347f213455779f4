"""How well a whole network's time repeats on one host, against another host (GPU).

    python bench/network_repeat.py [--config config/hopper.yaml] [--gpu h100]
                                   [--repeats 3] [--json out.json]

Measures every model-input set of the study's config in both modes as the profiling jobs
do (``opcost.harness``, the config's ``min_run_time_s`` and ``warmup_s``, the GPU
configuration's TF32), ``--repeats`` times in round-robin order, so that repeats of one
set lie minutes apart. Prints per set and mode the median time, the spread of the
repeats (max / min - 1), and the median's difference from the committed measurement of
the same set (``tests/data/<study>/<gpu>``, taken on another host of the same kind).
Why: at batch 1 and 8 the networks are host-bound, and the sums of ops measured on other
hosts miss them by more than 5 % (README, "What limits the figures at batch 1 and 8").
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pandas as pd
import torch
import yaml

from opcost import harness
from opcost.extract import build_model

REPO = Path(__file__).resolve().parents[1]


def measure(model: str, shape: tuple[int, ...], opts: harness.HarnessOptions) -> float:
    torch.manual_seed(0)
    workload = harness.prepare_network(build_model(model), shape, opts)
    t = harness.measure(workload, opts)
    del workload
    torch.cuda.empty_cache()
    return t.total_time_s / t.iterations


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config/hopper.yaml")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    config = yaml.safe_load((REPO / args.config).read_text())
    gpu = config["gpus"][args.gpu]
    study = Path(args.config).stem
    committed = pd.read_parquet(
        REPO / "tests" / "data" / study / args.gpu / "dataset" / f"{args.gpu}.parquet"
    )
    committed = committed[committed["kind"] == "network"].set_index(["model_input", "mode"])
    cases = [
        (m["model"], tuple(shape), mode)
        for m in config["models"]
        for shape in m["inputs"]
        for mode in config["modes"]
    ]
    times: dict[tuple, list[float]] = {c: [] for c in cases}
    for _ in range(args.repeats):
        for model, shape, mode in cases:
            opts = harness.HarnessOptions(
                mode=mode,
                device="cuda",
                tf32=gpu.get("tf32", True),
                min_run_time_s=config["profile"]["min_run_time_s"],
                warmup_s=config["profile"].get("warmup_s", 0.2),
            )
            harness.configure_numerics(opts)
            times[(model, shape, mode)].append(measure(model, shape, opts))
    print(torch.cuda.get_device_name(0), torch.__version__, args.config, args.gpu)
    print(f"{'set':<34} {'mode':<9} {'median ms':>9} {'repeats %':>9} {'vs committed %':>14}")
    rows = []
    for (model, shape, mode), ts in times.items():
        name = f"{model}_{'x'.join(map(str, shape))}"
        median = statistics.median(ts)
        spread = 100 * (max(ts) / min(ts) - 1)
        before = committed["time_s"].get((name, mode), float("nan"))
        vs = 100 * (median / before - 1)
        rows.append({"model_input": name, "mode": mode, "times_s": ts, "committed_s": before})
        print(f"{name:<34} {mode:<9} {1e3 * median:9.3f} {spread:9.1f} {vs:+14.1f}")
    spreads = [100 * (max(r["times_s"]) / min(r["times_s"]) - 1) for r in rows]
    shifts = [abs(100 * (statistics.median(r["times_s"]) / r["committed_s"] - 1)) for r in rows]
    print(
        f"median spread of repeats {statistics.median(spreads):.1f} %, "
        f"median |difference from the committed host| {statistics.median(shifts):.1f} %"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
