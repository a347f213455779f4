"""An experiment, not the shipped predictor: LONO error when the time forest learns time
relative to a roofline estimate instead of time itself.

    python bench/roofline_target.py [--flops-per-s 1e14] [--bytes-per-s 2e12] [--launch-s 5e-6]

A random forest predicts no value beyond those it was trained on, so a network whose ops
are heavier than all others (vgg11 at batch 64) is predicted far short when it is left
out. Here the forest fits ``log(time_s / t_ref)`` with ``t_ref = max(flops / F, bytes_moved
/ B) + launch`` (the op's derived features), and a prediction is ``t_ref`` times the
forest's output: the trees learn an efficiency, and size enters through ``t_ref``. Power
is fitted as in ``opcost.train``. Prints the LONO table of ``bench/accuracy.py`` for the
studies at batch 64 and at batch 1 and 8, H100 and H200, TF32 on (about 5 minutes on 2
cores). Results: docs/validation.md.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from accuracy import REPO, lono_summary

import opcost.predict as predict
import opcost.train as train

STUDIES = (
    ("hopper-large", "h100"),
    ("hopper-large", "h200"),
    ("hopper", "h100"),
    ("hopper", "h200"),
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flops-per-s", type=float, default=1e14)
    parser.add_argument("--bytes-per-s", type=float, default=2e12)
    parser.add_argument("--launch-s", type=float, default=5e-6)
    args = parser.parse_args(argv)

    def t_ref(x: pd.DataFrame) -> np.ndarray:
        compute = x["flops"].to_numpy() / args.flops_per_s
        memory = x["bytes_moved"].to_numpy() / args.bytes_per_s
        return np.maximum(compute, memory) + args.launch_s

    plain_fit = train.fit_predictor

    def fit(rows, cfg, gpu, n_jobs=None):
        # The shipped fit on time relative to the estimate: it fits log(time_s / t_ref).
        x = train.encode_features(rows, train.build_schema(rows["op_type"], derived=True))
        return plain_fit(rows.assign(time_s=rows["time_s"].to_numpy() / t_ref(x)), cfg, gpu, n_jobs)

    plain = predict.Predictor._predict_features

    def predict_features(self, x):
        out = plain(self, x)
        out["time_pred_s"] = out["time_pred_s"] * t_ref(x)
        out["energy_pred_j"] = out["time_pred_s"] * out["power_pred_w"]
        return out

    train.fit_predictor = fit
    predict.Predictor._predict_features = predict_features
    for study, gpu in STUDIES:
        config = REPO / f"config/{study}.yaml"
        table, _ = lono_summary(
            REPO / f"tests/data/{study}/{gpu}", gpu, config, REPO / f"tests/data/{study}/ops"
        )
        print(f"\n{study} {gpu}, time relative to the roofline estimate")
        print(table.to_string(index=False), flush=True)


if __name__ == "__main__":
    main()
