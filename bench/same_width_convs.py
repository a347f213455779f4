"""How saved op models predict a network stage's same-width 3x3 convolutions (rounds 28-29).

    python bench/same_width_convs.py DIR [DIR ...] [--gpus h100 h200 ...] [--round R]

``DIR``: op models saved by ``python bench/opspace_model.py ... --save-models DIR`` (e.g.
one fitted on rounds 1-28 and one on rounds 1-29). For each and each GPU configuration
of ``--gpus`` (default: all four), prints the median signed and absolute error of the
predicted GPU time, and the predicted over measured sum, of the Hopper networks' isolated
same-width 3x3 convolutions (``data/hopper`` and ``data/hopper-large``: resnet18's and
vgg11's, stride 1 with as many channels out as in, or stride 2 with twice as many) and of
their other convolutions; and of the configurations of op-space round ``--round`` as the
H200 measured them (default: round 28 with TF32 on, round 29 with TF32 off, generator
12's two rounds). Seconds on two cores.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import opspace_model as om  # noqa: E402

from opcost.model.opmodel_format import load_op_models  # noqa: E402


def same_width_3x3(spec: str) -> bool:
    """Generator 12's convolution: dense 3x3, 32 channels or more, as many out as in at
    stride 1 or twice as many at stride 2."""
    a = json.loads(spec)["attrs"]
    cin, cout, stride = a["in_channels"], a["out_channels"], a["stride"][0]
    doubles = stride == 2 and cout == 2 * cin
    keeps = stride == 1 and cout == cin
    return a["groups"] == 1 and a["kernel_size"][0] == 3 and cin >= 32 and (keeps or doubles)


def hopper_convolutions(gpu: str) -> pd.DataFrame:
    """The Hopper studies' isolated convolutions measured on ``gpu``."""
    tables = []
    for study in om.STUDIES:
        d = pd.read_parquet(om.REPO / f"data/{study}/{gpu}/dataset/{gpu}.parquet")
        tables.append(d[(d["kind"] == "op") & d["gpu_time_s"].notna()])
    d = pd.concat(tables, ignore_index=True)
    return d[d["op_type"].str.endswith("Conv2d")].reset_index(drop=True)


def report(label: str, predicted: np.ndarray, measured: np.ndarray) -> None:
    e = predicted / measured - 1
    print(f"  {label:42s} n={len(e):4d}  median signed {100 * np.median(e):+5.1f} %  "
          f"|error| {100 * np.median(np.abs(e)):4.1f} %  "
          f"sum {predicted.sum() / measured.sum():.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--gpus", nargs="+", default=["h100", "h200", "h100-notf32", "h200-notf32"])
    parser.add_argument("--round", type=int, help="default: 28 with TF32 on, 29 off")
    args = parser.parse_args()
    for path in args.models:
        models = load_op_models(path)
        print(path)
        for gpu in args.gpus:
            convs = hopper_convolutions(gpu)
            pred = models[gpu].predict(convs[["spec", "mode", "op_type"]], isolated=True)
            pred = pred["gpu_time_s"].to_numpy()
            measured = convs["gpu_time_s"].to_numpy()
            same = convs["spec"].map(same_width_3x3).to_numpy()
            report(f"{gpu}: Hopper same-width 3x3", pred[same], measured[same])
            report(f"{gpu}: Hopper other convolutions", pred[~same], measured[~same])
        for h200 in [g for g in args.gpus if g.startswith("h200")]:
            off = h200.endswith("-notf32")
            round_ = args.round or (29 if off else 28)
            sampled = pd.read_parquet(om.REPO / f"data/op-space/{h200}/r{round_}-0.parquet")
            sampled = sampled[(sampled["status"] == "ok") & (sampled["gpu_time_s"] > 0)]
            pred = models[h200].predict(sampled[["spec", "mode", "op_type"]], isolated=True)
            pred = pred["gpu_time_s"]
            report(
                f"{h200}: round {round_}'s own", pred.to_numpy(), sampled["gpu_time_s"].to_numpy()
            )


if __name__ == "__main__":
    main()
