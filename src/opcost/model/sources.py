"""Which predictors answer: those given, the study's own, or those shipped with opcost.

The shipped predictors (``opcost/predictors/{gpu}``, package data) are built by the
pipeline from the real H100 and H200 measurements in data/ (``snakemake
ready_made_predictors`` on the default config): the same files ``rule train`` writes,
data only, checked against their manifest when loaded.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class PredictorSource:
    """A directory of predictors (one subdirectory per GPU configuration) and what it is."""

    directory: Path
    label: str


def _holds_predictors(directory: Path) -> bool:
    return any(directory.glob(f"*/{MANIFEST_FILE}"))


def predictor_source(given: str | Path | None = None) -> PredictorSource:
    """The predictors that answer: ``given`` (``--predictors``), else the study's own
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
