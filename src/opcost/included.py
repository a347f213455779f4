"""Measurements made elsewhere that a study includes (config ``include``; docs/data.md).

An included GPU configuration is evaluated by the same ``evaluate`` rule as a profiled
one, from the same raw files: a dataset directory's archives are unpacked first, under
``results/included/{gpu}/{index}`` (rule ``unpack_included``), into the layout a
study's working directory has (``results/raw/{gpu}/...``, ``logs/...``).
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pandas as pd

from opcost.config import IncludedSource, Study
from opcost.errors import OpcostError
from opcost.evaluate import KIND_DIRS


class IncludedDataError(OpcostError, ValueError):
    """An included archive cannot be unpacked as a study's raw logs."""


def unpack_dir(gpu: str, index: int) -> str:
    """Where rule ``unpack_included`` unpacks the ``index``-th source of ``gpu``."""
    return f"results/included/{gpu}/{index}"


def roots(study: Study, gpu: str) -> list[str]:
    """The working-directory-like roots that hold ``gpu``'s included raw logs, one per
    source: the unpacked archives of a dataset directory, or the study directory itself."""
    return [
        unpack_dir(gpu, i) if source.layout == "dataset" else source.data
        for i, source in enumerate(study.included.get(gpu, ()))
    ]


def op_tables(study: Study, gpu: str) -> list[str]:
    """The op tables a GPU configuration's measurements were made with: the study's own
    (``results/ops``) for a profiled one, the included directories' for an included one."""
    if gpu in study.included:
        return [t for source in study.included[gpu] for t in source.op_tables]
    return [f"results/ops/{mi.name}.parquet" for mi in study.model_inputs]


def op_tables_by_gpu(study: Study) -> dict[str, list[str]]:
    """:func:`op_tables` of every GPU configuration the study evaluates."""
    return {gpu: op_tables(study, gpu) for gpu in study.evaluated_gpus}


def raw_jsons(source: IncludedSource, root: str | Path) -> tuple[list[Path], int]:
    """The benchmark JSONs of ``source`` under ``root``: its study's networks and the ops
    of their op tables, in each of its settings and modes; and how many of those are
    missing (a study stopped before its end)."""
    op_ids = sorted(
        set().union(*(pd.read_parquet(t, columns=["op_id"])["op_id"] for t in source.op_tables))
    )
    names = {"op": op_ids, "network": [mi.name for mi in source.study.model_inputs]}
    base = Path(root) / "results" / "raw" / source.gpu.name
    found, missing = [], 0
    for setting in source.gpu.settings:
        for mode in source.study.modes:
            for kind, ids in names.items():
                for name in ids:
                    path = base / setting.name / mode / KIND_DIRS[kind] / f"{name}.json"
                    if path.is_file():
                        found.append(path)
                    else:
                        missing += 1
    return found, missing


def unpack(archives: list[str], dest: str | Path) -> None:
    """Unpack a dataset directory's archives into ``dest`` (emptied first).

    Only regular files and directories under ``results/`` and ``logs/`` are taken (tar's
    ``data`` filter: no links, no absolute paths, no ``..``); the rest of ``dest`` is left
    as a job's output would be: complete, or removed by Snakemake after a failure.

    Raises:
        IncludedDataError: an archive is unreadable or holds anything else.
    """
    dest = Path(dest)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for archive in archives:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                for member in tar.getmembers():
                    top = Path(member.name).parts[:1]
                    if top not in (("results",), ("logs",)) or not (
                        member.isfile() or member.isdir()
                    ):
                        raise IncludedDataError(
                            f"{archive}: holds {member.name!r}; a dataset archive holds "
                            "files under results/ and logs/ only"
                        )
                tar.extractall(dest, filter="data")
        except (tarfile.TarError, OSError, EOFError) as e:
            raise IncludedDataError(f"{archive}: cannot unpack ({e})") from e
