"""Leave-one-network-out: the thesis's plain sum of predicted op times against a replay of
predicted per-op host and GPU times (opcost.replay), per GPU configuration and mode.

    python bench/replay_lono.py [GPU ...]     # after `snakemake` on the default config

For each network of the shipped data (data/hopper, data/hopper-large), forests are fitted
on the traced ops of the other networks (time, GPU kernel time, host time and kernels per
iteration, the pipeline's features), the network's ops are predicted, and its step is
(a) the sum of its calls' predicted times, (b) a replay of its calls in extraction order
(training: each call's forward and backward as one step), both against the measured
network (``time_s`` of results/dataset/{gpu}.parquet). Prints MAPE and median signed
error, split by whether the measured network's GPU or host sets the pace.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from opcost import replay as rp
from opcost.model.features import build_schema, encode_features
from opcost.train import TrainConfig, make_regressor, op_rows
from opcost.validate.replay import call_sequences

REPO = Path(__file__).resolve().parents[1]
#: Kernel-free ops (views) have no GPU time: the log of GPU time is taken of this more.
EPS_S = 1e-7
CONDITIONS = ("dtype", "tf32", "sm_clock_mhz", "mem_clock_mhz", "power_limit_w")


def lono(gpu: str, cfg: TrainConfig) -> pd.DataFrame:
    dataset = pd.read_parquet(REPO / f"results/dataset/{gpu}.parquet")
    rows = op_rows(dataset)
    rows = rows[rows["gpu_time_s"].notna() & rows["host_time_s"].notna()]
    networks = dataset[dataset["kind"] == "network"]
    paths = sorted(REPO.glob("data/hopper*/ops/*_*.parquet"))
    sequences = call_sequences(paths)
    tables = {pd.read_parquet(p, columns=["model_input"])["model_input"].iloc[0]: p for p in paths}
    out = []
    for name, path in sorted(tables.items()):
        table = pd.read_parquet(path).drop_duplicates("op_id")
        train = rows[~rows["op_id"].isin(set(table["op_id"]))]
        schema = build_schema(train["op_type"], derived=cfg.derived)
        x = encode_features(train, schema)
        targets = {
            "time": np.log(train["time_s"]),
            "gpu": np.log(train["gpu_time_s"] + EPS_S),
            "host": np.log(train["host_time_s"]),
            "kernels": np.log1p(train["n_kernels"]),
        }
        fits = {k: make_regressor(cfg).fit(x, y.to_numpy()) for k, y in targets.items()}
        gap_s, sync_s = float(train["launch_gap_s"].median()), float(train["sync_s"].median())
        seq = sequences[name]
        for mode in ("inference", "training"):
            ops = table[["op_id", "spec"]].assign(mode=mode, setting="default")
            measured_ops = train[train["mode"] == mode].iloc[0]
            for c in CONDITIONS:
                ops[c] = measured_ops[c]
            xo = encode_features(ops, schema)
            p = pd.DataFrame({k: f.predict(xo) for k, f in fits.items()}, index=ops["op_id"])
            time_s, host_s = np.exp(p["time"]), np.exp(p["host"])
            gpu_s = (np.exp(p["gpu"]) - EPS_S).clip(lower=0)
            kernels = np.expm1(p["kernels"]).clip(lower=0)
            replayed = rp.replay(
                list(host_s[seq]),
                list(gpu_s[seq]),
                list(kernels[seq]),
                kernel_gap_s=gap_s,
                sync_s=sync_s,
                repeats=8,
            )
            net = networks[(networks["model_input"] == name) & (networks["mode"] == mode)].iloc[0]
            out.append(
                {
                    "gpu": gpu,
                    "network": name,
                    "mode": mode,
                    "gpu_sets_pace": bool(net["gpu_time_s"] >= net["host_time_s"]),
                    "plain": float(time_s[seq].sum()) / net["time_s"] - 1,
                    "replay": replayed.time_s / net["time_s"] - 1,
                }
            )
    return pd.DataFrame(out)


def main() -> None:
    gpus = sys.argv[1:] or ["h100", "h200", "h100-notf32", "h200-notf32"]
    cfg = TrainConfig(n_estimators=100, min_samples_leaf=3)
    t = pd.concat([lono(gpu, cfg) for gpu in gpus], ignore_index=True)

    def line(label: str, g: pd.DataFrame) -> str:
        cols = "  ".join(
            f"{c} MAPE {100 * g[c].abs().mean():5.1f} % median {100 * g[c].median():+6.1f} %"
            for c in ("plain", "replay")
        )
        return f"{label:28s} n={len(g):3d}  {cols}"

    for (gpu, mode), g in t.groupby(["gpu", "mode"], sort=False):
        print(line(f"{gpu} {mode}", g))
    for pace, g in t.groupby("gpu_sets_pace"):
        print(line("GPU sets the pace" if pace else "host sets the pace", g))
    print(line("all", t))


if __name__ == "__main__":
    main()
