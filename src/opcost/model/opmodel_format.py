"""The op-model directory's format: save, load and verify (``results/op-models/{gpu}/``).

One GPU configuration's op models (:class:`opcost.model.opmodel.OpModel`) are

* ``op_model.json``: the configuration, its peaks and ceilings, the host-speed probe and
  waiting power of the training data, the replay's constants, per family its feature
  schema and fitted targets, and the provenance of the data;
* ``trees.npz``: every fitted ensemble as plain arrays (members
  ``{family}/{target}/{array}`` and ``power/{array}``), written and read as the
  predictors' model files are (:mod:`opcost.model.format`: no pickles, so loading runs no
  code from the file);
* ``metrics.json``: the held-out errors ``opcost`` measured when training (optional);
* ``manifest.json``, written last: the format version and the SHA-256 and size of every
  other file. Every listed file is checked against it before any is parsed, so an
  interrupted or altered directory never loads::

    save_op_model(model, "results/op-models/h100", sources=chunk_files)
    models = load_op_models("results/op-models")   # GPU configuration -> OpModel
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from opcost.io import write_json_atomic
from opcost.model import PredictorError, shapes
from opcost.model import roofline as rl
from opcost.model.features import FeatureSchema, check_schema
from opcost.model.format import _file_entry, _npz_arrays, read_listed, write_arrays
from opcost.model.op_power import power_columns
from opcost.model.opmodel import LOG_ROOFLINE, FamilyModel, OpModel
from opcost.model.trees import TreeEnsemble, _starmap_threads

MODEL_FILE = "op_model.json"
TREES_FILE = "trees.npz"
METRICS_FILE = "metrics.json"
MANIFEST_FILE = "manifest.json"
#: Files a manifest may list; the first two it must.
FILES = (MODEL_FILE, TREES_FILE, METRICS_FILE)
FORMAT = "opcost op model"
#: 2: GPU time learnt over a base time with the shortest kernel (``kernel_floor_s``);
#: 3: busy power learnt as its log.
FORMAT_VERSION = 3
#: The member prefix of the busy-power ensemble in ``trees.npz``.
POWER = "power"
RETRAIN = "retrain it (snakemake -f results/op-models/<gpu>/manifest.json)"


def save_op_model(
    model: OpModel,
    directory: str | Path,
    *,
    sources: list[str | Path] = (),
    metrics: dict[str, Any] | None = None,
) -> None:
    """Write ``op_model.json``, ``trees.npz``, ``metrics.json`` (if given) and, last,
    ``manifest.json``, which records ``sources`` (the measured tables) with their SHA-256.
    Until the manifest is written the directory holds none, so a half-written model never
    loads."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MANIFEST_FILE).unlink(missing_ok=True)
    arrays: dict[str, np.ndarray] = {}
    families = {}
    for name, fam in sorted(model.families.items()):
        if "/" in name:
            raise PredictorError(f"op family name {name!r} cannot be stored")
        for target, ens in sorted(fam.fits.items()):
            arrays |= {f"{name}/{target}/{k}": a for k, a in _arrays(ens, name).items()}
        families[name] = {
            "schema": fam.schema.to_dict(),
            "targets": sorted(fam.fits),
            "ranges": {k: list(v) for k, v in sorted(fam.ranges.items())},
        }
    if model.power_fit is not None:
        arrays |= {f"{POWER}/{k}": a for k, a in _arrays(model.power_fit, POWER).items()}
    write_arrays(arrays, directory / TREES_FILE)
    doc = {
        "gpu": model.gpu,
        "peaks": model.peaks.to_dict(),
        "ceilings": model.ceilings.to_dict(),
        "host_probe_s": model.host_probe_s,
        "wait_power_w": model.wait_power_w,
        "sync_s": model.sync_s,
        "kernel_gap_s": model.kernel_gap_s,
        "kernel_floor_s": model.kernel_floor_s,
        "leaf_overhead_ratio": model.leaf_overhead_ratio,
        "backward_node_ratio": model.backward_node_ratio,
        "families": families,
        "power_families": list(model.power_families),
        "meta": model.meta,
    }
    write_json_atomic(directory / MODEL_FILE, doc, allow_nan=False)
    if metrics is None:
        (directory / METRICS_FILE).unlink(missing_ok=True)
    else:
        write_json_atomic(directory / METRICS_FILE, metrics, allow_nan=False)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "gpu": model.gpu,
        "sources": [_file_entry(Path(p), with_path=True) for p in sources],
        "files": {n: _file_entry(directory / n) for n in FILES if (directory / n).is_file()},
    }
    write_json_atomic(directory / MANIFEST_FILE, manifest)


def _arrays(ensemble: Any, where: str) -> dict[str, np.ndarray]:
    if not isinstance(ensemble, TreeEnsemble):
        raise PredictorError(
            f"{where}: cannot store a {type(ensemble).__name__}; expected a TreeEnsemble"
        )
    return ensemble.to_arrays()


