"""Which op types torchvision's classification networks call that the op space never sampled.

    python bench/op_coverage.py [--op-models results/op-models] [--gpu h200] [--batch 8]
                                [--data data/op-space]

Extracts every classification network of ``torchvision.models.list_models`` at
``batch x 3 x 224 x 224`` (``opcost extract``, on the meta device: seconds, no GPU) and
predicts each op's GPU time in both modes with the op models of ``--gpu``. An op type is
*sampled* when some chunk table under ``--data`` measured it. Prints, per op type that
none did, its family, how many networks call it, its calls, and its share of a network's
predicted GPU time (mean over the networks and modes, and the largest), then the
networks in which such op types take the largest share. The shares come from the models'
own predictions, so an op type they predict too fast weighs too little: a guide to what
the op space should sample next, not an error.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import pandas as pd
import torchvision

from opcost.extract import extract_model_input
from opcost.model.op_spec import family_of
from opcost.model.opmodel_format import load_op_models
from opcost.names import ModelInput

REPO = Path(__file__).resolve().parents[1]


def sampled_types(data: Path) -> set[str]:
    """The op types of every chunk table under ``data`` (``{gpu}/*.parquet``)."""
    return {
        t
        for path in data.glob("*/*.parquet")
        for t in pd.read_parquet(path, columns=["op_type"])["op_type"]
    }


def zoo(batch: int) -> pd.DataFrame:
    """Every torchvision classification network's op table, at ``batch``."""
    tables = []
    with warnings.catch_warnings():  # googlenet's and inception_v3's initialisation notes
        warnings.simplefilter("ignore", FutureWarning)
        for name in torchvision.models.list_models(module=torchvision.models):
            table = extract_model_input(ModelInput(name, (batch, 3, 224, 224)))
            tables.append(table.assign(model=name))
    return pd.concat(tables, ignore_index=True)


def shares(ops: pd.DataFrame, model, sampled: set[str]) -> pd.DataFrame:
    """One row per op type, network and mode: its share of the network's predicted GPU
    time, its calls, and whether the op space sampled it."""
    parts = []
    for mode in ("inference", "training"):
        pred = model.predict(pd.DataFrame({"spec": ops["spec"], "mode": mode}))
        parts.append(
            ops.assign(mode=mode, gpu_s=pred["gpu_time_s"].to_numpy() * ops["count"].to_numpy())
        )
    t = pd.concat(parts, ignore_index=True)
    t["share"] = t["gpu_s"] / t.groupby(["model", "mode"])["gpu_s"].transform("sum")
    t = t.groupby(["type", "model", "mode"], as_index=False).agg(
        share=("share", "sum"), calls=("count", "sum")
    )
    t["sampled"] = t["type"].isin(sampled)
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op-models", type=Path, default=REPO / "results/op-models")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--data", type=Path, default=REPO / "data/op-space")
    args = parser.parse_args()
    model = load_op_models(args.op_models)[args.gpu]
    ops = zoo(args.batch)
    t = shares(ops, model, sampled_types(args.data))
    n_cases = t.groupby(["model", "mode"]).ngroups
    missing = t[~t["sampled"]]
    by_type = missing.groupby("type").agg(
        networks=("model", "nunique"),
        calls=("calls", "sum"),
        mean_share=("share", lambda s: s.sum() / n_cases),
        max_share=("share", "max"),
    )
    by_type.insert(0, "family", by_type.index.map(family_of))
    by_type["calls"] //= 2  # counted once per mode
    print(f"{ops['model'].nunique()} networks at batch {args.batch}, op models of {args.gpu}")
    print("op types the op space never sampled:")
    print(by_type.sort_values("mean_share", ascending=False).round(4).to_string())
    per_net = missing.pivot_table(
        index="model", columns="mode", values="share", aggfunc="sum", fill_value=0.0
    )
    print("share of a network's predicted GPU time in those op types (largest):")
    print(per_net.sort_values("inference", ascending=False).head(12).round(3).to_string())


if __name__ == "__main__":
    main()
