"""Op models built once from op-space measurements and kept in the user's cache.

Where no op models are given or at hand (``opcost.model.sources.op_model_source``),
``opcost predict`` builds them from the op-space data of the opcost checkout it runs from
(``data/op-space``: the real H100 and H200 measurements) exactly as ``snakemake
op_models`` does on the default config, once, into
``$OPCOST_CACHE_DIR/op-models/{key}`` (else ``$XDG_CACHE_HOME/opcost/op-models/{key}``,
``~/.cache`` where unset). The key is the SHA-256 of the data's chunk tables and of the
opcost code that trains and reads the models, so new data or new code builds them anew
and never loads a stale model. A directory is renamed into place only when every
configuration's models are saved, so an interrupted build leaves nothing that loads::

    directory = cached_op_models(Path("data/op-space"), log=print)   # built on first use
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

#: The opcost code that decides what a built op model holds: the training job, the
#: regressors, the replay constants, the config defaults and every module of ``model/``.
_CODE = ("op_models_job.py", "train.py", "replay.py", "validate/replay.py", "config.schema.yaml",
         "model/*.py")  # fmt: skip
_PACKAGE = Path(__file__).resolve().parents[1]
#: Sets of op models kept in the cache (other data or code built the others).
KEPT = 3


def cache_root() -> Path:
    """``$OPCOST_CACHE_DIR/op-models``, else ``$XDG_CACHE_HOME/opcost/op-models``
    (``~/.cache/opcost/op-models`` where ``XDG_CACHE_HOME`` is unset)."""
    override = os.environ.get("OPCOST_CACHE_DIR")
    if override:
        return Path(override) / "op-models"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "opcost" / "op-models"


def key(data: Path) -> str:
    """The SHA-256 (hex, first 16 digits) of the chunk tables under ``data`` (their
    paths relative to it and their bytes) and of the code in :data:`_CODE`."""
    digest = hashlib.sha256()
    for path in sorted(data.glob("*/*.parquet")):
        digest.update(str(path.relative_to(data)).encode() + b"\0")
        digest.update(path.read_bytes())
    for pattern in _CODE:
        for path in sorted(_PACKAGE.glob(pattern)):
            digest.update(pattern.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cached_op_models(data: Path, log: Callable[[str], None] = lambda line: None) -> Path:
    """The directory of op models built from the op-space data in ``data`` (one
    subdirectory per GPU configuration): from the cache, else built now (module
    docstring), with the default config's ``op_space.model`` settings."""
    from opcost import op_models_job
    from opcost.config import schema_defaults
    from opcost.config_opspace import op_space_data_gpus
    from opcost.model.opmodel_format import MANIFEST_FILE
    from opcost.opspace_workflow import op_space_data_inputs

    target = cache_root() / key(data)
    gpus = op_space_data_gpus(data)
    if all((target / gpu / MANIFEST_FILE).is_file() for gpu in gpus):
        return target
    settings = schema_defaults("op_space", "model")
    staging = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    log(f"building the op models from {data} once (about 1.5 min on 2 cores); cached in {target}")
    for gpu in gpus:
        inputs = op_space_data_inputs(data, gpu, settings["pool_gpus"])
        op_models_job.run_train_op_models(
            gpu,
            inputs["chunks"],
            inputs["twin"],
            settings,
            staging / gpu,
            staging / f"{gpu}.log",
            threads=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1,
            peers=inputs["peers"],
        )
    try:
        staging.rename(target)
    except OSError:  # another process built them first
        shutil.rmtree(staging, ignore_errors=True)
        if not all((target / gpu / MANIFEST_FILE).is_file() for gpu in gpus):
            raise
    _prune(target)
    return target


def _prune(keep: Path) -> None:
    """Remove all but the :data:`KEPT` most recently built sets of op models (``keep``
    among them): each is about 120 MB."""
    built = [p for p in keep.parent.iterdir() if p.is_dir() and not p.name.startswith(".")]
    built.sort(key=lambda p: (p == keep, p.stat().st_mtime), reverse=True)
    for old in built[KEPT:]:
        shutil.rmtree(old, ignore_errors=True)
