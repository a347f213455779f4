"""``opcost gpus``: which GPU configurations ``opcost predict`` answers for, with their
data and their own error: the op models' held-out error, or the forests'
leave-one-network-out error."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import pandas as pd

from opcost.cli.common import _fmt
from opcost.cli.predict import _op_models, _op_models_heading
from opcost.names import MODES


def cmd_gpus(args: argparse.Namespace) -> int:
    source = _op_models(args)
    return _gpus_forests(args) if source is None else _gpus_op_models(args, source)


def _gpus_op_models(args: argparse.Namespace, source: Any) -> int:
    """The op models' GPU configurations: their data and held-out GPU-time error."""
    from opcost.model.opmodel_format import held_out_scores, load_op_models

    models = load_op_models(source.directory)
    errors = held_out_scores(source.directory)
    rows = []
    for gpu, m in sorted(models.items()):
        scores = errors.get(gpu, {})
        rows.append(
            {
                "gpu": gpu,
                "host_probe_s": m.host_probe_s,
                **m.meta,
                "held_out_gpu_time_median_abs_error_pct": scores.get(
                    "gpu_time_median_abs_error_pct"
                ),
                "held_out_gpu_time_mape_pct": scores.get("gpu_time_mape_pct"),
            }
        )
    if args.format == "json":
        doc = {"source": source.label, "directory": str(source.directory), "gpus": rows}
        print(json.dumps(doc, indent=1))
        return 0
    num = lambda v, d=3: _fmt(math.nan if v is None else float(v), d)  # noqa: E731
    table = pd.DataFrame(
        {
            "gpu": [r["gpu"] for r in rows],
            "device": [r.get("gpu_name", "") for r in rows],
            "tf32": [r.get("tf32", "") for r in rows],
            "driver": [r.get("driver_version", "") for r in rows],
            "torch": [r.get("torch_version", "") for r in rows],
            "measured": [" to ".join(dict.fromkeys(r.get("measured") or [])) for r in rows],
            "samples": [r.get("samples") for r in rows],
            "held_out_pct": [
                f"{num(r['held_out_gpu_time_median_abs_error_pct'], 2)} / "
                f"{num(r['held_out_gpu_time_mape_pct'], 3)}"
                for r in rows
            ],
        }
    )
    print(f"{_op_models_heading(source)}\n")
    print(table.to_string(index=False))
    print(
        "\nheld_out_pct: GPU time per call on sampled ops held out of training, median "
        "|error| / MAPE; 'opcost gpus --forests' lists the thesis's forests"
    )
    return 0


def _gpus_forests(args: argparse.Namespace) -> int:
    from opcost.model.sources import predictor_source, provenance
    from opcost.predict import load_predictors

    source = predictor_source(args.predictors)
    predictors = load_predictors(source.directory)
    rows = [provenance(predictors[gpu]) for gpu in sorted(predictors)]
    if args.format == "json":
        doc = {"source": source.label, "directory": str(source.directory), "gpus": rows}
        print(json.dumps(doc, indent=1))
        return 0

    def lono(r: dict[str, Any], criterion: str) -> str:
        scores = r["lono_mape_pct"]
        return " / ".join(
            _fmt(scores[m][criterion], 3) for m in MODES if criterion in scores.get(m, {})
        )

    table = pd.DataFrame(
        {
            "gpu": [r["gpu"] for r in rows],
            "device": [", ".join(r["devices"]) for r in rows],
            "settings": [",".join(r["settings"]) for r in rows],
            "driver": [", ".join(r["drivers"]) for r in rows],
            "torch": [", ".join(r["torch_versions"]) for r in rows],
            "measured": [" to ".join(dict.fromkeys(r["measured"])) for r in rows],
            "ops": [r["n_ops"] for r in rows],
            "lono_time_pct": [lono(r, "time") for r in rows],
            "lono_energy_pct": [lono(r, "energy") for r in rows],
        }
    )
    print(f"predictors ({source.label}), in {source.directory}:\n")
    print(table.to_string(index=False))
    print("\nlono_*_pct: leave-one-network-out error of whole networks, inference / training")
    return 0
