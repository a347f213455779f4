"""How well a whole network's time repeats on one host, against another host (GPU).

    python experiments/network_repeat.py [--config config/hopper.yaml] [--gpu h100]
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

from opcost import harness, profile
from opcost.config import load_study_file
from opcost.networks import build_model

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
    study = load_study_file(REPO / args.config)
    gpu = study.gpus[args.gpu]
    data = REPO / "tests" / "data" / Path(args.config).stem / args.gpu
    committed = pd.read_parquet(data / "dataset" / f"{args.gpu}.parquet")
    committed = committed[committed["kind"] == "network"].set_index(["model_input", "mode"])
    cases = [(mi, mode) for mi in study.model_inputs for mode in study.modes]
    times: dict[tuple, list[float]] = {c: [] for c in cases}
    for _ in range(args.repeats):
        for mi, mode in cases:
            opts = profile.options_for(gpu, mode, study.config["profile"])
            harness.configure_numerics(opts)
            times[(mi, mode)].append(measure(mi.model, mi.shape, opts))
    print(torch.cuda.get_device_name(0), torch.__version__, args.config, args.gpu)
    print(f"{'set':<34} {'mode':<9} {'median ms':>9} {'repeats %':>9} {'vs committed %':>14}")
    rows, spreads, shifts = [], [], []
    for (mi, mode), ts in times.items():
        median = statistics.median(ts)
        spreads.append(100 * (max(ts) / min(ts) - 1))
        before = committed["time_s"].get((mi.name, mode), float("nan"))
        shifts.append(100 * (median / before - 1))
        rows.append({"model_input": mi.name, "mode": mode, "times_s": ts, "committed_s": before})
        print(f"{mi.name:<34} {mode:<9} {1e3 * median:9.3f} {spreads[-1]:9.1f} {shifts[-1]:+14.1f}")
    print(
        f"median spread of repeats {statistics.median(spreads):.1f} %, "
        f"median |difference from the committed host| "
        f"{statistics.median(abs(v) for v in shifts):.1f} %"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
