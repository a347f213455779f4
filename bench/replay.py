"""Replay against measurement: prints issue 22's figures for traced datasets.

    python bench/replay.py data/hopper data/hopper-large

For each study directory ({gpu}/dataset/{gpu}.parquet + .breakdown.parquet, ops/*.parquet)
and GPU configuration with traces: per mode, the median and largest |miss| against the
trace job's own timed loop (same host, same run) of the plain sum, the replay from
isolated ops and the replay from the network's own breakdown; the same for the isolated
replay where the GPU sets the pace; and energy against the 1-s window. ``own_burst``: the
own breakdown replayed as one host burst against the bursts' own wall time (the same
steps, so the host's drift cancels; traces made since the bursts record it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from opcost.validate.replay import call_sequences, replay_validation


def table(study: Path) -> pd.DataFrame:
    seqs = call_sequences(sorted((study / "ops").glob("*x*.parquet")))
    out = []
    for d in sorted(p for p in study.iterdir() if (p / "dataset").is_dir()):
        ds = pd.read_parquet(d / "dataset" / f"{d.name}.parquet")
        bd_path = d / "dataset" / f"{d.name}.breakdown.parquet"
        if not bd_path.exists():
            continue
        out.append(replay_validation(ds, seqs, pd.read_parquet(bd_path)))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def miss(pred: pd.Series, ref: pd.Series) -> pd.Series:
    return (pred / ref - 1).abs()


def main() -> None:
    tables = [table(Path(p)) for p in sys.argv[1:] or ["data/hopper", "data/hopper-large"]]
    t = pd.concat(tables, ignore_index=True)
    ref = t["trace_wall_time_s"]
    t["own"] = miss(t["replay_own_time_s"], ref)
    t["own_burst"] = miss(t["replay_own_burst_time_s"], t["burst_wall_time_s"])
    t["iso"] = miss(t["replay_isolated_time_s"], ref)
    t["plain"] = miss(t["plain_sum_trace_wall_time_s"], ref)
    t["plain_window"] = miss(t["plain_sum_time_s"], t["time_s"])
    t["energy_iso"] = miss(t["replay_isolated_energy_j"], t["energy_j"])
    t["energy_plain"] = miss(t["plain_sum_energy_j"], t["energy_j"])
    t["gpu_bound"] = t["gpu_time_s"] >= t["host_time_s"]
    print(f"{len(t)} traced network-mode-configuration cases")
    cols = ["own", "own_burst", "iso", "plain", "plain_window", "energy_iso", "energy_plain"]
    for (gpu, mode), g in t.groupby(["gpu", "mode"]):
        med = "  ".join(f"{c} {g[c].median():6.1%}/{g[c].max():6.1%}" for c in cols)
        print(f"{gpu:12s} {mode:9s} n={len(g):2d} median/max |miss|: {med}")
    for bound, g in t.groupby("gpu_bound"):
        label = "GPU sets the pace" if bound else "host sets the pace"
        med = "  ".join(f"{c} {g[c].median():6.1%}" for c in cols)
        print(f"{label:20s} n={len(g):3d} median |miss|: {med}")
    print(
        f"all                  n={len(t):3d} median |miss|: "
        + "  ".join(f"{c} {t[c].median():6.1%}" for c in cols)
    )
    print(f"own breakdown: {int((t['own'] > 0.10).sum())} of {len(t)} beyond 10 %")
    paired = t["own_burst"].dropna()
    if len(paired):
        print(
            f"own breakdown, one burst against its own wall time: median "
            f"{paired.median():.1%}, {int((paired > 0.10).sum())} of {len(paired)} beyond 10 %"
        )


if __name__ == "__main__":
    main()
