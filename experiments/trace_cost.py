"""Where a trace job's time goes: trace jobs run under cProfile on this host's GPU.

    python experiments/trace_cost.py OUT [--ops N] [--networks NAME ...]

Traces ``N`` ops drawn from ``data/hopper/ops/unique.parquet`` (seed 0) in both modes,
and the named networks (default resnet18 and vit_b_16 at 8x3x224x224) in both modes, as
the pipeline's trace jobs do (``opcost.tracing.trace_job``, GPU setting ``default``),
once to warm up and once profiled. Prints the jobs' summed job time beside the parts the
records time themselves (``trace_cost_s``) and the functions that take the most time
cumulatively; writes the profiles to OUT (``ops.prof``, ``networks.prof``).
"""

import argparse
import cProfile
import json
import pstats
import shutil
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from opcost import profile, tracing
from opcost.config import GpuConfig
from opcost.names import ModelInput, parse_setting

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("out", type=Path)
parser.add_argument("--ops", type=int, default=60)
parser.add_argument("--networks", nargs="*", default=["resnet18", "vit_b_16"])
args = parser.parse_args()
args.out.mkdir(parents=True, exist_ok=True)

device = "cuda" if torch.cuda.is_available() else "cpu"
name = torch.cuda.get_device_name() if device == "cuda" else None
gpu = GpuConfig("local", device, True, "float32", (parse_setting("default"),), None, name)
config = dict(profile.profile_defaults())
ops = pd.read_parquet("data/hopper/ops/unique.parquet").sample(args.ops, random_state=0)
networks = [ModelInput(n, (8, 3, 224, 224)) for n in args.networks]


def jobs(kind: str):
    """Each job of ``kind`` as its name and the arguments that say what it traces."""
    if kind == "op":
        for r in ops.itertuples():
            yield r.op_id, {"spec": json.loads(r.spec), "op_id": r.op_id}
    else:
        for mi in networks:
            yield mi.name, {"model_input": mi}


def trace_all(kind: str, tmp: Path) -> None:
    for mode in ("inference", "training"):
        for name, what in jobs(kind):
            tracing.trace_job(
                kind=kind,
                gpu=gpu,
                setting=parse_setting("default"),
                mode=mode,
                profile_config=config,
                json_path=tmp / f"{name}.{mode}.json",
                **what,
            )


for kind in ("op", "network"):
    tmp = Path(tempfile.mkdtemp())
    trace_all(kind, tmp)
    shutil.rmtree(tmp)
    tmp.mkdir()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    trace_all(kind, tmp)
    prof.disable()
    elapsed = time.perf_counter() - t0
    records = [json.loads(p.read_text()) for p in tmp.glob("*.json")]
    job_s = sum(r["finished_unix_s"] - r["started_unix_s"] for r in records)
    parts = {
        k: round(sum(r.get("trace_cost_s", {}).get(k, 0.0) for r in records), 2)
        for k in ("wall", "profile", "parse", "host")
    }
    parts["graph_window"] = round(sum(r.get("graph_window_s") or 0.0 for r in records), 2)
    print(
        f"\n== {kind}: {len(records)} jobs, {elapsed:.2f} s under cProfile, job time "
        f"{job_s:.2f} s; parts {parts}"
    )
    prof.dump_stats(str(args.out / f"{kind}s.prof"))
    pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    shutil.rmtree(tmp)
