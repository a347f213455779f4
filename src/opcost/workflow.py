"""What the Snakemake rules need from the package: file lists and the profiling job entry.

The rules stay thin; the logic that decides which files a stage needs lives here, where
pytest reaches it.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import math
import os
import re
import time
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from opcost.config import GpuConfig, Study, traced_in_job
from opcost.errors import OpcostError
from opcost.io import write_atomic, write_parquet_atomic
from opcost.names import parse_setting

MEASUREMENT_PARAMS = (
    "min_run_time_s",
    "warmup_s",
    "block_size",
    "max_block_size",
    "power_interval_ms",
)


#: The directory of the opcost package this process imported.
PACKAGE_DIR = Path(__file__).resolve().parent


def _module_file(module: str) -> Path:
    """``opcost.x.y`` -> ``x/y.py`` of the package, or ``x/y/__init__.py`` for a package."""
    path = PACKAGE_DIR.joinpath(*module.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _opcost_imports(source: str) -> set[str]:
    """The opcost modules a Python source imports, at any level (functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "opcost"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "opcost":
                continue
            found.add(node.module)
            # `from opcost.p import x`: x is a module of the package or a name of it.
            found |= {
                f"{node.module}.{a.name}"
                for a in node.names
                if _module_file(f"{node.module}.{a.name}").is_file()
            }
    # Importing opcost.p.x runs opcost.p's __init__.py too.
    parents = {m.rsplit(".", k)[0] for m in found for k in range(1, m.count("."))}
    return found | parents


@cache
def code_version(script: str | Path) -> str:
    """A hash of the opcost modules that a stage's script uses, directly or not.

    A rule passes it as a parameter, so that a change to the code of its stage in the
    package reruns the stage (Snakemake already reruns a rule whose script changed).
    The modules are those the script imports, and those they import in turn (all of
    them, also inside functions: a module too many reruns a stage needlessly, one too
    few misses a change). Profiling rules take none: raw logs are ground truth, and a
    new version of the package does not remeasure them. Computed once per process.

    Args:
        script: the stage's script (``workflow/scripts/<stage>.py``).

    Returns:
        16 hex digits of the SHA-256 of those modules' names and contents.
    """
    return _modules_version(Path(script).read_text())


def run_code_version(function: Any) -> str:
    """:func:`code_version` for a rule whose ``run:`` block calls ``function`` of this
    package: the hash of the function's own source and the modules it imports (at any
    level), so a change to either reruns the rule (Snakemake sees only the block)."""
    source = inspect.getsource(function)
    return _modules_version(source, extra=source.encode())


def _modules_version(source: str, extra: bytes = b"") -> str:
    """The hash of the opcost modules that ``source`` imports, directly or not."""
    todo = sorted(_opcost_imports(source))
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += sorted(_opcost_imports(_module_file(module).read_text()) - seen)
    digest = hashlib.sha256(extra)
    for module in sorted(seen):
        digest.update(module.encode() + b"\0" + _module_file(module).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@cache
def _unique_ops(path: str, mtime_ns: int) -> pd.DataFrame:
    return pd.read_parquet(path, columns=["op_id", "spec"]).set_index("op_id")


def unique_ops(path: str | Path) -> pd.DataFrame:
    """``results/ops/unique.parquet``, read once per version of the file."""
    path = str(path)
    return _unique_ops(path, Path(path).stat().st_mtime_ns)


class UnknownOpError(OpcostError, LookupError):
    """An op id that the study's op table does not hold."""


def op_spec(unique_path: str | Path, op_id: str) -> str:
    """The canonical JSON spec of one op, from the study's op table."""
    if not Path(unique_path).exists():
        raise UnknownOpError(
            f"no op table at {unique_path}: profiling op {op_id} needs it; run "
            f"`snakemake {unique_path}` first (or the whole study, which does)"
        )
    table = unique_ops(unique_path)
    if op_id not in table.index:
        raise UnknownOpError(
            f"op {op_id} is not in {unique_path}: no network of the study has it "
            "(a target from another study?)"
        )
    return str(table.loc[op_id, "spec"])


def raw_prefixes(study: Study, gpu: str, op_ids: list[str], under: str = "") -> list[str]:
    """Every raw measurement of one GPU configuration, as path prefixes (add .json/.csv);
    ``under="traces/"``: their traces' (add .json)."""
    out = []
    for setting in study.gpus[gpu].settings:
        for mode in study.modes:
            base = f"results/raw/{gpu}/{setting.name}/{mode}/{under}"
            out += [f"{base}ops/{oid}" for oid in op_ids]
            out += [f"{base}networks/{mi.name}" for mi in study.model_inputs]
    return out


class MissingRawLogError(OpcostError, FileNotFoundError):
    """A dataset holds a row whose raw log is gone: it is older than its ground truth."""


def require_raw_logs(dataset_path: str | Path) -> None:
    """Refuse a dataset with a row whose raw log (JSON or CSV) no longer exists.

    Deleting a raw pair is how a measurement is taken again; the default target then
    measures it and rebuilds the dataset. A job that reads a dataset made before the
    deletion (a downstream file named as the target) must not use the row silently.

    Raises:
        MissingRawLogError: names the dataset, the missing file and what to run.
    """
    json_paths = pd.read_parquet(dataset_path, columns=["json_path"])["json_path"]
    for json_path in map(Path, json_paths):
        for path in (json_path, json_path.with_suffix(".csv")):
            if not path.exists():
                raise MissingRawLogError(
                    f"{dataset_path} has a row from {path}, which no longer exists (deleted "
                    "to measure it again?): run `snakemake` without a target, which "
                    "measures it and rebuilds the dataset"
                )


def trace_prefixes(study: Study, gpu: str, op_ids: list[str]) -> list[str]:
    """Every trace job's output of one GPU configuration, as path prefixes (add .json):
    none unless its device is ``cuda`` (a CPU runs each op to its end before the next:
    nothing to replay) and the study traces in jobs of their own (``profile.traces``;
    by default each profiling job traces what it measured, into its benchmark JSON)."""
    if study.gpus[gpu].device != "cuda" or traced_in_job(study.config["profile"], "cuda"):
        return []
    return raw_prefixes(study, gpu, op_ids, under="traces/")


def run_trace(
    study: Study, wildcards: Any, output: Any, log: Any, *, kind: str, spec_json: str | None = None
) -> None:
    """Entry point of the tracing rules' ``run:`` blocks (in the measurement worker)."""
    from opcost import worker

    started = time.time()
    record = worker.call(
        "opcost.tracing:trace_job",
        kind=kind,
        gpu=study.gpus[wildcards.gpu],
        setting=parse_setting(wildcards.setting),
        mode=wildcards.mode,
        profile_config=dict(study.config["profile"]),
        json_path=str(output.json),
        spec=json.loads(spec_json) if spec_json else None,
        op_id=getattr(wildcards, "op_id", None),
        model_input=study.model_input(wildcards.model_input) if kind == "network" else None,
    )
    _write_job_log(log.job, record, ("status", "failure_reason", "device", "gpu_time_s"), started)


def gpu_params(study: Study, gpu: str) -> dict[str, Any]:
    """The GPU configuration's fields that change a measurement (rerun when they change)."""
    g = study.gpus[gpu]
    return {"device": g.device, "tf32": g.tf32, "dtype": g.dtype}


def measurement_params(study: Study) -> dict[str, Any]:
    """The profiling settings that change a measurement (rerun when they change)."""
    return {k: study.config["profile"][k] for k in MEASUREMENT_PARAMS}


def run_profile(
    study: Study,
    wildcards: Any,
    output: Any,
    log: Any,
    *,
    kind: str,
    spec_json: str | None = None,
) -> None:
    """Entry point of the profiling rules' ``run:`` blocks.

    The measurement runs in this process's measurement worker (:mod:`opcost.worker`), not
    in the Snakemake thread that runs the rule.
    """
    from opcost import worker

    started = time.time()
    gpu = study.gpus[wildcards.gpu]
    record = worker.call(
        "opcost.profile:profile_job",
        kind=kind,
        gpu=gpu,
        setting=parse_setting(wildcards.setting),
        mode=wildcards.mode,
        profile_config=dict(study.config["profile"]),
        csv_path=str(output.csv),
        json_path=str(output.json),
        spec=json.loads(spec_json) if spec_json else None,
        op_id=getattr(wildcards, "op_id", None),
        model_input=study.model_input(wildcards.model_input) if kind == "network" else None,
        job_log_path=str(log.nvsmi),
    )
    keys = ("status", "failure_reason", "device", "iterations", "total_time_s", "block_size")
    _write_job_log(log.job, record, keys, started)


def _write_job_log(
    path: Any, record: dict[str, Any], keys: tuple[str, ...], started: float
) -> None:
    """A measuring job's log: the record's ``keys``, its wall time, and which processes ran it
    (on a cluster, one process runs a whole batch of these jobs)."""
    from opcost import worker

    summary = {k: record.get(k) for k in keys}
    summary["job_wall_s"] = round(time.time() - started, 3)
    summary["pid"] = os.getpid()
    summary["worker_pid"] = worker.pid()
    summary["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")
    write_atomic(path, json.dumps(summary) + "\n")


# -- the op-space study (opcost.opspace) ---------------------------------------------------


def op_space_round_counts(study: Study) -> list[dict[str, int]]:
    """Configurations per op family of each round of the op-space study: round 1
    (``op_space.samples``), then each of ``op_space.rounds``."""
    op_space = study.config["op_space"]
    return [dict(op_space["samples"]), *(dict(r["samples"]) for r in op_space["rounds"])]


def op_space_chunks(study: Study, round_: int = 1) -> list[int]:
    """Chunk numbers of one round of the op-space study (its measuring jobs per GPU
    configuration): ``op_space.chunk_size`` configurations each."""
    total = sum(op_space_round_counts(study)[round_ - 1].values())
    return list(range(math.ceil(total / study.config["op_space"]["chunk_size"])))


def op_space_chunk_names(study: Study, gpu: str | None = None) -> list[str]:
    """The chunk tables of every round (of every round that GPU configuration ``gpu``
    measures: those whose ``gpus`` name it or that name none), by name: round 1's
    ``{chunk}``, then round r's ``r{r}-{chunk}``
    (``results/op-space/raw/{gpu}/{name}.parquet``)."""
    names = [str(c) for c in op_space_chunks(study)]
    for r, round_ in enumerate(study.config["op_space"]["rounds"], start=2):
        if gpu is None or gpu in round_.get("gpus", (gpu,)):
            names += [f"r{r}-{c}" for c in op_space_chunks(study, r)]
    return names


def op_space_chunk_paths(study: Study, gpus: Iterable[str] | None = None) -> list[str]:
    """Every chunk table the op-space study measures for GPU configurations ``gpus``
    (default: all of the study's)."""
    return [
        f"results/op-space/raw/{gpu}/{name}.parquet"
        for gpu in (study.gpus if gpus is None else gpus)
        for name in op_space_chunk_names(study, gpu)
    ]


def op_space_sampling_params(study: Study) -> dict[str, Any]:
    """The op-space settings that change round 1's sampled configurations (not the later
    rounds: adding one leaves round 1 as it is)."""
    op_space = study.config["op_space"]
    return {k: op_space[k] for k in ("samples", "power_samples", "seed", "generator")}


def op_space_round_params(study: Study, round_: int) -> dict[str, Any]:
    """The settings that make round ``round_`` (2, 3, ...) of the op space: its counts
    and power samples, the seed, and where each family's sequence starts (after every
    configuration asked of it by the rounds before; none of the rounds after)."""
    counts = op_space_round_counts(study)
    if not 2 <= round_ <= len(counts):
        raise OpcostError(
            f"op space round {round_}: the config has rounds 1-{len(counts)} "
            "(op_space.samples, then op_space.rounds)"
        )
    starts: dict[str, int] = {}
    for earlier in counts[: round_ - 1]:
        for family, n in earlier.items():
            starts[family] = starts.get(family, 0) + n
    op_space = study.config["op_space"]
    later = op_space["rounds"][round_ - 2]
    return {
        "samples": counts[round_ - 1],
        "power_samples": later["power_samples"],
        "generator": later["generator"],
        "seed": op_space["seed"],
        "starts": starts,
        "round": round_,
    }


#: Op families whose kernels TF32 changes (cuBLAS and cuDNN matrix products).
TF32_FAMILIES = ("conv", "linear", "matmul", "attention")


def tf32_twin(study: Study, gpu: str) -> str | None:
    """The study's configuration of the same GPU with TF32 on, for one with TF32 off (same
    device, dtype, SLURM GPU model and GPU name); None if there is none or TF32 is on."""
    g = study.gpus[gpu]
    if g.tf32:
        return None
    for name, other in study.gpus.items():
        if other.tf32 and (other.device, other.dtype, *_gpu_of(other)) == (
            g.device, g.dtype, *_gpu_of(g)
        ):  # fmt: skip
            return name
    return None


def _gpu_of(c: GpuConfig) -> tuple:
    """Which GPU a configuration runs on: its SLURM GPU model, constraint and GPU name."""
    return (c.slurm_gpu_model, c.slurm_constraint, c.gpu_name)


def op_space_families(study: Study, gpu: str) -> list[str] | None:
    """The op families configuration ``gpu`` measures: with TF32 off and a TF32 twin,
    only :data:`TF32_FAMILIES` (the rest runs the same kernels and is the twin's);
    else all (None)."""
    return list(TF32_FAMILIES) if tf32_twin(study, gpu) else None


def run_op_space_samples(params: dict[str, Any], output: str) -> None:
    """Sample one round of the op space (:func:`opcost.opspace.sample`; ``params`` of
    :func:`op_space_sampling_params` for round 1, of :func:`op_space_round_params` for a
    later one); mark ``power_samples`` of each family, spread evenly over its sequence,
    for a power window (:mod:`opcost.opspace_measure`)."""
    from opcost import opspace

    table = opspace.sample(
        dict(params["samples"]),
        seed=params["seed"],
        starts=dict(params.get("starts", {})),
        round_=params.get("round", 1),
        generator=params["generator"],
    )
    rank = table.groupby("family").cumcount()
    size = table.groupby("family")["family"].transform("size")
    k = params["power_samples"]
    table["power"] = (rank + 1) * k // size > rank * k // size
    write_parquet_atomic(table, output)


def run_op_space_chunk(study: Study, wildcards: Any, input: Any, output: Any, log: Any) -> None:
    """Entry point of rules ``measure_op_space`` and ``measure_op_space_round`` (in the
    measurement worker): chunk ``wildcards.chunk`` of the round's samples table."""
    from opcost import worker

    started = time.time()
    summary = worker.call(
        "opcost.opspace_measure:measure_chunk_file",
        gpu=study.gpus[wildcards.gpu],
        profile_config=dict(study.config["profile"]),
        samples_path=str(input.samples),
        chunk=int(wildcards.chunk),
        chunk_size=int(study.config["op_space"]["chunk_size"]),
        families=op_space_families(study, wildcards.gpu),
        out_path=str(output.table),
    )
    _write_job_log(log.job, summary, tuple(summary), started)


# -- the op models (opcost.model.opmodel) -------------------------------------------------


def _chunk_order(path: Path) -> tuple[float, int, str]:
    """Chunk tables in round then chunk order (``2.parquet`` before ``10.parquet``, round
    1's before ``r2-0.parquet``, ``r2-2`` before ``r2-10``); other names last."""
    match = re.fullmatch(r"(?:r(\d+)-)?(\d+)", path.stem)
    if match is None:
        return (math.inf, 0, path.stem)
    return (int(match[1] or 1), int(match[2]), "")


def op_space_data_chunks(data: str | Path, gpu: str) -> list[str]:
    """The chunk tables of configuration ``gpu`` in an op-space data directory."""
    return [str(p) for p in sorted(Path(data, gpu).glob("*.parquet"), key=_chunk_order)]


def op_space_data_inputs(data: str | Path, gpu: str, pool: bool = True) -> dict[str, list[str]]:
    """The chunk tables the op models of ``gpu`` are trained on from an op-space data
    directory: its own (``chunks``), its TF32-on twin's (``twin``,
    :func:`opcost.model.op_tables.twin_of`; empty for none) and, with ``pool``
    (``op_space.model.pool_gpus``), those of its peers on other GPUs (``peers``,
    :func:`opcost.model.op_tables.peers_of`) and of its twin's peers (in ``twin``)."""
    stamp = tuple(Path(p).stat().st_mtime_ns for p in sorted(Path(data).glob("*/*.parquet")))
    twin, peers, twin_peers = _op_space_data_relatives(str(data), gpu, stamp)
    chunks = lambda names: [c for n in names for c in op_space_data_chunks(data, n)]  # noqa: E731
    return {
        "chunks": op_space_data_chunks(data, gpu),
        "twin": chunks([twin, *(twin_peers if pool else ())] if twin else []),
        "peers": chunks(peers if pool else []),
    }


@cache
def _op_space_data_relatives(
    data: str, gpu: str, stamp: tuple[int, ...]
) -> tuple[str | None, tuple[str, ...], tuple[str, ...]]:
    """``(twin, peers, the twin's peers)`` of ``gpu`` among the data's configurations."""
    from opcost.config import op_space_data_gpus
    from opcost.model import op_tables

    columns = ["tf32", "gpu_name", "dtype"]
    tables = {
        name: pd.concat(
            [pd.read_parquet(p, columns=columns) for p in op_space_data_chunks(data, name)],
            ignore_index=True,
        )
        for name in op_space_data_gpus(data)
    }
    twin = op_tables.twin_of(tables, gpu)
    twin_peers = tuple(op_tables.peers_of(tables, twin)) if twin else ()
    return twin, tuple(op_tables.peers_of(tables, gpu)), twin_peers


def op_models_gpus(study: Study) -> list[str]:
    """The GPU configurations that get op models: with ``op_space.data``, those the
    directory holds; else the study's own when it samples the op space; else none."""
    from opcost.config import op_space_data_gpus

    op_space = study.config["op_space"]
    if op_space["data"] is not None:
        return op_space_data_gpus(op_space["data"])
    if any(op_space["samples"].values()):
        return list(study.gpus)
    return []


def gpu_peers(study: Study, gpu: str) -> list[str]:
    """The study's configurations whose op-space samples the op models of ``gpu`` pool
    with its own (``op_space.model.pool_gpus``): the same device kind, dtype and TF32
    setting on another GPU (SLURM GPU model, constraint or GPU name)."""
    g = study.gpus[gpu]
    return [
        name
        for name, other in study.gpus.items()
        if (other.device, other.dtype, other.tf32) == (g.device, g.dtype, g.tf32)
        and _gpu_of(other) != _gpu_of(g)
    ]


def op_model_inputs(study: Study, gpu: str) -> dict[str, list[str]]:
    """The chunk tables the op models of ``gpu`` are trained on: its own (``chunks``),
    for a TF32-off configuration with a TF32-on twin the twin's (``twin``) and, with
    ``op_space.model.pool_gpus``, its peers' on other GPUs (``peers``, :func:`gpu_peers`)
    and its twin's peers' (in ``twin``). From ``op_space.data`` when it is set (the twin:
    :func:`opcost.model.op_tables.twin_of` over the directory's configurations), else the
    study's measurements (``results/op-space/raw``; the twin: :func:`tf32_twin`)."""
    op_space = study.config["op_space"]
    pool = bool(op_space["model"]["pool_gpus"])
    if op_space["data"] is not None:
        return op_space_data_inputs(op_space["data"], gpu, pool)

    twin = tf32_twin(study, gpu)
    twins = [twin, *(gpu_peers(study, twin) if pool else [])] if twin else []
    return {
        "chunks": op_space_chunk_paths(study, [gpu]),
        "twin": op_space_chunk_paths(study, twins) if twins else [],
        "peers": op_space_chunk_paths(study, gpu_peers(study, gpu) if pool else []),
    }


def op_models_params(study: Study) -> dict[str, Any]:
    """The ``op_space.model`` settings (the op models are retrained when they change)."""
    return dict(study.config["op_space"]["model"])
