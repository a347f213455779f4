"""A cache of extracted op tables: predicting the same network again imports no torch.

``opcost predict --model NAME --input SHAPE`` spends most of a fresh process importing
torch and torchvision to extract the network's operations. The op table depends only on
the model, the input shape, whether functional ops are recorded, what extraction records
(:data:`opcost.names.SPEC_VERSION`), the torch and torchvision versions and opcost's own
version; it is kept as one Parquet file per such key in :func:`cache_dir`. Looking an
entry up and reading it imports neither torch nor torchvision (versions are read from the
installed packages' metadata).

Only torchvision model names are cached: a ``package.module:factory`` is the user's code,
which can change under the same name and version, so it is extracted every time.

An entry holds the op table and, per op, the gradient sums its calls run in a training
step of the network (:mod:`opcost.model.grad_sums`), the copies of gradients it runs
when measured alone in training (:mod:`opcost.model.leaf_grads`) and the clone of its
input it makes in place in a training step (:mod:`opcost.model.inplace_saves`), which
take torch to find. It is used only if it is a readable table with those columns
(:data:`CACHED_COLUMNS`), for the
requested model-input set, with every ``op_id`` the hash of its spec and positive counts;
any other entry (a cut-off write, bytes changed on disk) is ignored, extracted again and
written again. A cache that cannot be written leaves the prediction unharmed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pandas as pd

from opcost import __version__
from opcost.io import write_parquet_atomic
from opcost.model import grad_sums, inplace_saves, leaf_grads
from opcost.names import SPEC_VERSION, ModelInput, model_input_name
from opcost.schemas import OPS

#: Columns of a cached entry: the op table's, its calls' gradient sums in the network
#: (:data:`opcost.model.grad_sums.COLUMNS`), the copies of gradients an op measured
#: alone runs in training (:data:`opcost.model.leaf_grads.COLUMNS`) and the clones an
#: in-place op makes in a network's training step (:data:`opcost.model.inplace_saves.
#: COLUMNS`), which predicting from the op models needs and which take torch to find.
CACHED_COLUMNS = (*OPS.names, *grad_sums.COLUMNS, *leaf_grads.COLUMNS, *inplace_saves.COLUMNS)
#: Environment variable naming the cache's directory (overrides the default).
CACHE_ENV = "OPCOST_CACHE_DIR"


def cache_dir(override: str | Path | None = None) -> Path:
    """``override``, else ``$OPCOST_CACHE_DIR``, else ``$XDG_CACHE_HOME/opcost/ops``
    (``~/.cache/opcost/ops`` where ``XDG_CACHE_HOME`` is unset)."""
    if override:
        return Path(override)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "opcost" / "ops"


def _versions() -> dict[str, str] | None:
    """Versions of what shapes an op table; None where torch or torchvision is missing."""
    try:
        return {
            "torch": metadata.version("torch"),
            "torchvision": metadata.version("torchvision"),
        }
    except metadata.PackageNotFoundError:
        return None


def entry_path(
    directory: Path, model: str, shape: tuple[int, ...], functional_ops: bool
) -> Path | None:
    """The file that caches this op table, or None for a model that is not cached."""
    versions = _versions()
    if ":" in model or versions is None:
        return None
    key = {
        "model": model,
        "shape": list(shape),
        "functional_ops": functional_ops,
        "spec_version": SPEC_VERSION,
        "opcost": __version__,
        **versions,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return directory / f"{model_input_name(model, shape)}.{digest}.parquet"


def _valid(table: pd.DataFrame, name: str) -> bool:
    """Whether a cached table is a complete op table of model-input set ``name``."""
    if tuple(table.columns) != CACHED_COLUMNS or table.empty:
        return False
    hashes = table["spec"].map(lambda s: hashlib.sha256(str(s).encode()).hexdigest()[:16])
    return bool(
        (table["model_input"] == name).all()
        and (hashes == table["op_id"]).all()
        and pd.api.types.is_integer_dtype(table["count"])
        and (table["count"] > 0).all()
    )


def load(path: Path, name: str) -> pd.DataFrame | None:
    """The cached table at ``path``, or None where there is none or it is not usable."""
    try:
        table = pd.read_parquet(path)
    except Exception:  # missing, or damaged: pyarrow raises several types
        return None
    return table if _valid(table, name) else None


def extract_cached(
    model: str,
    shape: tuple[int, ...],
    functional_ops: bool,
    extract: Callable[[], pd.DataFrame],
    directory: Path | None,
    warn: Callable[[str], None] = lambda line: None,
) -> pd.DataFrame:
    """The op table of ``model`` at ``shape`` with its gradient sums: from the cache in
    ``directory`` if it holds a usable entry, else ``extract()`` and the sums
    (:func:`opcost.extract.with_gradient_sums`), which are then stored with the leaf
    gradients' copies and the in-place ops' clones. ``directory`` None: no cache."""
    path = entry_path(directory, model, shape, functional_ops) if directory else None
    if path is None:
        return _with_sums(extract(), model, shape, functional_ops)
    table = load(path, model_input_name(model, shape))
    if table is not None:
        return table
    table = _with_sums(extract(), model, shape, functional_ops)
    table = inplace_saves.with_saves(leaf_grads.with_copies(table))
    try:
        write_parquet_atomic(table, path)
    except OSError as e:
        warn(f"opcost: op table not cached ({e}); set {CACHE_ENV} to a writable directory")
    return table


def _with_sums(
    table: pd.DataFrame, model: str, shape: tuple[int, ...], functional_ops: bool
) -> pd.DataFrame:
    from opcost.extract import with_gradient_sums

    return with_gradient_sums(table, ModelInput(model, shape), functional_ops=functional_ops)
