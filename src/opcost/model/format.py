"""The predictor directory's format: save, load and verify (``results/predictors/{gpu}/``).

A predictor is ``time.npz`` (regressor of ``log(time_s)``), ``power.npz`` (of
``power_w``; absent without power data), ``features.json`` (feature schema, trained
conditions, training ranges, provenance) and, written last, ``manifest.json``: the
format version, the GPU configuration, the dataset (path, SHA-256) and the SHA-256 and
size of every other file, also ``metrics.json`` and the validation tables that
``opcost train`` writes first. The model files are uncompressed ``.npz`` archives of
plain arrays (:class:`~opcost.model.trees.TreeEnsemble`), read without pickles, so
loading runs no code from the files; every listed file is checked against the
manifest before any is parsed. docs/formats.md describes the files::

    save_predictor(predictor, "results/predictors/h100", dataset="results/dataset/h100.parquet")
    predictors = load_predictors("results/predictors")   # GPU configuration -> Predictor
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from opcost.io import write_atomic, write_json_atomic
from opcost.model import PredictorError
from opcost.model.features import CONDITIONS, FeatureSchema, check_schema
from opcost.model.predictor import Predictor, TimeReference
from opcost.model.trees import TreeEnsemble, _starmap_threads
from opcost.names import MODES
from opcost.schemas import HOLDOUT, NETWORK_PREDICTIONS

FEATURES_FILE = "features.json"
TIME_FILE = "time.npz"
POWER_FILE = "power.npz"
#: Written by ``opcost train`` beside the models: its leave-one-network-out errors tell
#: how far a predicted margin between two choices can be trusted.
METRICS_FILE = "metrics.json"
#: Validation tables written by ``opcost train`` beside the models (not read to predict).
HOLDOUT_FILE = "holdout_predictions.parquet"
NETWORKS_FILE = "network_predictions.parquet"
#: Written last: the SHA-256 of every other file of the predictor.
MANIFEST_FILE = "manifest.json"
#: The predictor directory's format (the manifest and the model files); another is refused.
FORMAT_VERSION = 1
#: What to do about a predictor whose files do not match its manifest (Snakemake does
#: not rerun a job whose outputs exist unless forced).
RETRAIN = f"retrain it (snakemake -f results/predictors/<gpu>/{MANIFEST_FILE})"
#: Files a manifest may list, in the order they are checked.
PREDICTOR_FILES = (FEATURES_FILE, TIME_FILE, POWER_FILE, METRICS_FILE, HOLDOUT_FILE, NETWORKS_FILE)
#: Columns of ``holdout_predictions.parquet`` and ``network_predictions.parquet``, as
#: declared in :mod:`opcost.schemas` (docs/formats.md).
HOLDOUT_COLUMNS = list(HOLDOUT.names)
NETWORK_COLUMNS = list(NETWORK_PREDICTIONS.names)


def save_predictor(
    predictor: Predictor, directory: str | Path, dataset: str | Path | None = None
) -> None:
    """Write ``time.npz``, ``power.npz`` (none without a power model), ``features.json``
    and, last, ``manifest.json``.

    The manifest also covers ``metrics.json`` and the validation tables already in
    ``directory`` (``opcost train`` writes them first). Until it is written, the directory
    holds no manifest, so a predictor interrupted while being saved never loads.

    Args:
        dataset: the dataset Parquet the models were trained from, recorded with its
            SHA-256 in the manifest (None: not recorded).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST_FILE).unlink(missing_ok=True)
    _write_model(predictor.time_model, directory / TIME_FILE)
    if predictor.power_model is None:
        (directory / POWER_FILE).unlink(missing_ok=True)
    else:
        _write_model(predictor.power_model, directory / POWER_FILE)
    cond = predictor.conditions.astype(object).where(predictor.conditions.notna(), None)
    ref = predictor.time_reference
    doc = {
        **predictor.meta,
        "features_version": predictor.schema.version,
        "gpu": predictor.gpu,
        "schema": predictor.schema.to_dict(),
        "columns": predictor.schema.columns(),
        "time_target": "log(time_s)" if ref is None else "log(time_s / t_ref)",
        "time_reference": None if ref is None else asdict(ref),
        "power_target": "power_w" if predictor.power_model is not None else None,
        "conditions": cond.to_dict(orient="records"),
        "training_ranges": predictor.ranges,
    }
    write_json_atomic(directory / FEATURES_FILE, doc, allow_nan=False)
    manifest = {
        "format": "opcost predictor",
        "format_version": FORMAT_VERSION,
        "gpu": {
            "name": predictor.gpu,
            "devices": list(predictor.meta.get("gpu_names", [])),
            "settings": predictor.settings,
            "modes": predictor.modes,
        },
        "dataset": None if dataset is None else _file_entry(Path(dataset), with_path=True),
        "files": {
            name: _file_entry(directory / name)
            for name in PREDICTOR_FILES
            if (directory / name).is_file()
        },
    }
    write_json_atomic(directory / MANIFEST_FILE, manifest)


