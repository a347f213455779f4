"""Which cuDNN kernels run the op space's dense 3x3 convolutions with TF32 off?

    python experiments/conv_algos.py --rounds 8 11 --out conv_algos.csv

Each configuration of the given op-space rounds (``data/op-space/samples-r{round}.parquet``)
is run in inference and training with TF32 off, as the op space measures it
(:func:`opcost.harness.prepare_op`, two warm-up steps), and one step is recorded with
``torch.profiler``: per configuration and mode, the names of the kernels it ran and their
summed durations on the device. Written as CSV (``op_id``, ``mode``, ``kernel``,
``n``, ``gpu_time_s``: one row per distinct kernel name). Whether cuDNN ran a fast
algorithm (fewer multiplications than the direct count, above the FP32 units' peak on a
dense 3x3 convolution) is then a question of which kernel ran, which a model of cuDNN's
choice could learn from the shapes (docs/results.md, "Open questions").
"""

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from opcost import harness

REPO = Path(__file__).resolve().parents[1]

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rounds", type=int, nargs="+", default=[8, 11])
parser.add_argument("--out", type=Path, required=True)
args = parser.parse_args()

samples = pd.concat(
    [pd.read_parquet(REPO / f"data/op-space/samples-r{r}.parquet") for r in args.rounds],
    ignore_index=True,
).drop_duplicates("op_id")
print(f"{torch.cuda.get_device_name()}; {len(samples)} configurations, TF32 off", flush=True)
args.out.parent.mkdir(parents=True, exist_ok=True)
out = open(args.out, "w", newline="")  # noqa: SIM115 - written row by row, kept on a timeout
writer = csv.DictWriter(out, fieldnames=["op_id", "mode", "kernel", "n", "gpu_time_s"])
writer.writeheader()
rows = 0
for i, (op_id, spec_json) in enumerate(zip(samples["op_id"], samples["spec"], strict=True)):
    spec = json.loads(spec_json)
    for mode in ("inference", "training"):
        opts = harness.HarnessOptions(mode=mode, device="cuda", tf32=False)
        harness.configure_numerics(opts)
        workload = harness.prepare_op(spec, opts)
        with workload.context():
            for _ in range(2):
                workload.step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                workload.step()
                torch.cuda.synchronize()
        kernels: dict[str, list[float]] = defaultdict(list)
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels[event.name].append(event.device_time_total * 1e-6)
        for name, times in kernels.items():
            writer.writerow(
                {"op_id": op_id, "mode": mode, "kernel": name, "n": len(times),
                 "gpu_time_s": sum(times)}
            )  # fmt: skip
            rows += 1
        out.flush()
        del workload
        torch.cuda.empty_cache()
    if i % 50 == 0:
        print(f"{i} of {len(samples)}", flush=True)
out.close()
print(f"wrote {rows} rows to {args.out}")
