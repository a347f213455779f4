"""What the op-space study's and the op models' Snakemake rules need from the package: the
rounds' chunks and sampling parameters, each GPU configuration's TF32 twin and peers, the
chunk tables a configuration's op models train on, and the measuring job's entry
(:mod:`opcost.opspace`, :mod:`opcost.opspace_measure`, :mod:`opcost.model.opmodel`).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from opcost import opspace_split
from opcost.config import GpuConfig, Study
from opcost.errors import OpcostError
from opcost.io import write_parquet_atomic
from opcost.workflow import write_job_log

# -- the op-space study (opcost.opspace) ---------------------------------------------------


def op_space_round_counts(study: Study) -> list[dict[str, int]]:
    """Configurations per op family of each round of the op-space study: round 1
    (``op_space.samples``), then each of ``op_space.rounds``."""
    op_space = study.config["op_space"]
    return [dict(op_space["samples"]), *(dict(r["samples"]) for r in op_space["rounds"])]


def _round_settings(study: Study, round_: int) -> dict[str, Any]:
    """Round ``round_``'s settings: ``op_space`` itself for round 1, else its entry of
    ``op_space.rounds``."""
    op_space = study.config["op_space"]
    return op_space if round_ == 1 else op_space["rounds"][round_ - 2]


def op_space_split(study: Study, round_: int, gpu: str) -> tuple[int, int] | None:
    """``(index, members)`` of GPU configuration ``gpu`` in the group of peers that share
    round ``round_`` (its ``split_peers``, :mod:`opcost.opspace_split`): itself and its
    peers (:func:`gpu_peers`) among the round's configurations, names sorted. None where
    the round is not split, or no peer of ``gpu`` measures it."""
    settings = _round_settings(study, round_)
    if settings.get("split_peers") is None:
        return None
    measuring = settings.get("gpus") or list(study.gpus)
    group = sorted({gpu, *(p for p in gpu_peers(study, gpu) if p in measuring)})
    return (group.index(gpu), len(group)) if len(group) > 1 else None


def op_space_chunks(study: Study, round_: int = 1, gpu: str | None = None) -> list[int]:
    """Chunk numbers of one round of the op-space study (its measuring jobs per GPU
    configuration): ``op_space.chunk_size`` configurations each; of a round split
    between peers (:func:`op_space_split`), those of ``gpu``'s share."""
    counts = op_space_round_counts(study)[round_ - 1]
    split = None if gpu is None else op_space_split(study, round_, gpu)
    if split is None:
        total = sum(counts.values())
    else:
        settings = _round_settings(study, round_)
        total = opspace_split.rows_at_most(
            counts, settings["power_samples"], settings["split_peers"], *split
        )
    return list(range(math.ceil(total / study.config["op_space"]["chunk_size"])))


def op_space_chunk_names(study: Study, gpu: str | None = None) -> list[str]:
    """The chunk tables of every round (of every round that GPU configuration ``gpu``
    measures: those whose ``gpus`` name it or that name none), by name: round 1's
    ``{chunk}``, then round r's ``r{r}-{chunk}``
    (``results/op-space/raw/{gpu}/{name}.parquet``)."""
    names = [str(c) for c in op_space_chunks(study, 1, gpu)]
    for r, round_ in enumerate(study.config["op_space"]["rounds"], start=2):
        if gpu is None or gpu in round_.get("gpus", (gpu,)):
            names += [f"r{r}-{c}" for c in op_space_chunks(study, r, gpu)]
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
    params = {k: op_space[k] for k in ("samples", "power_samples", "seed", "generator")}
    return _with_split(params, op_space)


