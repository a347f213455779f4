"""GPU time a peer measured, carried over to a configuration's own GPU through the
samples both measured.

A configuration's op models also learn from the samples only a *peer* measured (the
same numerics on another GPU, :func:`opcost.model.op_tables.peers_of`). Learnt against
the peer's own base time (its ceilings and shortest kernel), such a sample carries over
only what the two base times tell apart, and they depend on which samples each GPU
measured as much as on the GPUs: a peer that measured more fast convolutions has higher
ceilings. The samples both measured tell the ratio directly. Per family, a regressor
learns ``log(own GPU time / peer GPU time)`` from those pairs, on the family's features
of the peer's sample (:func:`transfer`); each sample only the peer measured then enters
the models as the own GPU's, its GPU times (``TIME_COLUMNS``) scaled by its predicted
ratio, learnt against the own base time. A family with fewer than :data:`MIN_PAIRS`
pairs keeps the peer's base time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from opcost.model.features import build_schema
from opcost.model.op_tables import sample_keys

#: Pairs (samples both GPUs measured, in one mode) a family needs for its ratio model.
MIN_PAIRS = 20
#: The GPU times a carried-over sample has scaled: its ratios to each other (the forward
#: share, the busy share) stay its own.
TIME_COLUMNS = ("gpu_time_s", "forward_gpu_time_s", "gpu_busy_time_s")


def pairs(pooled: pd.DataFrame, own: str, peer: str) -> pd.DataFrame:
    """The samples both ``own`` and ``peer`` (GPU names) measured with kernels: the peer's
    row of each, with the column ``log_ratio`` = ``log(own GPU time / peer GPU time)``."""
    g = pooled["gpu_time_s"].astype(float)
    usable = pooled[g.gt(0)]
    mine = usable[usable["gpu_name"].astype(str) == own]
    theirs = usable[usable["gpu_name"].astype(str) == peer]
    own_time = pd.Series(mine["gpu_time_s"].to_numpy(float), index=sample_keys(mine).to_numpy())
    own_time = own_time[~own_time.index.duplicated()]
    keys = sample_keys(theirs).to_numpy()
    both = np.isin(keys, own_time.index)
    out = theirs[both].copy()
    out["log_ratio"] = np.log(own_time.loc[keys[both]].to_numpy() / out["gpu_time_s"].to_numpy())
    return out.drop_duplicates(subset=["op_id", "mode"])


def transfer(
    pooled: pd.DataFrame,
    own: str,
    make: Callable[[], Any],
    features: Callable[[pd.DataFrame, Any], pd.DataFrame],
) -> tuple[pd.DataFrame, dict[str, dict[str, float]]]:
    """``pooled`` (:func:`opcost.model.op_tables.pooled_rows`) with each row the
    configuration learns from (``_train``) that a peer of GPU ``own``'s name measured
    carried over to ``own`` (module docstring): GPU times scaled, ``gpu_name`` set to
    ``own``. ``features(rows, schema)``: a family's feature matrix (the time model's).
    Also returns, per family carried over, ``{"pairs": n, "median_ratio": r}``."""
    out = pooled.copy()
    names = out["gpu_name"].astype(str)
    summary: dict[str, dict[str, float]] = {}
    for peer in sorted(set(names) - {own}):
        fresh = out["_train"].astype(bool) & (names == peer)
        for family in sorted(set(out.loc[fresh, "family"])):
            fam = out["family"] == family
            known = pairs(out[fam], own, peer)
            if len(known) < MIN_PAIRS:
                continue
            sel = fresh & fam
            schema = build_schema(pd.concat([known["op_type"], out.loc[sel, "op_type"]]))
            regressor = make().fit(features(known, schema), known["log_ratio"].to_numpy())
            if "n_jobs" in regressor.get_params():
                # A forest predicting on threads sums its trees in whichever order they
                # finish; the carried-over times are training targets, so the same data
                # must give the same models bit for bit.
                regressor.set_params(n_jobs=1)
            ratio = np.exp(regressor.predict(features(out[sel], schema)))
            for column in TIME_COLUMNS:
                if column in out:
                    out.loc[sel, column] = out.loc[sel, column].astype(float) * ratio
            out.loc[sel, "gpu_name"] = own
            summary[f"{family}<-{peer}"] = {
                "pairs": len(known),
                "median_ratio": float(np.exp(np.median(known["log_ratio"]))),
            }
    return out, summary
