"""How far a sampled convolution's summed kernel time overstates the time its GPU is busy.

    python experiments/opspace_busy.py OUT [--per-kind N] [--gpu h100]

Draws ``N`` grouped (``groups`` > 1) and ``N`` dense convolutions from the op-space
samples measured for ``--gpu`` (``data/op-space/{gpu}``, seed 0) and measures each again
in both modes, TF32 on and off, as an op-space chunk does (``opcost.opspace_measure``,
no power window): its kernels' summed durations (``gpu_time_s``) and the union of their
intervals (``gpu_busy_time_s``), which differ where cuDNN runs a convolution's kernels
on several streams at once. Writes ``OUT/opspace_busy.parquet`` (op id, family, groups,
mode, TF32, both times, kernels) and prints the busy share per kind, mode and TF32.
The committed op-space rounds predate the busy time: they record the sum.
"""

import argparse
import glob
import json
from pathlib import Path

import pandas as pd
import torch

from opcost import harness, opspace_measure, profile
from opcost.config import GpuConfig
from opcost.names import parse_setting

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("out", type=Path)
parser.add_argument("--per-kind", type=int, default=150)
parser.add_argument("--gpu", default="h100")
args = parser.parse_args()
args.out.mkdir(parents=True, exist_ok=True)

paths = sorted(glob.glob(f"data/op-space/{args.gpu}/*.parquet"))
samples = pd.concat([pd.read_parquet(p, columns=["op_id", "family", "spec"]) for p in paths])
convs = samples[samples["family"] == "conv"].drop_duplicates("op_id")
groups = convs["spec"].map(lambda s: int((json.loads(s).get("attrs") or {}).get("groups", 1)))
convs = convs.assign(groups=groups)
picked = pd.concat(
    [
        convs[convs["groups"] > 1].sample(args.per_kind, random_state=0),
        convs[convs["groups"] == 1].sample(args.per_kind, random_state=0),
    ]
)

device = "cuda" if torch.cuda.is_available() else "cpu"
config = dict(profile.profile_defaults())
rows = []
for tf32 in (True, False):
    gpu = GpuConfig("local", device, tf32, "float32", (parse_setting("default"),), None, None)
    for mode in ("inference", "training"):
        opts = profile.options_for(gpu, mode, config)
        harness.configure_numerics(opts)
        for r in picked.itertuples():
            row = opspace_measure.measure_one(json.loads(r.spec), opts)
            rows.append(
                {
                    "op_id": r.op_id,
                    "groups": r.groups,
                    "mode": mode,
                    "tf32": tf32,
                    **{
                        k: row.get(k)
                        for k in ("status", "gpu_time_s", "gpu_busy_time_s", "n_kernels")
                    },
                }
            )
table = pd.DataFrame(rows)
table.to_parquet(args.out / "opspace_busy.parquet")
ok = table[(table["status"] == "ok") & (table["gpu_time_s"] > 0)].copy()
ok["busy_share"] = ok["gpu_busy_time_s"] / ok["gpu_time_s"]
ok["kind"] = ok["groups"].gt(1).map({True: "grouped", False: "dense"})
print(torch.cuda.get_device_name() if device == "cuda" else "cpu")
print(
    ok.groupby(["kind", "tf32", "mode"])["busy_share"]
    .describe(percentiles=[0.1, 0.5])
    .round(3)
    .to_string()
)
print("share of rows busy below 0.9 of their sum:")
print(ok.groupby(["kind", "tf32"])["busy_share"].apply(lambda s: (s < 0.9).mean()).round(3))
