"""Which models answer: those given, the study's own, or those shipped with opcost.

Two kinds, each one subdirectory per GPU configuration: the op models that
``opcost predict`` replays by default (``results/op-models``, :mod:`opcost.model.opmodel`)
and the thesis's forests (``results/predictors``, :mod:`opcost.model.predictor`).

Where no op models are given or at hand, they are built once from the op-space data of
the opcost checkout the package runs from (``data/op-space``) and cached
(:mod:`opcost.model.op_model_cache`): 11 MB a configuration, too large to ship. The
shipped forests (``opcost/predictors/{gpu}``, package data) are built by the pipeline
from the real H100 and H200 measurements in data/ (``snakemake ready_made_predictors``
on the default config): the same files ``rule train`` writes, data only, checked against
their manifest when loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opcost.model import PredictorError
from opcost.model.format import MANIFEST_FILE
from opcost.model.predictor import Predictor

#: The predictors shipped with this opcost.
SHIPPED = Path(__file__).resolve().parents[1] / "predictors"
#: A study's own predictors, relative to its working directory.
STUDY = Path("results/predictors")
#: A study's own op models, relative to its working directory.
STUDY_OP_MODELS = Path("results/op-models")
#: The op-space data of the opcost checkout this package runs from (an editable
#: install), from which op models are built where none are at hand.
CHECKOUT_OP_SPACE = Path(__file__).resolve().parents[3] / "data" / "op-space"


@dataclass(frozen=True)
class PredictorSource:
    """A directory of predictors (one subdirectory per GPU configuration) and what it is."""

    directory: Path
    label: str


def _holds_predictors(directory: Path) -> bool:
    return any(directory.glob(f"*/{MANIFEST_FILE}"))


def predictor_source(given: str | Path | None = None) -> PredictorSource:
    """The forests that answer: ``given`` (``--predictors``), else the study's own
    ``results/predictors`` in the working directory where it holds any, else the shipped.

    Raises:
        PredictorError: none given, none in results/predictors and none shipped.
    """
    if given is not None:
        return PredictorSource(Path(given), str(given))
    if _holds_predictors(STUDY):
        return PredictorSource(STUDY, f"this study's, {STUDY}")
    if _holds_predictors(SHIPPED):
        return PredictorSource(SHIPPED, "shipped with opcost, from the data in data/")
    raise PredictorError(
        f"no predictors: none in {STUDY} and none shipped with this opcost; train them "
        "(snakemake) or pass --predictors DIR"
    )


def op_model_source(
    given: str | Path | None = None, log: Callable[[str], None] = lambda line: None
) -> PredictorSource | None:
    """The op models that answer: ``given`` (``--op-models``), else the study's own
    ``results/op-models`` in the working directory where it holds any, else those built
    from :data:`CHECKOUT_OP_SPACE` (cached; ``log`` says when they are built); None
    where there is no such data (a package installed without its checkout)."""
    if given is not None:
        return PredictorSource(Path(given), str(given))
    if _holds_predictors(STUDY_OP_MODELS):
        return PredictorSource(STUDY_OP_MODELS, f"this study's, {STUDY_OP_MODELS}")
    if not any(CHECKOUT_OP_SPACE.glob("*/*.parquet")):
        return None
    from opcost.model.op_model_cache import cached_op_models

    directory = cached_op_models(CHECKOUT_OP_SPACE, log)
    return PredictorSource(directory, f"built from the op-space data in {CHECKOUT_OP_SPACE}")


def provenance(predictor: Predictor) -> dict[str, Any]:
    """What a predictor was trained on: GPU, driver, CUDA, torch, host CPU, the days
    measured and how many ops, as its ``features.json`` records them."""
    meta = predictor.meta
    return {
        "gpu": predictor.gpu,
        "devices": list(meta.get("gpu_names", [])),
        "drivers": list(meta.get("drivers", [])),
        "torch_versions": list(meta.get("torch_versions", [])),
        "host_cpus": list(meta.get("host_cpus", [])),
        "measured": list(meta.get("measured", [])),
        "settings": list(predictor.settings),
        "modes": list(predictor.modes),
        "n_ops": meta.get("n_ops"),
        "lono_mape_pct": predictor.lono_mape_pct,
    }


def provenance_line(predictor: Predictor) -> str:
    """One line: ``h100: NVIDIA H100 80GB HBM3, driver 580.159.04, torch 2.11.0+cu130,
    measured 2026-11-22 to 2026-11-24, 854 ops``."""
    p = provenance(predictor)
    parts = [", ".join(p["devices"]) or "GPU not recorded"]
    if p["drivers"]:
        parts.append("driver " + ", ".join(p["drivers"]))
    if p["torch_versions"]:
        parts.append("torch " + ", ".join(p["torch_versions"]))
    if p["measured"]:
        first, last = p["measured"]
        parts.append(f"measured {first}" + ("" if first == last else f" to {last}"))
    if p["n_ops"] is not None:
        parts.append(f"{p['n_ops']} ops")
    return f"{predictor.gpu}: " + ", ".join(parts)


def ship(directory: str | Path, dest: str | Path) -> None:
    """Copy a trained predictor (``results/predictors/{gpu}``) to ``dest``: every file its
    manifest lists, then the manifest, after loading it once to check them. ``dest`` is
    replaced whole, so a stale file of an older predictor cannot remain.

    Raises:
        PredictorError: the predictor does not load (load_predictor's checks).
    """
    import json
    import shutil

    from opcost.model.format import load_predictor

    directory, dest = Path(directory), Path(dest)
    load_predictor(directory)
    names = json.loads((directory / MANIFEST_FILE).read_text())["files"]
    staging = dest.with_name(f".{dest.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in [*names, MANIFEST_FILE]:
        shutil.copyfile(directory / name, staging / name)
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