def _with_split(params: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """A round's sampling ``params`` with its ``split_peers``, where it has one (a round
    without keeps the params it had before the setting existed)."""
    if settings.get("split_peers") is not None:
        params["split_peers"] = settings["split_peers"]
    return params


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
    later = _round_settings(study, round_)
    params = {
        "samples": counts[round_ - 1],
        "power_samples": later["power_samples"],
        "generator": later["generator"],
        "seed": study.config["op_space"]["seed"],
        "starts": starts,
        "round": round_,
    }
    return _with_split(params, later)


#: Op families whose kernels TF32 changes (cuBLAS and cuDNN matrix products).
TF32_FAMILIES = ("conv", "linear", "matmul", "attention")
#: Op families whose kernels ``cudnn_benchmark`` changes (cuDNN's convolutions).
CUDNN_BENCHMARK_FAMILIES = ("conv",)


def default_twin(study: Study, gpu: str) -> str | None:
    """The study's configuration of the same GPU with PyTorch's default numerics (TF32
    on, ``cudnn_benchmark`` off; same device, dtype, SLURM GPU model and GPU name), for
    one with TF32 off or ``cudnn_benchmark`` on; None if there is none or ``gpu`` has
    those numerics itself."""
    g = study.gpus[gpu]
    if g.tf32 and not g.cudnn_benchmark:
        return None
    for name, other in study.gpus.items():
        if (
            other.tf32
            and not other.cudnn_benchmark
            and (other.device, other.dtype, *_gpu_of(other)) == (g.device, g.dtype, *_gpu_of(g))
        ):
            return name
    return None


def _gpu_of(c: GpuConfig) -> tuple:
    """Which GPU a configuration runs on: its SLURM GPU model, constraint and GPU name."""
    return (c.slurm_gpu_model, c.slurm_constraint, c.gpu_name)


def twin_families(tf32: bool, cudnn_benchmark: bool) -> list[str]:
    """The op families whose kernels differ from those with TF32 on and
    ``cudnn_benchmark`` off: :data:`TF32_FAMILIES` with TF32 off, and
    :data:`CUDNN_BENCHMARK_FAMILIES` with ``cudnn_benchmark`` on, in that order (a rule's
    params: the order must not change)."""
    families = [] if tf32 else list(TF32_FAMILIES)
    if cudnn_benchmark:
        families += [f for f in CUDNN_BENCHMARK_FAMILIES if f not in families]
    return families


def op_space_families(study: Study, gpu: str) -> list[str] | None:
    """The op families configuration ``gpu`` measures: with a twin (:func:`default_twin`),
    only those its numerics change (:func:`twin_families`; the rest runs the same kernels
    and is the twin's); else all (None)."""
    g = study.gpus[gpu]
    return twin_families(g.tf32, g.cudnn_benchmark) if default_twin(study, gpu) else None


def run_op_space_samples(params: dict[str, Any], output: str) -> None:
    """Sample one round of the op space (:func:`opcost.opspace.sample`; ``params`` of
    :func:`op_space_sampling_params` for round 1, of :func:`op_space_round_params` for a
    later one); mark ``power_samples`` of each family, spread evenly over its sequence,
    for a power window (:mod:`opcost.opspace_measure`); with ``split_peers``, which peer
    measures each (``split_rank``, :mod:`opcost.opspace_split`)."""
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
    if params.get("split_peers") is not None:
        table["split_rank"] = opspace_split.split_ranks(
            table["family"], table["power"], params["split_peers"]
        )
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
        split=op_space_split(study, int(getattr(wildcards, "round", 1)), wildcards.gpu),
        out_path=str(output.table),
    )
    write_job_log(log.job, summary, tuple(summary), started)


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
    from opcost.config_opspace import op_space_data_gpus
    from opcost.model import op_tables

    tables = {
        name: pd.concat(
            [op_tables.read_numerics(p) for p in op_space_data_chunks(data, name)],
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
    from opcost.config_opspace import op_space_data_gpus

    op_space = study.config["op_space"]
    if op_space["data"] is not None:
        return op_space_data_gpus(op_space["data"])
    if any(op_space["samples"].values()):
        return list(study.gpus)
    return []


def gpu_peers(study: Study, gpu: str) -> list[str]:
    """The study's configurations whose op-space samples the op models of ``gpu`` pool
    with its own (``op_space.model.pool_gpus``): the same device kind, dtype, TF32 and
    ``cudnn_benchmark`` setting on another GPU (SLURM GPU model, constraint or GPU name)."""
    g = study.gpus[gpu]
    return [
        name
        for name, other in study.gpus.items()
        if (other.device, other.dtype, other.tf32, other.cudnn_benchmark)
        == (g.device, g.dtype, g.tf32, g.cudnn_benchmark)
        and _gpu_of(other) != _gpu_of(g)
    ]


def op_model_inputs(study: Study, gpu: str) -> dict[str, list[str]]:
    """The chunk tables the op models of ``gpu`` are trained on: its own (``chunks``),
    for a TF32-off configuration with a TF32-on twin the twin's (``twin``) and, with
    ``op_space.model.pool_gpus``, its peers' on other GPUs (``peers``, :func:`gpu_peers`)
    and its twin's peers' (in ``twin``). From ``op_space.data`` when it is set (the twin:
    :func:`opcost.model.op_tables.twin_of` over the directory's configurations), else the
    study's measurements (``results/op-space/raw``; the twin: :func:`default_twin`)."""
    op_space = study.config["op_space"]
    pool = bool(op_space["model"]["pool_gpus"])
    if op_space["data"] is not None:
        return op_space_data_inputs(op_space["data"], gpu, pool)

    twin = default_twin(study, gpu)
    twins = [twin, *(gpu_peers(study, twin) if pool else [])] if twin else []
    return {
        "chunks": op_space_chunk_paths(study, [gpu]),
        "twin": op_space_chunk_paths(study, twins) if twins else [],
        "peers": op_space_chunk_paths(study, gpu_peers(study, gpu) if pool else []),
    }


def op_models_params(study: Study) -> dict[str, Any]:
    """The ``op_space.model`` settings (the op models are retrained when they change)."""
    return dict(study.config["op_space"]["model"])
