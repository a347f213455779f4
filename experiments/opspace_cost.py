"""Where an op-space chunk's measuring time goes, phase by phase, on this host's GPU.

    python experiments/opspace_cost.py OUT [--gpu h100] [--configs N] [--repeats W,T,H]
        [--long-repeats W,T,H]
        [--against OTHER/opspace_cost.parquet] [--profile]

Draws ``N`` configurations (seed 0) from the op-space rows committed for ``--gpu``
(``data/op-space/{gpu}``, rows without a power window) and measures each again in the
modes it was committed in, with that configuration's TF32 setting, as an op-space chunk
does (``opcost.opspace_measure.measure_one``, no power window). Each phase's wall time
is taken by wrapping the functions ``measure_one`` calls: building the workload
(``harness.prepare_op``), the untraced warm-up, the traced steps (``tracing._profile``:
the profiler's start, the steps, its stop and the trace's export), reading the trace
(``kineto.steps``), the host bursts (``tracing._host_times``) and freeing the cache.
Prints the phases' sums beside the committed rows' ``measure_s`` for the same rows and
the re-measured GPU and host time's ratio to the committed one; writes
``OUT/opspace_cost.parquet`` (a row per configuration and mode) and, with ``--profile``,
``OUT/opspace_cost.prof``. ``--repeats`` sets a short step's warm-up steps, traced
steps and host bursts (``WARMUP_STEPS``, ``TRACE_STEPS``, ``HOST_REPEATS``),
``--long-repeats`` a long step's (``LONG_REPEATS``); with
``--against``, the ratios of GPU time, host time and ``measure_s`` to another run's, row
by row (the same configurations: the same ``--gpu`` and ``--configs``).
"""

import argparse
import cProfile
import glob
import json
import pstats
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
import torch

from opcost import harness, kineto, opspace_measure, profile, tracing
from opcost.config import GpuConfig
from opcost.names import parse_setting

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("out", type=Path)
parser.add_argument("--gpu", default="h100")
parser.add_argument("--configs", type=int, default=200)
parser.add_argument("--repeats", help="a short step's warm-up, traced steps, host bursts")
parser.add_argument("--long-repeats", help="the same for a long step (LONG_REPEATS)")
parser.add_argument("--against", type=Path, help="another run's opspace_cost.parquet")
parser.add_argument("--profile", action="store_true")
args = parser.parse_args()
if args.repeats:
    w, t, h = (int(v) for v in args.repeats.split(","))
    opspace_measure.WARMUP_STEPS, opspace_measure.TRACE_STEPS = w, t
    opspace_measure.HOST_REPEATS = h
if args.long_repeats:
    opspace_measure.LONG_REPEATS = tuple(int(v) for v in args.long_repeats.split(","))
args.out.mkdir(parents=True, exist_ok=True)

paths = sorted(glob.glob(f"data/op-space/{args.gpu}/*.parquet"))
committed = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)
committed = committed[(committed["status"] == "ok") & committed["power_w"].isna()]
ids = committed["op_id"].drop_duplicates().sample(args.configs, random_state=0)
rows_in = committed[committed["op_id"].isin(set(ids))].drop_duplicates(["op_id", "mode"])

phase_s: dict[str, float] = defaultdict(float)


def timed(owner, name, phase):
    inner = getattr(owner, name)

    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            phase_s[phase] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


timed(harness, "prepare_op", "prepare")
timed(tracing, "_profile", "trace")
timed(tracing, "_exported", "export")  # inside "trace"
timed(kineto, "steps", "parse")
timed(tracing, "_host_times", "host_bursts")
timed(torch.cuda, "empty_cache", "empty_cache")

device = "cuda" if torch.cuda.is_available() else "cpu"
tf32 = not args.gpu.endswith("notf32")
gpu = GpuConfig("local", device, tf32, "float32", (parse_setting("default"),), None, None)
config = dict(profile.profile_defaults())
out_rows = []
profiler = cProfile.Profile() if args.profile else None
for mode in ("inference", "training"):
    opts = profile.options_for(gpu, mode, config)
    harness.configure_numerics(opts)
    for r in rows_in[rows_in["mode"] == mode].itertuples():
        phase_s.clear()
        if profiler is not None:
            profiler.enable()
        row = opspace_measure.measure_one(json.loads(r.spec), opts)
        if profiler is not None:
            profiler.disable()
        named = ("prepare", "trace", "parse", "host_bursts", "empty_cache")
        out_rows.append(
            {
                "op_id": r.op_id,
                "family": r.family,
                "mode": mode,
                "status": row.get("status"),
                "measure_s": row["measure_s"],
                "committed_measure_s": r.measure_s,
                "gpu_time_s": row.get("gpu_time_s"),
                "committed_gpu_time_s": r.gpu_time_s,
                "host_time_s": row.get("host_time_s"),
                "committed_host_time_s": r.host_time_s,
                "calls_per_step": row.get("calls_per_step"),
                "n_kernels": row.get("n_kernels"),
                "committed_n_kernels": r.n_kernels,
                **{f"{k}_s": phase_s.get(k, 0.0) for k in (*named, "export")},
                "other_s": row["measure_s"] - sum(phase_s.get(k, 0.0) for k in named),
            }
        )
table = pd.DataFrame(out_rows)
table.to_parquet(args.out / "opspace_cost.parquet")
print(torch.cuda.get_device_name() if device == "cuda" else "cpu", "TF32", tf32)
cols = [c for c in table.columns if c.endswith("_s") and "_time_s" not in c]
print("sums (s) by family and mode:")
print(table.groupby(["family", "mode"])[cols].sum().round(2).to_string())
print("sums (s):")
print(table[cols].sum().round(2).to_string())
ok = table[table["status"] == "ok"]
for what in ("gpu_time_s", "host_time_s"):
    ratio = ok[what] / ok[f"committed_{what}"]
    print(
        f"re-measured / committed {what}: median {ratio.median():.4f}, "
        f"median |1 - ratio| {(ratio - 1).abs().median():.4f}"
    )
if args.against is not None:
    other = pd.read_parquet(args.against)
    both = ok.merge(other[other["status"] == "ok"], on=["op_id", "mode"], suffixes=("", "_b"))
    for what in ("gpu_time_s", "host_time_s", "measure_s"):
        ratio = both[what] / both[f"{what}_b"]
        print(
            f"this run / {args.against.parent.name}: {what} median {ratio.median():.4f}, "
            f"median |1 - ratio| {(ratio - 1).abs().median():.4f} ({len(both)} rows), "
            f"sums {both[what].sum():.2f} / {both[what + '_b'].sum():.2f}"
        )
if profiler is not None:
    profiler.dump_stats(str(args.out / "opspace_cost.prof"))
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
