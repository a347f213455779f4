"""Do the op space's grouped convolutions run faster, and more smoothly, when cuDNN times its
algorithms (``torch.backends.cudnn.benchmark``) than with its heuristics?

    python experiments/grouped_conv_benchmark.py --gpu h200 --n 300 --out OFF.csv   # GPU host
    python experiments/grouped_conv_benchmark.py --gpu h200 --n 300 --benchmark --out ON.csv
    python experiments/grouped_conv_benchmark.py --score OFF.csv ON.csv

The op space measures with PyTorch's default, cuDNN's heuristics choosing the kernels
(``benchmark`` off), and a grouped convolution's time then jumps between regimes its
shapes do not tell apart (docs/results.md, "Networks never trained on"). Measures ``--n``
grouped convolutions (more than one group, not depthwise) drawn at random from the op
space's inference samples of ``--gpu``, and regnet_y_800mf's first grouped convolution
(``--kind dense``: dense ones, one group, instead), in inference as the op space does
(:func:`opcost.harness.prepare_op`, TF32 as ``--gpu``'s name says), with
``benchmark`` off, or on (``--benchmark``): the kernel time of one profiled step (the
median of 3) and its kernels. One process per setting: PyTorch caches the plan cuDNN
chose for a shape whatever the setting it was chosen under. ``--score`` prints how many
ran faster with ``benchmark`` on, by how much, and how well extra trees on the op models'
features predict each (5-fold by op id, median |error| of the time).
"""

import argparse
import csv
import json
import statistics
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
#: regnet_y_800mf's first grouped convolution at batch 8 (traced at 726 us on an H200).
REGNET = {
    "args": [{"__tensor__": 0}],
    "attrs": {"bias": False, "dilation": [1, 1], "groups": 4, "in_channels": 64,
              "kernel_size": [3, 3], "out_channels": 64, "output_padding": [0, 0],
              "padding": [1, 1], "padding_mode": "zeros", "stride": [2, 2],
              "transposed": False},
    "inputs": [{"dtype": "float32", "param": False, "shape": [8, 64, 112, 112]}],
    "kind": "module", "kwargs": {}, "outputs": [{"dtype": "float32", "shape": [8, 64, 56, 56]}],
    "type": "torch.nn.modules.conv.Conv2d",
}  # fmt: skip


def conv_samples(gpu: str, n: int, kind: str = "grouped") -> pd.DataFrame:
    """``n`` of the op space's inference convolutions of ``gpu``, drawn at random: grouped
    ones (:func:`opcost.model.shapes.grouped_conv`), or ``dense`` ones (one group)."""
    from opcost.model.shapes import grouped_conv

    files = sorted((REPO / "data/op-space" / gpu).glob("*.parquet"))
    t = pd.concat([pd.read_parquet(f, columns=["op_id", "spec", "mode", "family"]) for f in files])
    t = t[(t["family"] == "conv") & (t["mode"] == "inference")].drop_duplicates("op_id")
    if kind == "grouped":
        t = t[[grouped_conv(s) for s in t["spec"]]]
    else:
        t = t[[json.loads(s)["attrs"].get("groups", 1) == 1 for s in t["spec"]]]
    return t.sample(min(n, len(t)), random_state=0)[["op_id", "spec"]]


def measure(gpu: str, n: int, out: Path, bench: bool, kind: str, tf32: bool) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from opcost import harness

    samples = conv_samples(gpu, n, kind)
    rows = [("regnet_y_800mf", json.dumps(REGNET))] if kind == "grouped" else []
    rows += list(samples.itertuples(index=False))
    print(f"{torch.cuda.get_device_name()}: {len(rows)} {kind} convolutions", flush=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, ["op_id", "spec", "benchmark", "gpu_time_s", "n_kernels"])
        writer.writeheader()
        torch.backends.cudnn.benchmark = bench
        for i, (op_id, spec) in enumerate(rows):
            opts = harness.HarnessOptions(mode="inference", device="cuda", tf32=tf32)
            harness.configure_numerics(opts)
            workload = harness.prepare_op(json.loads(spec), opts)
            times, kernels = [], []
            with workload.context():
                for _ in range(3):
                    workload.step()
                torch.cuda.synchronize()
                for _ in range(3):
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        workload.step()
                        torch.cuda.synchronize()
                    ev = [
                        e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                    ]
                    times.append(sum(e.device_time_total for e in ev) * 1e-6)
                    kernels.append(len(ev))
            writer.writerow(
                {"op_id": op_id, "spec": spec, "benchmark": bench,
                 "gpu_time_s": statistics.median(times),
                 "n_kernels": statistics.median(kernels)}
            )  # fmt: skip
            f.flush()
            del workload
            torch.cuda.empty_cache()
            if i % 50 == 0:
                print(f"{i} of {len(rows)}", flush=True)
    torch.backends.cudnn.benchmark = False


