"""What the Snakemake rules need from the package: file lists and the profiling job entry.

The rules stay thin; the logic that decides which files a stage needs lives here, where
pytest reaches it.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import time
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from opcost.config import Study, traced_in_job
from opcost.errors import OpcostError
from opcost.io import write_atomic
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
    write_job_log(log.job, record, ("status", "failure_reason", "device", "gpu_time_s"), started)


def gpu_params(study: Study, gpu: str) -> dict[str, Any]:
    """The GPU configuration's fields that change a measurement (rerun when they change).
    ``cudnn_benchmark`` only where it is on, so that measurements made before it existed
    stay valid."""
    g = study.gpus[gpu]
    params: dict[str, Any] = {"device": g.device, "tf32": g.tf32, "dtype": g.dtype}
    if g.cudnn_benchmark:
        params["cudnn_benchmark"] = True
    return params


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
    write_job_log(log.job, record, keys, started)


def write_job_log(path: Any, record: dict[str, Any], keys: tuple[str, ...], started: float) -> None:
    """A measuring job's log: the record's ``keys``, its wall time, and which processes ran it
    (on a cluster, one process runs a whole batch of these jobs)."""
    from opcost import worker

    summary = {k: record.get(k) for k in keys}
    summary["job_wall_s"] = round(time.time() - started, 3)
    summary["pid"] = os.getpid()
    summary["worker_pid"] = worker.pid()
    summary["slurm_job_id"] = os.environ.get("SLURM_JOB_ID")
    write_atomic(path, json.dumps(summary) + "\n")
