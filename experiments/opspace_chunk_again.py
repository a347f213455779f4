"""One committed op-space chunk measured again through the job's own path, on this host.

    python experiments/opspace_chunk_again.py OUT [--gpu h100] [--chunks r2-0 r6-0 ...]
        [--committed GPU]

Each chunk (``0`` for round 1's ``data/op-space/samples.parquet``, ``rN-C`` for round N's
chunk C) is measured as rule ``measure_op_space_round`` does
(``opcost.opspace_measure.measure_chunk_file``, with ``config/op-space.yaml``'s GPU
configuration, profile and chunk size, and its TF32 twin's families), written to
``OUT/<chunk>.parquet``; prints its measuring time beside the committed chunk's
(``data/op-space/<gpu>/<chunk>.parquet``) and the two GPU times' agreement, row by row.
``--committed GPU`` compares with another configuration's chunk instead: a round its peer
alone measured (e.g. ``--gpu h200 --committed h100 --chunks r9-0``), measured here on
this configuration's GPU (``bench/peer_transfer.py --measured OUT`` scores the op
models on them).
"""

import argparse
import time
from pathlib import Path

import pandas as pd

from opcost import opspace_measure
from opcost import opspace_workflow as osw
from opcost.config import load_study_file

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("out", type=Path)
parser.add_argument("--gpu", default="h100")
parser.add_argument("--chunks", nargs="+", default=["r2-0", "r6-0"])
parser.add_argument("--committed", help="the configuration whose chunks to compare with")
args = parser.parse_args()
args.out.mkdir(parents=True, exist_ok=True)
study = load_study_file("config/op-space.yaml")
for name in args.chunks:
    rnd, _, chunk = name.rpartition("-")  # "0": round 1, chunk 0
    samples = f"data/op-space/samples{'-' + rnd if rnd else ''}.parquet"
    started = time.perf_counter()
    opspace_measure.measure_chunk_file(
        gpu=study.gpus[args.gpu],
        profile_config=dict(study.config["profile"]),
        samples_path=samples,
        chunk=int(chunk),
        chunk_size=int(study.config["op_space"]["chunk_size"]),
        families=osw.op_space_families(study, args.gpu),
        out_path=args.out / f"{name}.parquet",
    )
    job_s = time.perf_counter() - started
    new = pd.read_parquet(args.out / f"{name}.parquet")
    old = pd.read_parquet(f"data/op-space/{args.committed or args.gpu}/{name}.parquet")
    both = new.merge(old, on=["op_id", "mode"], suffixes=("", "_committed"))
    both = both[(both["status"] == "ok") & (both["status_committed"] == "ok")]
    miss = (both["gpu_time_s"] / both["gpu_time_s_committed"] - 1).abs()
    print(
        f"{name}: job {job_s:.1f} s, measuring {new['measure_s'].sum():.1f} s (committed "
        f"{old['measure_s'].sum():.1f} s); GPU time against the committed, {len(both)} rows: "
        f"median |1 - ratio| {miss.median():.4f}, 90th percentile {miss.quantile(0.9):.4f}, "
        f"median ratio {(both['gpu_time_s'] / both['gpu_time_s_committed']).median():.4f}"
    )
