"""Do the op space's measurements give the kernel times the network studies' give?

    python experiments/opspace_path_check.py [--gpu h100] [--per-type 14] [--budget-s 170]
                                             [--csv out.csv]

An op-space job (:func:`opcost.opspace_measure.measure_one`) traces a configuration after
three untraced steps; a study's trace job (:func:`opcost.tracing.trace_workload`) runs a
0.1-s timed loop first, which also brings the GPU to its clocks. This takes ops of the
committed network studies (``data/hopper``, ``data/hopper-large`` for ``--gpu``: up to
``--per-type`` distinct ops per op type and mode, Conv2d, BatchNorm2d, Linear, LayerNorm,
ReLU, GELU), measures each on this host both ways (the op-space way twice), and prints
per op type and mode the median ratio of each to the committed ``gpu_time_s`` (another
host, another day), and the SM clock (NVML) before each. It stops after ``--budget-s``
seconds of measuring. Networks' ops are measured here only to compare the two paths;
they are never training data.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import pynvml
import torch

from opcost import harness, tracing
from opcost import opspace_measure as om

REPO = Path(__file__).resolve().parents[1]
TYPES = ("Conv2d", "BatchNorm2d", "Linear", "LayerNorm", "ReLU", "GELU")


def committed_ops(gpu: str, per_type: int) -> pd.DataFrame:
    paths = [REPO / f"data/{s}/{gpu}/dataset/{gpu}.parquet" for s in ("hopper", "hopper-large")]
    d = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)
    d = d[(d["kind"] == "op") & d["gpu_time_s"].notna()]
    d = d.assign(f=d["op_type"].str.split(".").str[-1])
    d = d[d["f"].isin(TYPES)].drop_duplicates(["op_id", "mode"])
    parts = [
        part.sample(min(per_type, len(part)), random_state=0)
        for _, part in d.groupby(["f", "mode"])
    ]
    return pd.concat(parts, ignore_index=True).sample(frac=1, random_state=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--per-type", type=int, default=14)
    parser.add_argument("--budget-s", type=float, default=170.0)
    parser.add_argument("--csv", type=Path, default=Path("opspace_path_check.csv"))
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def sm_clock_mhz() -> int:
        return pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)

    rows = []
    start = time.time()
    for _, op in committed_ops(args.gpu, args.per_type).iterrows():
        if time.time() - start > args.budget_s:
            break
        spec = json.loads(op["spec"])
        opts = harness.HarnessOptions(mode=op["mode"], device="cuda", tf32=bool(op["tf32"]))
        harness.configure_numerics(opts)
        clk0 = sm_clock_mhz()
        first = om.measure_one(spec, opts)
        clk1 = sm_clock_mhz()
        workload = harness.prepare_op(spec, opts)
        study_way = tracing.trace_workload(workload, opts)
        clk2 = sm_clock_mhz()
        del workload
        torch.cuda.empty_cache()
        second = om.measure_one(spec, opts)
        rows.append(
            {"op_id": op["op_id"], "f": op["f"], "mode": op["mode"],
             "study": op["gpu_time_s"], "os": first.get("gpu_time_s"),
             "os2": second.get("gpu_time_s"), "net": study_way["gpu_time_s"],
             "clk0": clk0, "clk1": clk1, "clk2": clk2, "block": first.get("block_size")}
        )  # fmt: skip
    out = pd.DataFrame(rows)
    out.to_csv(args.csv, index=False)
    ratios = pd.DataFrame(
        {"f": out["f"], "mode": out["mode"], "op_space": out["os"] / out["study"],
         "op_space_again": out["os2"] / out["study"], "trace_job": out["net"] / out["study"]}
    )  # fmt: skip
    print(ratios.groupby(["f", "mode"]).median().round(3))
    print(ratios.drop(columns=["f", "mode"]).median().round(4))


if __name__ == "__main__":
    main()
