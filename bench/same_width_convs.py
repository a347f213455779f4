"""How saved op models predict a network stage's same-width 3x3 convolutions (round 28).

    python bench/same_width_convs.py DIR [DIR ...] [--round 28]

``DIR``: op models saved by ``python bench/opspace_model.py ... --save-models DIR`` (e.g.
one fitted on rounds 1-27 and one on rounds 1-28). For each and each of the H100 and the
H200, prints the median signed and absolute error of the predicted GPU time, and the
predicted over measured sum, of the Hopper networks' isolated same-width 3x3
convolutions (``data/hopper`` and ``data/hopper-large``: resnet18's and vgg11's, stride 1
with as many channels out as in, or stride 2 with twice as many) and of their other
convolutions; and of op-space round ``--round``'s configurations as the H200 measured
them. Seconds on two cores.
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
    parser.add_argument("--round", type=int, default=28)
    args = parser.parse_args()
    sampled = pd.read_parquet(om.REPO / f"data/op-space/h200/r{args.round}-0.parquet")
    sampled = sampled[(sampled["status"] == "ok") & (sampled["gpu_time_s"] > 0)]
    for path in args.models:
        models = load_op_models(path)
        print(path)
        for gpu in ("h100", "h200"):
            convs = hopper_convolutions(gpu)
            pred = models[gpu].predict(convs[["spec", "mode", "op_type"]], isolated=True)
            pred = pred["gpu_time_s"].to_numpy()
            measured = convs["gpu_time_s"].to_numpy()
            same = convs["spec"].map(same_width_3x3).to_numpy()
            report(f"{gpu}: Hopper same-width 3x3", pred[same], measured[same])
            report(f"{gpu}: Hopper other convolutions", pred[~same], measured[~same])
        pred = models["h200"].predict(sampled[["spec", "mode", "op_type"]])["gpu_time_s"]
        report(f"h200: round {args.round}'s own", pred.to_numpy(), sampled["gpu_time_s"].to_numpy())


if __name__ == "__main__":
    main()