def _checked_files(directory: Path) -> dict[str, bytes]:
    """The bytes of every file the manifest lists, each checked against its SHA-256."""
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise PredictorError(
            f"{directory}: no {MANIFEST_FILE} (not trained, or interrupted); train the op "
            f"models (snakemake op_models) or pass another --op-models DIR"
        )
    try:
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise PredictorError(f"{path}: not readable JSON ({e}); {RETRAIN}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PredictorError(f"{path}: not an op model's manifest ({FORMAT!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise PredictorError(
            f"{path}: op model format version {manifest.get('format_version')!r}, this "
            f"opcost reads {FORMAT_VERSION}; {RETRAIN}"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not {MODEL_FILE, TREES_FILE} <= set(files):
        raise PredictorError(f"{path}: lists no {MODEL_FILE} and {TREES_FILE}; {RETRAIN}")
    unknown = sorted(set(files) - set(FILES))
    if unknown:
        raise PredictorError(f"{path}: lists an unknown file {unknown[0]!r}; {RETRAIN}")
    return read_listed(directory, files, RETRAIN)


def load_op_model(directory: str | Path) -> OpModel:
    """One GPU configuration's op models, checked (module docstring).

    Raises:
        PredictorError: a file missing, changed since training or malformed.
        SchemaError: a family's ensembles do not take its schema's features.
    """
    directory = Path(directory)
    contents = _checked_files(directory)
    path = directory / MODEL_FILE
    try:
        doc = json.loads(contents[MODEL_FILE])
        peaks = rl.Peaks(**doc["peaks"])
        ceilings = rl.Peaks(**doc["ceilings"])
        family_docs = dict(doc["families"])
    except (ValueError, KeyError, TypeError) as e:
        raise PredictorError(f"{path}: not an op model written by opcost ({e!r})") from e
    try:
        arrays = _npz_arrays(contents[TREES_FILE])
    except Exception as e:  # zipfile and numpy raise many types for a malformed archive
        raise PredictorError(f"{directory / TREES_FILE}: not an opcost model file ({e})") from e
    members: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    for key, array in arrays.items():
        prefix, _, name = key.rpartition("/")
        members[prefix][name] = array
    families = {}
    for name, fam in family_docs.items():
        schema = FeatureSchema.from_dict(fam["schema"])
        # The encoding's version: another opcost's features are refused.
        check_schema(schema, schema.columns(), f"{path} ({name})")
        columns = [*schema.columns(), *shapes.SHAPE_FEATURES, LOG_ROOFLINE]
        fits = {}
        for target in fam["targets"]:
            where = f"{directory / TREES_FILE} ({name}/{target})"
            if f"{name}/{target}" not in members:
                raise PredictorError(f"{where}: missing; {RETRAIN}")
            ens = TreeEnsemble.from_arrays(members[f"{name}/{target}"], where)
            if [str(c) for c in ens.feature_names_in_] != columns:
                raise PredictorError(f"{where}: other features than its schema's; {RETRAIN}")
            fits[target] = ens
        ranges = {str(k): (float(v[0]), float(v[1])) for k, v in fam.get("ranges", {}).items()}
        families[str(name)] = FamilyModel(schema, fits, ranges)
    power = None
    if POWER in members:
        where = f"{directory / TREES_FILE} (power)"
        power = TreeEnsemble.from_arrays(members[POWER], where)
        expected = power_columns(tuple(doc.get("power_families", ())))
        if [str(c) for c in power.feature_names_in_] != expected:
            raise PredictorError(f"{where}: other features than this opcost's; {RETRAIN}")
    return OpModel(
        gpu=str(doc.get("gpu", directory.name)),
        peaks=peaks,
        ceilings=ceilings,
        host_probe_s=float(doc["host_probe_s"]),
        wait_power_w=float(doc["wait_power_w"]),
        families=families,
        power_families=tuple(doc.get("power_families", ())),
        power_fit=power,
        meta=dict(doc.get("meta", {})),
        sync_s=float(doc.get("sync_s", 0.0)),
        kernel_gap_s=float(doc.get("kernel_gap_s", 0.0)),
        kernel_floor_s=float(doc["kernel_floor_s"]),
        leaf_overhead_ratio=float(doc.get("leaf_overhead_ratio", 0.0)),
        backward_node_ratio=float(doc.get("backward_node_ratio", 0.0)),
    )


def _model_dirs(root: Path) -> list[Path]:
    """The op-model directories under ``root``: ``root`` itself where it holds one, else
    its subdirectories that do (a manifest or a model file marks one)."""
    marks = (MANIFEST_FILE, MODEL_FILE)
    if any((root / m).is_file() for m in marks):
        return [root]
    return sorted({p.parent for m in marks for p in root.glob(f"*/{m}")})


def load_op_models(root: str | Path) -> dict[str, OpModel]:
    """Every op model under ``root`` (one subdirectory per GPU configuration, or ``root``
    itself).

    Raises:
        PredictorError: ``root`` does not exist or holds no op model.
    """
    root = Path(root)
    if not root.is_dir():
        raise PredictorError(
            f"{root}: no such op-model directory; train first (snakemake op_models)"
        )
    dirs = _model_dirs(root)
    if not dirs:
        raise PredictorError(
            f"{root}: holds no op model (no */{MANIFEST_FILE}); train first (snakemake op_models)"
        )
    return {m.gpu: m for m in _starmap_threads(load_op_model, [(d,) for d in dirs])}


def held_out_scores(root: str | Path) -> dict[str, dict[str, Any]]:
    """Per GPU configuration under ``root`` (as :func:`load_op_models` finds them), the
    held-out errors over all families its ``metrics.json`` records (``all``); a
    configuration without one is left out."""
    out = {}
    for directory in _model_dirs(Path(root)):
        path = directory / METRICS_FILE
        try:
            scores = json.loads(path.read_bytes()).get("all")
            gpu = json.loads((directory / MODEL_FILE).read_bytes()).get("gpu", directory.name)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(scores, dict):
            out[str(gpu)] = scores
    return out