def _sha256(path: Path) -> tuple[str, int]:
    """The SHA-256 (hex) and size of a file, read in blocks."""
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256")
        return digest.hexdigest(), f.tell()


def _file_entry(path: Path, with_path: bool = False) -> dict[str, Any]:
    """A manifest entry: the file's SHA-256 and size in bytes (and its path if asked)."""
    sha256, size = _sha256(path)
    return {"sha256": sha256, "bytes": size, **({"path": str(path)} if with_path else {})}


def _write_model(model: TreeEnsemble, path: Path) -> None:
    """Save a tree ensemble as an uncompressed ``.npz`` of its arrays (no pickles), which
    ``np.load`` reads.

    Each member's local header is padded (an extra field as Android's ``zipalign``
    writes) so that its array data start at a multiple of 64 bytes: :func:`_npz_arrays`
    then uses them in place. A fixed timestamp makes the same model the same bytes.
    """
    if not isinstance(model, TreeEnsemble):
        raise PredictorError(
            f"{path}: cannot store a {type(model).__name__}; expected a TreeEnsemble"
        )
    write_arrays(model.to_arrays(), path)


def write_arrays(arrays: dict[str, np.ndarray], path: Path) -> None:
    """Save named plain arrays as an uncompressed, aligned ``.npz`` (:func:`_write_model`)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, array, allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            # The .npy header is padded to 64 bytes; the local header is 30 bytes, the
            # name, and the extra field (4 bytes and the padding).
            pad = -(buffer.tell() + 30 + len(info.filename) + 4) % 64
            info.extra = struct.pack("<HH", 0xD935, pad) + bytes(pad)
            archive.writestr(info, member.getvalue())
    write_atomic(path, buffer.getvalue())


def _read_model(data: bytes, path: Path) -> TreeEnsemble:
    """A tree ensemble from the bytes of its ``.npz`` (:func:`_npz_arrays`)."""
    try:
        arrays = _npz_arrays(data)
    except Exception as e:  # zipfile and numpy raise many types for a malformed archive
        raise PredictorError(f"{path}: not an opcost model file ({e}); retrain") from e
    return TreeEnsemble.from_arrays(arrays, str(path))


def _npz_arrays(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an uncompressed ``.npz`` held in ``data``.

    Plain arrays only: a member whose dtype holds objects (which ``np.load`` would
    unpickle with ``allow_pickle=True``) or a compressed member (whose size the file's
    does not bound) is refused. Each array is a read-only view of ``data`` where it lies
    aligned, else a copy: no reading through ``zipfile`` in small blocks.

    Raises:
        ValueError: not such an archive.
    """
    from numpy.lib import format as npy

    readers = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}
    arrays = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"member {info.filename} is compressed")
            local = data[info.header_offset : info.header_offset + 30]
            if len(local) < 30 or local[:4] != b"PK\x03\x04":
                raise ValueError(f"member {info.filename}: no local header")
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            end = start + info.file_size
            header = io.BytesIO(data[start : min(end, start + 65536)])
            version = npy.read_magic(header)
            if version not in readers:
                raise ValueError(f"member {info.filename}: .npy version {version}")
            shape, fortran, dtype = readers[version](header)
            if dtype.hasobject:
                raise ValueError(f"member {info.filename} holds Python objects")
            if any(d < 0 for d in shape):
                raise ValueError(f"member {info.filename}: shape {shape}")
            count = int(np.prod(shape, dtype=np.int64))
            offset = start + header.tell()
            if offset + count * dtype.itemsize > end:
                raise ValueError(f"member {info.filename} is cut short")
            array = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
            if not array.flags.aligned:
                array = array.copy()
                array.flags.writeable = False
            arrays[info.filename.removesuffix(".npy")] = array.reshape(
                shape, order="F" if fortran else "C"
            )
    return arrays


