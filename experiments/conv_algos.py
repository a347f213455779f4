"""Which cuDNN kernels run the op space's dense 3x3 convolutions with TF32 off?

    python experiments/conv_algos.py --rounds 8 11 --out conv_algos.csv     # on a GPU host
    python experiments/conv_algos.py --score tests/data/conv_algos/conv_algos_h100.csv.gz

Each configuration of the given op-space rounds (``data/op-space/samples-r{round}.parquet``)
is run in inference and training with TF32 off, as the op space measures it
(:func:`opcost.harness.prepare_op`, two warm-up steps), and one step is recorded with
``torch.profiler``: per configuration and mode, the names of the kernels it ran and their
summed durations on the device. Written as CSV (``op_id``, ``mode``, ``kernel``,
``n``, ``gpu_time_s``: one row per distinct kernel name). Whether cuDNN ran a fast
algorithm (fewer multiplications than the direct count, above the FP32 units' peak on a
dense 3x3 convolution) is then a question of which kernel ran, which a model of cuDNN's
choice could learn from the shapes (docs/results.md, "Ops held out of training").

``--score FILE`` asks what knowing the algorithm is worth, on the configurations ``FILE``
holds and their op-space measurements (``data/op-space/h100-notf32``): 5-fold by op id,
extra trees on the op models' features and target (GPU time over the base time, as
:mod:`opcost.model.opmodel` fits it) alone, with the algorithm that ran (FFT or not) as a
feature, and with the algorithm predicted by a classifier trained on the other folds.
Prints the median |error| and MAPE of the GPU time of each.
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


def is_fft(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per configuration (rows) and mode (columns): whether any of its kernels is an FFT's."""
    fft = kernels["kernel"].str.contains("fft|cf32|complex", regex=True)
    return kernels.assign(fft=fft).pivot_table(
        index="op_id", columns="mode", values="fft", aggfunc="any"
    )


def score(path: Path) -> None:
    import numpy as np
    from sklearn.ensemble import ExtraTreesClassifier, ExtraTreesRegressor

    from opcost.model import base_time, op_tables, opmodel
    from opcost.model import roofline as rl
    from opcost.model.features import build_schema

    fft = is_fft(pd.read_csv(path))
    files = sorted((REPO / "data/op-space/h100-notf32").glob("*.parquet"))
    table = op_tables.training_rows(pd.concat([pd.read_parquet(f) for f in files]))
    rows = table[table["op_id"].isin(set(fft.index))].reset_index(drop=True)
    peaks = rl.Peaks(
        float(table["peak_matmul_flops_per_s"].median()),
        float(table["peak_memory_bytes_per_s"].median()),
    )
    roof = rl.roofline_times_s(
        list(rows["spec"]), list(rows["mode"]), base_time.ceilings(table, peaks)
    )
    x = opmodel.features(rows, build_schema(rows["op_type"]), roof)
    training = rows["mode"].to_numpy() == "training"
    base = base_time.base_time_s(roof, training, base_time.shortest_kernel_s(table))
    measured = rows["gpu_time_s"].to_numpy()
    ran = np.array([fft.loc[o, m] for o, m in zip(rows["op_id"], rows["mode"], strict=True)])
    ids = np.array(sorted(rows["op_id"].unique()))
    np.random.default_rng(0).shuffle(ids)
    errors: dict[str, list] = {
        "alone": [],
        "with the algorithm that ran": [],
        "with it predicted": [],
    }
    for fold in np.array_split(ids, 5):
        test = rows["op_id"].isin(set(fold)).to_numpy()
        guessed = ran.astype(float)
        clf = ExtraTreesClassifier(100, random_state=0).fit(x[~test], ran[~test])
        guessed[test] = clf.predict(x[test])
        for name, algo in zip(errors, (None, ran.astype(float), guessed), strict=True):
            xa = x if algo is None else x.assign(fft=algo)
            fit = ExtraTreesRegressor(25, min_samples_leaf=2, random_state=0)
            fit.fit(xa[~test], np.log(measured[~test] / base[~test]))
            errors[name].append(base[test] * np.exp(fit.predict(xa[test])) / measured[test] - 1)
    print(f"{len(ids)} configurations, both modes, 5-fold by op id (H100, TF32 off)")
    for name, e in errors.items():
        e = np.abs(np.concatenate(e))
        print(
            f"{name:28s} median |error| {100 * np.median(e):5.1f} %  MAPE {100 * e.mean():5.1f} %"
        )


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--rounds", type=int, nargs="+", default=[8, 11])
parser.add_argument("--out", type=Path, help="measure (on this host's GPU) into this CSV")
parser.add_argument("--score", type=Path, help="score a recorded CSV instead")
args = parser.parse_args()
if args.score:
    score(args.score)
    raise SystemExit(0)
if args.out is None:
    parser.error("give --out to measure, or --score FILE")

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
