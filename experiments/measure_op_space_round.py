"""Sample one op-space round and measure its chunks for one GPU configuration, without
Snakemake: what rules ``op_space_round_samples`` and ``measure_op_space_round`` do, for a
GPU host where Snakemake cannot be brought along.

    python experiments/measure_op_space_round.py --config config/op-space.yaml \\
        --round 7 --gpu h100-notf32

writes ``results/op-space/samples-r{round}.parquet`` and
``results/op-space/raw/{gpu}/r{round}-{chunk}.parquet`` (every chunk, or ``--chunks``),
the same files, through the same functions, as the rules; a chunk already there is kept.
"""

import argparse
import json
import time
from pathlib import Path

from opcost import opspace_measure
from opcost import opspace_workflow as osw
from opcost.config import load_study_file

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--config", default="config/op-space.yaml")
parser.add_argument("--round", type=int, required=True, help="2, 3, ...")
parser.add_argument("--gpu", required=True, help="a GPU configuration of the config")
parser.add_argument("--chunks", type=int, nargs="*", help="default: every chunk of the round")
args = parser.parse_args()

study = load_study_file(args.config)
if f"r{args.round}-0" not in osw.op_space_chunk_names(study, args.gpu):
    parser.error(f"{args.gpu} measures no round {args.round} (op_space.rounds' gpus)")
samples = Path(f"results/op-space/samples-r{args.round}.parquet")
if not samples.exists():
    samples.parent.mkdir(parents=True, exist_ok=True)
    osw.run_op_space_samples(osw.op_space_round_params(study, args.round), str(samples))
every = osw.op_space_chunks(study, args.round, args.gpu)
for chunk in args.chunks if args.chunks is not None else every:
    out = Path(f"results/op-space/raw/{args.gpu}/r{args.round}-{chunk}.parquet")
    if out.exists():
        continue
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    summary = opspace_measure.measure_chunk_file(
        gpu=study.gpus[args.gpu],
        profile_config=dict(study.config["profile"]),
        samples_path=samples,
        chunk=chunk,
        chunk_size=int(study.config["op_space"]["chunk_size"]),
        families=osw.op_space_families(study, args.gpu),
        split=osw.op_space_split(study, args.round, args.gpu),
        out_path=out,
    )
    print(json.dumps({"chunk": out.name, "s": round(time.monotonic() - started, 1), **summary}))