def _read_manifest(directory: Path) -> dict[str, bytes]:
    """The bytes of every file ``manifest.json`` lists, each checked against its SHA-256
    and size; files are read once, so what is parsed is what was checked.

    Raises:
        PredictorError: no or an unreadable manifest, another format version, a listed
            file missing or changed, or a file the loader reads that the manifest does not
            list; the message names the file.
    """
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise PredictorError(
            f"{directory}: no {MANIFEST_FILE} (not trained, interrupted, or from an older "
            "opcost); train the predictors (snakemake results/predictors/<gpu>/"
            f"{MANIFEST_FILE}) or pass --predictors DIR"
        )
    try:
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise PredictorError(f"{path}: not readable JSON ({e}); {RETRAIN}") from e
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version != FORMAT_VERSION:
        raise PredictorError(
            f"{path}: predictor format version {version!r}, this opcost reads "
            f"{FORMAT_VERSION}; {RETRAIN}"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not {FEATURES_FILE, TIME_FILE} <= set(files):
        raise PredictorError(f"{path}: lists no {FEATURES_FILE} and {TIME_FILE}; retrain")
    unknown = sorted(set(files) - set(PREDICTOR_FILES))
    if unknown:
        raise PredictorError(f"{path}: lists an unknown file {unknown[0]!r}; retrain")
    for name in (POWER_FILE, METRICS_FILE):
        if name not in files and (directory / name).exists():
            raise PredictorError(
                f"{directory / name}: not in {MANIFEST_FILE} (added after training); "
                "remove it or retrain the predictor"
            )
    listed = {name: files[name] for name in PREDICTOR_FILES if name in files}
    return read_listed(directory, listed, RETRAIN)


def read_listed(directory: Path, files: dict[str, Any], retrain: str) -> dict[str, bytes]:
    """The bytes of each file a manifest lists (name -> entry with ``sha256`` and
    ``bytes``), each checked against its entry; read once, so what is parsed is what was
    checked. ``retrain`` says what to do about a file that does not match.

    Raises:
        PredictorError: a listed file missing, unreadable or changed, naming it.
    """
    contents = {}
    for name, entry in files.items():
        file = directory / name
        try:
            data = file.read_bytes()
        except OSError as e:
            raise PredictorError(
                f"{file}: listed in {MANIFEST_FILE} but not readable ({e.strerror}); {retrain}"
            ) from e
        expected = entry.get("sha256") if isinstance(entry, dict) else None
        if hashlib.sha256(data).hexdigest() != expected or len(data) != entry.get("bytes"):
            raise PredictorError(
                f"{file}: does not match its SHA-256 in {MANIFEST_FILE} (changed or damaged "
                f"since training); {retrain}"
            )
        contents[name] = data
    return contents


def load_predictor(directory: str | Path) -> Predictor:
    """Load one GPU configuration's predictor and check it.

    Every file ``manifest.json`` lists is read and checked against its SHA-256 first
    (:func:`_read_manifest`); then the checked bytes are parsed, JSON and ``.npz`` of
    plain arrays only, so that loading runs no code from the files.

    Raises:
        PredictorError: a file is missing, changed since training, or unreadable.
        SchemaError: the models' features differ from the schema, or the schema's version
            from this opcost's.
    """
    directory = Path(directory)
    path = directory / FEATURES_FILE
    contents = _read_manifest(directory)
    try:
        doc = json.loads(contents[FEATURES_FILE])
    except ValueError as e:
        raise PredictorError(f"{path}: not readable JSON ({e})") from e
    if not isinstance(doc, dict) or "schema" not in doc:
        raise PredictorError(f"{path}: not a features.json written by opcost train")
    schema = FeatureSchema.from_dict(doc["schema"])
    check_schema(schema, doc.get("columns", []), str(path))
    time_model = _read_model(contents[TIME_FILE], directory / TIME_FILE)
    power_model = None
    if POWER_FILE in contents:
        power_model = _read_model(contents[POWER_FILE], directory / POWER_FILE)
    for name, model in ((TIME_FILE, time_model), (POWER_FILE, power_model)):
        if model is not None:
            check_schema(schema, [str(n) for n in model.feature_names_in_], str(directory / name))
    conditions = pd.DataFrame(doc.get("conditions", []))
    needed = ["setting", "mode", "dtype", "tf32", *CONDITIONS]
    if conditions.empty or any(c not in conditions.columns for c in needed):
        raise PredictorError(f"{path}: no trained settings recorded; retrain")
    conditions = conditions[needed].copy()
    for c in CONDITIONS:
        conditions[c] = pd.to_numeric(conditions[c], errors="coerce").astype("float64")
    conditions["tf32"] = conditions["tf32"].astype(bool)
    meta = {
        k: v
        for k, v in doc.items()
        if k not in {"schema", "columns", "conditions", "training_ranges", "gpu", "time_reference"}
    }
    reference = doc.get("time_reference")
    try:
        time_reference = None if reference is None else TimeReference(**reference)
    except TypeError as e:
        raise PredictorError(f"{path}: time_reference is not readable ({e}); retrain") from e
    return Predictor(
        gpu=str(doc.get("gpu", directory.name)),
        schema=schema,
        time_model=time_model,
        power_model=power_model,
        conditions=conditions,
        ranges=doc.get("training_ranges", {}),
        meta=meta,
        lono_mape_pct=_lono_mape(contents.get(METRICS_FILE)),
        time_reference=time_reference,
    )


def _lono_mape(metrics: bytes | None) -> dict[str, dict[str, float]]:
    """Mode -> criterion -> LONO network MAPE (%) from ``metrics.json``'s bytes; empty if
    absent or unreadable (the errors only qualify a choice, the models predict without
    them)."""
    try:
        networks = json.loads(metrics)["lono"]["network"]
    except (ValueError, KeyError, TypeError):
        return {}
    out: dict[str, dict[str, float]] = {}
    for mode, scores in networks.items() if isinstance(networks, dict) else ():
        if mode not in MODES or not isinstance(scores, dict):
            continue
        values = {
            criterion: float(scores[f"{criterion}_mape_pct"])
            for criterion in ("time", "energy")
            if isinstance(scores.get(f"{criterion}_mape_pct"), int | float)
        }
        if values:
            out[mode] = values
    return out


def load_predictors(root: str | Path) -> dict[str, Predictor]:
    """Every predictor under ``root`` (one subdirectory per GPU configuration).

    Raises:
        PredictorError: ``root`` does not exist or holds no predictor.
    """
    root = Path(root)
    if not root.is_dir():
        raise PredictorError(
            f"{root}: no such predictor directory; train first (snakemake) or pass --predictors DIR"
        )
    # A directory with features.json but no manifest (interrupted, or an older opcost's)
    # is a predictor that load_predictor refuses, saying so.
    marks = (MANIFEST_FILE, FEATURES_FILE)
    dirs = sorted({p.parent for name in marks for p in root.glob(f"*/{name}")})
    if any((root / name).is_file() for name in marks):
        dirs = [root]
    if not dirs:
        raise PredictorError(
            f"{root}: holds no trained predictor (no */{MANIFEST_FILE}); train first "
            "(snakemake) or pass --predictors DIR"
        )
    # On threads: reading and hashing the files release the GIL.
    return {p.gpu: p for p in _starmap_threads(load_predictor, [(d,) for d in dirs])}
