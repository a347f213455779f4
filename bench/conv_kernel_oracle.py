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

``--networks`` asks the same of the convolutions of the ten networks in no study
(``tests/data/unseen_networks``, each call's kernels and kernel time from its network's
traced breakdown; its spec from the network extracted here, by call position): both
forests fitted on all of the configuration's samples, the second given each call's
traced kernel count. Prints the median |error| per call and the mean |error| of each
network's convolutions summed, per configuration and mode.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold

from opcost.config import schema_defaults
from opcost.model import base_time, opmodel
from opcost.model import roofline as rl
from opcost.model.features import build_schema
from opcost.model.op_tables import training_rows
from opcost.train import TrainConfig, make_regressor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import opspace_model as om  # noqa: E402
import unseen_networks as un  # noqa: E402

FOLDS = 5


def _load(gpu: str, family: str) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, base_time.GpuBase]:
    """The family's usable samples, their roofline times and base times, and the GPU's
    base-time constants from all its samples."""
    table = training_rows(om.load(gpu))
    table = table[table["gpu_time_s"] > 0]
    base_of = base_time.gpu_base(table)
    rows = table[table["family"] == family].reset_index(drop=True)
    roof = rl.roofline_times_s(list(rows["spec"]), list(rows["mode"]), base_of.ceilings)
    training = (rows["mode"] == "training").to_numpy()
    return rows, roof, base_time.base_time_s(roof, training, base_of.kernel_floor_s), base_of


def _maker(seed: int):
    """A fresh GPU-time forest of the shipped size."""
    model = schema_defaults("op_space", "model")
    cfg = TrainConfig(
        regressor="extra_trees",
        n_estimators=model["n_estimators"],
        min_samples_leaf=model["min_samples_leaf"],
        seed=seed,
    )
    return lambda: make_regressor(cfg, n_jobs=2)


def score(gpu: str, family: str, seed: int) -> list[tuple[str, float, float]]:
    rows, roof, base, _ = _load(gpu, family)
    make = _maker(seed)
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


CONV = "torch.nn.modules.conv.Conv2d"


def network_calls() -> pd.DataFrame:
    """Every traced convolution call of the ten networks: ``gpu``, ``mode``,
    ``model_input``, ``gpu_s`` and ``n_kernels`` (its forward and backward spans summed)
    and ``spec`` (the extracted network's op at that call position)."""
    calls = []
    with tempfile.TemporaryDirectory() as tmp:
        for tarball in sorted((om.REPO / "tests/data/unseen_networks").glob("traces*.tar.gz")):
            with tarfile.open(tarball) as tar:
                tar.extractall(tmp, filter="data")
        for path in sorted(Path(tmp).glob("*/*/*/traces/networks/*.json")):
            r = json.loads(path.read_text())
            if r.get("status") != "ok":
                continue
            spans = pd.DataFrame(r["breakdown"]).dropna(subset=["call"])
            per_call = spans.groupby("call")[["gpu_s", "n_kernels"]].sum().reset_index()
            calls.append(
                per_call.assign(gpu=r["gpu"], mode=r["mode"], model_input=r["model_input"])
            )
    calls = pd.concat(calls, ignore_index=True)
    at = {}
    for name, table in un.op_tables(sorted(calls["model_input"].unique())).items():
        for spec, positions in zip(table["spec"], table["positions"], strict=True):
            at.update({(name, int(p)): spec for p in str(positions).split(",")})
    calls["spec"] = [
        at[(m, int(c))] for m, c in zip(calls["model_input"], calls["call"], strict=True)
    ]
    calls["op_type"] = [json.loads(x)["type"] for x in calls["spec"]]
    return calls[calls["op_type"] == CONV].reset_index(drop=True)


def network_scores(gpu: str, calls: pd.DataFrame, seed: int) -> pd.DataFrame:
    """``calls`` of ``gpu`` with their GPU time predicted from the shapes (``shape``) and
    with their traced kernel count too (``kernels``), by forests on all its samples."""
    rows, roof, base, base_of = _load(gpu, "conv")
    schema = build_schema(rows["op_type"])
    xs = opmodel.features(rows, schema, roof)
    y = np.log(rows["gpu_time_s"].to_numpy() / base)
    make = _maker(seed)
    net = calls[calls["gpu"] == gpu].reset_index(drop=True)
    ops = opmodel._with_conditions(net[["spec", "mode", "op_type"]], {"tf32": "notf32" not in gpu})
    net_roof = rl.roofline_times_s(list(ops["spec"]), list(ops["mode"]), base_of.ceilings)
    training = (ops["mode"] == "training").to_numpy()
    net_base = base_time.base_time_s(net_roof, training, base_of.kernel_floor_s)
    net_x = opmodel.features(ops, schema, net_roof)
    shape = make().fit(xs, y).predict(net_x)
    with_k = make().fit(xs.assign(kernels=np.log1p(rows["n_kernels"].to_numpy(float))), y)
    kernels = with_k.predict(net_x.assign(kernels=np.log1p(net["n_kernels"].to_numpy(float))))
    return net.assign(
        shape=np.maximum(net_base * np.exp(shape), net_roof),
        kernels=np.maximum(net_base * np.exp(kernels), net_roof),
    )


def print_network_scores(t: pd.DataFrame) -> None:
    for name in ("shape", "kernels"):
        t[f"call {name}"] = (t[name] / t["gpu_s"] - 1).abs()
    sums = t.groupby(["gpu", "mode", "model_input"])[["gpu_s", "shape", "kernels"]].sum()
    for name in ("shape", "kernels"):
        sums[f"sum {name}"] = (sums[name] / sums["gpu_s"] - 1).abs()
    per_call = t.groupby(["gpu", "mode"])[["call shape", "call kernels"]].median()
    per_net = sums.groupby(["gpu", "mode"])[["sum shape", "sum kernels"]].mean()
    print("the ten networks' convolutions: median |err| per call, mean |err| of each network's sum")
    print((100 * per_call.join(per_net)).round(1).to_string())
    print(
        f"all {len(t)} calls: per call {100 * t['call shape'].median():.1f} % (shape) against"
        f" {100 * t['call kernels'].median():.1f} % (+ traced kernels); network sums"
        f" {100 * sums['sum shape'].mean():.1f} against {100 * sums['sum kernels'].mean():.1f} %"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gpus", nargs="+")
    ap.add_argument("--family", default="conv")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--networks", action="store_true", help="the ten networks' convolutions")
    args = ap.parse_args()
    if args.networks:
        calls = network_calls()
        print_network_scores(
            pd.concat([network_scores(g, calls, args.seed) for g in args.gpus], ignore_index=True)
        )
        return
    for gpu in args.gpus:
        for name, median, mape in score(gpu, args.family, args.seed):
            print(
                f"{gpu:12s} {args.family:6s} {name:20s} median |err| {100 * median:5.1f} %"
                f"  MAPE {100 * mape:5.1f} %"
            )


if __name__ == "__main__":
    main()