def score(paths: list[Path], gpu: str) -> None:
    from sklearn.ensemble import ExtraTreesRegressor

    from opcost.model import opmodel
    from opcost.model import roofline as rl
    from opcost.model.features import build_schema

    d = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    d["benchmark"] = d["benchmark"].astype(str).eq("True")
    wide = d.pivot_table(index="op_id", columns="benchmark", values="gpu_time_s")
    ratio = wide[False] / wide[True]
    print(f"{len(wide)} convolutions: heuristics over benchmark, median "
          f"{ratio.median():.2f}, 90th percentile {ratio.quantile(0.9):.2f}, max "
          f"{ratio.max():.1f}; {int((ratio > 1.5).sum())} over 1.5x")  # fmt: skip
    if "regnet_y_800mf" in wide.index:
        r = wide.loc["regnet_y_800mf"] * 1e6
        print(f"regnet_y_800mf's: {r[False]:.0f} us with heuristics, {r[True]:.0f} with benchmark")
    files = sorted((REPO / "data/op-space" / gpu).glob("*.parquet"))
    peaks_t = pd.concat([pd.read_parquet(f) for f in files[:3]])
    peaks = rl.Peaks(
        float(peaks_t["peak_matmul_flops_per_s"].median()),
        float(peaks_t["peak_memory_bytes_per_s"].median()),
    )
    rows = d[d["op_id"] != "regnet_y_800mf"].copy()
    rows["mode"] = "inference"
    rows["op_type"] = [json.loads(s)["type"] for s in rows["spec"]]
    rows["dtype"], rows["tf32"] = "float32", not gpu.endswith("notf32")
    for c in ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w"):
        rows[c] = np.nan
    roof = rl.roofline_times_s(list(rows["spec"]), ["inference"] * len(rows), peaks)
    x = opmodel.features(rows, build_schema(rows["op_type"]), roof)
    ids = rows["op_id"].unique()
    fold = dict(zip(ids, np.random.default_rng(0).integers(0, 5, len(ids)), strict=True))
    y = np.log(rows["gpu_time_s"].to_numpy() / roof)
    f = rows["op_id"].map(fold).to_numpy()
    for bench in (False, True):
        m = (rows["benchmark"] == bench).to_numpy()
        err = []
        for k in range(5):
            tr, te = m & (f != k), m & (f == k)
            et = ExtraTreesRegressor(n_estimators=25, min_samples_leaf=2, random_state=0)
            et.fit(x[tr], y[tr])
            err.append(np.abs(np.exp(et.predict(x[te]) - y[te]) - 1))
        e = np.concatenate(err)
        on = "on " if bench else "off"
        print(f"benchmark {on}: 5-fold median |error| {100 * np.median(e):.1f} %, "
              f"MAPE {100 * e.mean():.1f} %")  # fmt: skip


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--gpu", default="h200", help="the op space's configuration to draw from")
parser.add_argument("--n", type=int, default=250)
parser.add_argument("--out", type=Path, help="measure (on this host's GPU) into this CSV")
parser.add_argument("--benchmark", action="store_true", help="let cuDNN time its algorithms")
parser.add_argument("--kind", choices=("grouped", "dense"), default="grouped")
parser.add_argument("--score", type=Path, nargs="+", help="score recorded CSVs instead")
args = parser.parse_args()
if args.score:
    score(args.score, args.gpu)
elif args.out:
    measure(args.gpu, args.n, args.out, args.benchmark, args.kind, not args.gpu.endswith("notf32"))
else:
    parser.error("give --out to measure, or --score FILE")
