"""What tracing adds to a study when each profiling job traces what it measured.

    python experiments/trace_in_job_cost.py OUT --study hopper-large [--ops N] [--committed GPU]

Runs profiling jobs as the pipeline does (``opcost.profile.profile_job``: the 1-s power
window, then the trace; config ``profile.traces: in_profiling_jobs``, the study's other
``profile`` settings, GPU setting ``default``, TF32 on) on this host's GPU: ``N`` ops
drawn from ``data/STUDY/ops/unique.parquet`` (seed 0; all with ``--ops 0``) and every
network of ``config/STUDY.yaml``, each in both modes. Prints, per kind, the jobs' time,
the trace's part of it (``trace.trace_cost_s.total``: set-up, profiler, parsing, host
bursts and probe, and a network's CUDA-graph figures) over the rest of the job time, with
and without the graph figures; with ``--committed GPU``, the job time the same ops and
networks took as trace jobs of their own (``data/STUDY/GPU/traces.tar.gz``); and the
whole study's share, its ops' figures scaled from the sample. Writes the raw logs to
``OUT/STUDY.tar.gz``; ``--summarise TARBALL`` prints the figures of one written before
(tests/data/trace_in_job: H100, 2026-11-26).
"""

import argparse
import json
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

from opcost import profile
from opcost.config import GpuConfig, load_study_file
from opcost.names import parse_setting

REPO = Path(__file__).resolve().parents[1]
MODES = ("inference", "training")

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("out", type=Path)
parser.add_argument("--study", default="hopper-large")
parser.add_argument("--ops", type=int, default=100, help="ops per mode (0: all)")
parser.add_argument("--committed", help="GPU configuration whose committed trace jobs to compare")
parser.add_argument(
    "--summarise", type=Path, help="a tarball this script wrote: print, measure nothing"
)
args = parser.parse_args()
args.out.mkdir(parents=True, exist_ok=True)

study = load_study_file(REPO / "config" / f"{args.study}.yaml")
config = {**study.config["profile"], "traces": "in_profiling_jobs"}
gpu = GpuConfig(
    args.committed or "local", "cuda", True, "float32", (parse_setting("default"),), None, None
)
ops = pd.read_parquet(REPO / "data" / args.study / "ops" / "unique.parquet")
if args.ops:
    ops = ops.sample(min(args.ops, len(ops)), random_state=0)


def jobs():
    """Each job as (kind, directory, name, arguments that say what it measures)."""
    for mode in MODES:
        for r in ops.itertuples():
            yield mode, "ops", r.op_id, {"kind": "op", "spec": json.loads(r.spec), "op_id": r.op_id}
        for mi in study.model_inputs:
            yield mode, "networks", mi.name, {"kind": "network", "model_input": mi}


def measure() -> list[dict]:
    """Run the jobs; their records, also packed into ``OUT/STUDY.tar.gz``."""
    raw = Path(tempfile.mkdtemp()) / "raw"
    records = []
    for mode, kind_dir, name, what in jobs():
        out = raw / mode / kind_dir
        out.mkdir(parents=True, exist_ok=True)
        records.append(
            profile.profile_job(
                gpu=gpu,
                setting=parse_setting("default"),
                mode=mode,
                profile_config=config,
                csv_path=out / f"{name}.csv",
                json_path=out / f"{name}.json",
                **what,
            )
        )
    with tarfile.open(args.out / f"{args.study}.tar.gz", "w:gz") as tar:
        tar.add(raw, arcname=args.study)
    return records


def read(path: Path) -> list[dict]:
    """The records of a tarball this script wrote."""
    with tarfile.open(path) as tar:
        return [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith(".json")]


def committed_job_s() -> dict[tuple[str, str, str], float]:
    """Job time of each committed trace job of ``--committed``, by (mode, kind, name)."""
    out = {}
    with tarfile.open(REPO / "data" / args.study / args.committed / "traces.tar.gz") as tar:
        for member in tar.getmembers():
            if "/traces/" in member.name and member.name.endswith(".json"):
                parts = Path(member.name).parts
                r = json.load(tar.extractfile(member))
                out[(parts[-4], parts[-2], Path(member.name).stem)] = (
                    r["finished_unix_s"] - r["started_unix_s"]
                )
    return out


def summarise(records: list[dict]) -> None:
    committed = committed_job_s() if args.committed else {}
    print(f"{args.study} on {records[0]['gpu_name']}, host {records[0]['host']}")
    first = min(records, key=lambda r: r["started_unix_s"])["trace"]["trace_cost_s"]["profile"]
    study_ops = len(pd.read_parquet(REPO / "data" / args.study / "ops" / "unique.parquet"))
    whole = {"trace": 0.0, "graph": 0.0, "rest": 0.0}
    for kind in ("op", "network"):
        rs = [r for r in records if r["kind"] == kind and r.get("trace", {}).get("status") == "ok"]
        cost = [r["trace"]["trace_cost_s"] for r in rs]
        job = sum(r["finished_unix_s"] - r["started_unix_s"] for r in rs)
        trace = sum(c["total"] for c in cost)
        graph = sum(c.get("graph", 0.0) for c in cost)
        parts = {
            k: round(sum(c.get(k, 0.0) for c in cost), 1) for k in ("profile", "host", "graph")
        }
        line = (
            f"{kind}: {len(rs)} jobs, {job:.1f} s; trace {trace:.1f} s = "
            f"{100 * trace / (job - trace):.1f} % of the rest "
            f"({100 * (trace - graph) / (job - trace):.1f} % without the graph figures); "
            f"parts {parts}"
        )
        kind_dir = "ops" if kind == "op" else "networks"
        key = "op_id" if kind == "op" else "model_input"
        apart = [committed.get((r["mode"], kind_dir, r[key])) for r in rs]
        if committed and all(a is not None for a in apart):
            line += f"; as trace jobs of their own (committed): {sum(apart):.1f} s"
        print(line)
        # The study's every op, in both modes, from the sample; the profiler's first start
        # in the process (the first job's) counted once.
        scale = len(MODES) * study_ops / len(rs) if kind == "op" else 1.0
        once = first if kind == "op" else 0.0
        whole["trace"] += (trace - once) * scale + once
        whole["graph"] += graph
        whole["rest"] += (job - trace) * scale
    print(
        f"whole study (ops scaled from the sample to its {len(MODES) * study_ops} op jobs; "
        f"the profiler's first start in the process, {first:.1f} s, once): trace "
        f"{whole['trace']:.0f} s over {whole['rest']:.0f} s of profiling = "
        f"{100 * whole['trace'] / whole['rest']:.1f} %, without the graph figures "
        f"{100 * (whole['trace'] - whole['graph']) / whole['rest']:.1f} %"
    )
    failed = [r for r in records if r["status"] != "ok" or r.get("trace", {}).get("status") != "ok"]
    print(f"{len(failed)} jobs failed or untraced")


summarise(read(args.summarise) if args.summarise else measure())
