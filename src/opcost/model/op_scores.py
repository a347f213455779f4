"""Held-out scores of a GPU configuration's op models: a share of its sampled
configurations left out of a second fit (:func:`opcost.model.opmodel.fit`) and predicted
by it, for ``metrics.json`` and the op-models log (:mod:`opcost.op_models_job`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from opcost.model import op_power
from opcost.model.op_tables import training_rows
from opcost.model.opmodel import fit


def held_out_errors(
    table: pd.DataFrame,
    gpu: str,
    make: Any,
    *,
    twin: pd.DataFrame | None = None,
    peers: pd.DataFrame | None = None,
    fraction: float = 0.2,
    seed: int = 0,
) -> dict[str, Any]:
    """Errors on sampled configurations held out of training: ``fraction`` of the op ids
    (random, ``seed``) left out, the models fitted on the rest (of ``twin`` and ``peers``
    too: a configuration a peer measured is held out there as well). Per family and overall:
    ``n`` held-out rows with kernels, the median |error| and MAPE (%) of the GPU time per
    call, and the median |error| of the host time per call; under ``busy_power``, the
    median |error| and MAPE (%) of the busy power of the held-out power windows
    (:func:`opcost.model.op_power.busy_power_errors`), per family and overall."""
    ids = np.asarray(sorted(table["op_id"].astype(str).unique()))
    hold = set(np.random.default_rng(seed).choice(ids, int(len(ids) * fraction), replace=False))
    held = table["op_id"].astype(str).isin(hold)
    test = training_rows(table[held])
    test = test[test["gpu_time_s"] > 0]
    if test.empty:
        return {"held_out_fraction": fraction, "families": {}}

    def rest(other: pd.DataFrame | None) -> pd.DataFrame | None:
        return None if other is None else other[~other["op_id"].astype(str).isin(hold)]

    model = fit(table[~held], gpu, make, twin=rest(twin), peers=rest(peers))
    pred = model.predict(test[["spec", "mode", "op_type"]], isolated=True)
    gpu_err = pred["gpu_time_s"].to_numpy() / test["gpu_time_s"].to_numpy() - 1.0
    host_err = pred["host_time_s"].to_numpy() / test["host_time_s"].to_numpy() - 1.0

    def scores(sel: np.ndarray) -> dict[str, float]:
        g, h = np.abs(gpu_err[sel]), np.abs(host_err[sel])
        return {
            "n": int(sel.sum()),
            "gpu_time_median_abs_error_pct": float(100 * np.median(g)),
            "gpu_time_mape_pct": float(100 * np.mean(g)),
            "host_time_median_abs_error_pct": float(100 * np.median(h)),
        }

    family = test["family"].to_numpy()
    out = {
        "held_out_fraction": fraction,
        "seed": seed,
        "all": scores(np.ones(len(test), dtype=bool)),
        "families": {str(f): scores(family == f) for f in sorted(set(family))},
    }
    power = op_power.busy_power_errors(model, test) if model.power_fit is not None else None
    if power is not None and len(power):

        def power_scores(e: pd.Series) -> dict[str, float]:
            a = e.abs()
            return {
                "n": int(len(e)),
                "median_abs_error_pct": float(100 * a.median()),
                "mape_pct": float(100 * a.mean()),
            }

        out["busy_power"] = {
            "all": power_scores(power["err"]),
            "families": {str(f): power_scores(g["err"]) for f, g in power.groupby("family")},
        }
    return out
