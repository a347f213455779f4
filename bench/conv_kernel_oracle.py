"""How much of the op models' convolution error is cuDNN's choice of kernels.

Per GPU configuration, the configuration's own op-space samples of one family
(``--family``, default ``conv``), 5-fold cross-validated by op id, a GPU-time forest of
the shipped size on the op models' features (:func:`opcost.model.opmodel.features`,
target ``log(GPU time / base time)``) is scored three ways:

* ``shape``: the features as shipped;
* ``+ measured kernels``: also each sample's measured kernel count (``log1p``), which no
  prediction has: how much knowing the kernels cuDNN runs would give;
* ``+ predicted kernels``: also the kernel count predicted from the features, out of
  fold within the training folds: whether a model can learn that choice from the shape.

Prints the median |error| and MAPE of the GPU time per row; no pooling with the peer
GPU, so the figures sit a little above the bench's (bench/opspace_model.py)::

    python bench/conv_kernel_oracle.py h100 h200 h100-notf32 h200-notf32 [--seed S]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold

from opcost.config import schema_defaults
from opcost.model import opmodel
from opcost.model import roofline as rl
from opcost.model.features import build_schema
from opcost.model.op_tables import training_rows
from opcost.train import TrainConfig, make_regressor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import opspace_model as om  # noqa: E402

FOLDS = 5


def _load(gpu: str, family: str) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The family's usable samples, their roofline times and base times."""
    table = training_rows(om.load(gpu))
    table = table[table["gpu_time_s"] > 0]
    base_of = opmodel.gpu_base(table)
    rows = table[table["family"] == family].reset_index(drop=True)
    roof = rl.roofline_times_s(list(rows["spec"]), list(rows["mode"]), base_of.ceilings)
    training = (rows["mode"] == "training").to_numpy()
    return rows, roof, opmodel.base_time_s(roof, training, base_of.kernel_floor_s)


def score(gpu: str, family: str, seed: int) -> list[tuple[str, float, float]]:
    rows, roof, base = _load(gpu, family)
    model = schema_defaults("op_space", "model")
    cfg = TrainConfig(
        regressor="extra_trees",
        n_estimators=model["n_estimators"],
        min_samples_leaf=model["min_samples_leaf"],
        seed=seed,
    )
    make = lambda: make_regressor(cfg, n_jobs=2)  # noqa: E731
    xs = opmodel.features(rows, build_schema(rows["op_type"]), roof)
    y = np.log(rows["gpu_time_s"].to_numpy() / base)
    kernels = np.log1p(rows["n_kernels"].to_numpy(dtype=float))
    groups = rows["op_id"].to_numpy()
    folds = list(GroupKFold(FOLDS).split(xs, y, groups))
    out = []
    for name in ("shape", "+ measured kernels", "+ predicted kernels"):
        pred = np.zeros(len(y))
        for train, test in folds:
            x_train, x_test = xs.iloc[train].copy(), xs.iloc[test].copy()
            if name == "+ measured kernels":
                x_train["kernels"], x_test["kernels"] = kernels[train], kernels[test]
            elif name == "+ predicted kernels":
                inner = np.zeros(len(train))
                for i_train, i_test in GroupKFold(FOLDS).split(x_train, groups=groups[train]):
                    fitted = make().fit(x_train.iloc[i_train], kernels[train][i_train])
                    inner[i_test] = fitted.predict(x_train.iloc[i_test])
                x_test["kernels"] = make().fit(x_train, kernels[train]).predict(x_test)
                x_train["kernels"] = inner
            pred[test] = make().fit(x_train, y[train]).predict(x_test)
        err = np.abs(np.exp(pred - y) - 1)
        out.append((name, float(np.median(err)), float(err.mean())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gpus", nargs="+")
    ap.add_argument("--family", default="conv")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for gpu in args.gpus:
        for name, median, mape in score(gpu, args.family, args.seed):
            print(
                f"{gpu:12s} {args.family:6s} {name:20s} median |err| {100 * median:5.1f} %"
                f"  MAPE {100 * mape:5.1f} %"
            )


if __name__ == "__main__":
    main()
