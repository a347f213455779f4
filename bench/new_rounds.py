"""What later op-space rounds add, scored on the same held-out samples of the rounds before.

    python bench/new_rounds.py [GPU ...] --rounds 18 19 20 21 [--seed 0]

Per GPU configuration (default: the four of ``data/op-space``), 20 % of the op ids of
the rounds before ``--rounds`` (at random, seed 0, as ``bench/opspace_model.py`` draws
them; a configuration of ``--rounds`` that an earlier round sampled counts as the
earlier round's) are held out; the op models are fitted on the rest twice, without and with the
configurations of ``--rounds`` (wherever they were measured: the configuration's own
tables, its TF32 twin's and its peers', as ``snakemake op_models`` reads them), and
predict the held-out GPU time. Both fits see the same held-out samples, whichever GPU
measured the new rounds, so the difference is what the rounds add. Prints the median
|error| over all held-out samples and over the held-out convolutions, and the median
signed error of the held-out dense convolutions on the maps of an ImageNet network's
stages (224 halved) and on other maps, and the median |error| of the held-out grouped
convolutions of 8 groups or more and of fewer. ``--seed`` seeds
the forests. A few minutes on two cores.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import opspace_model as om  # noqa: E402

from opcost.model import op_tables  # noqa: E402

GPUS = ("h100", "h200", "h100-notf32", "h200-notf32")


def round_ids(rounds: list[int]) -> set[str]:
    """The op ids the samples tables of ``rounds`` hold (``data/op-space``; round 1:
    ``samples.parquet``)."""
    ids: set[str] = set()
    for r in rounds:
        ids |= set(pd.read_parquet(om.samples_path(r))["op_id"])
    return ids


def new_ids(rounds: list[int]) -> set[str]:
    """The op ids of ``rounds`` that no round before them sampled (a configuration may
    repeat an earlier round's)."""
    return round_ids(rounds) - round_ids(list(range(1, min(rounds))))


def scores(gpu: str, new: set[str]) -> dict[str, dict[str, float]]:
    """Median |error| (%) of the held-out GPU time, all and convolutions, without and with
    the op ids ``new``."""
    whole = om.load(gpu)
    before = whole[~whole["op_id"].isin(new)]
    ids = before["op_id"].unique()
    hold = set(np.random.default_rng(0).choice(ids, len(ids) // 5, replace=False))
    test = op_tables.training_rows(before[before["op_id"].isin(hold)])
    test = test[test["gpu_time_s"] > 0]
    twin, peers = om.sources(gpu, pool=True)
    out = {}
    for name, drop in (("without", hold | new), ("with", hold)):
        rest = lambda t: None if t is None else t[~t["op_id"].isin(drop)]  # noqa: B023, E731
        model = om.fit(rest(whole), gpu, om.maker("extra_trees"), rest(twin), rest(peers))
        pred = model.predict(test[["spec", "mode", "op_type"]], isolated=True)["gpu_time_s"]
        pred = pred.to_numpy()
        signed = pd.Series(pred / test["gpu_time_s"].to_numpy() - 1, index=test.index)
        err = signed.abs()
        conv = test["family"].eq("conv")
        staged = test["spec"].map(on_stage_map)
        groups = test["spec"].map(grouped_groups)
        many = groups.ge(MANY_GROUPS)
        few = groups.gt(0) & ~many
        out[name] = {
            "all": 100 * err.median(),
            "conv": 100 * err[conv].median(),
            "n": len(err),
            "n_conv": int(conv.sum()),
            "staged": 100 * signed[staged.eq(True)].median(),
            "other": 100 * signed[staged.eq(False)].median(),
            "n_staged": int(staged.eq(True).sum()),
            "n_other": int(staged.eq(False).sum()),
            "many": 100 * err[many].median(),
            "few": 100 * err[few].median(),
            "n_many": int(many.sum()),
            "n_few": int(few.sum()),
        }
    return out


#: The maps of an ImageNet network's stages: 224 halved.
STAGE_MAPS = (224, 112, 56, 28, 14, 7)


def on_stage_map(spec: str) -> bool | None:
    """For a dense convolution's spec, whether its map is one of :data:`STAGE_MAPS`;
    None for any other op."""
    s = json.loads(spec)
    attrs = s.get("attrs", {})
    if attrs.get("groups") != 1 or "kernel_size" not in attrs:
        return None
    return int(s["inputs"][0]["shape"][2]) in STAGE_MAPS


#: A grouped convolution of this many groups or more is scored apart: cuDNN runs some of
#: these as one kernel and others as one kernel per group (generator 10).
MANY_GROUPS = 8


def grouped_groups(spec: str) -> int:
    """For a grouped convolution's spec (neither dense nor depthwise), its number of
    groups; 0 for any other op."""
    attrs = json.loads(spec).get("attrs", {})
    groups = attrs.get("groups", 1)
    return groups if 1 < groups < attrs.get("in_channels", 0) else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpus", nargs="*", default=list(GPUS))
    parser.add_argument("--rounds", type=int, nargs="+", required=True)
    parser.add_argument("--seed", type=int, default=om.SEED)
    args = parser.parse_args()
    om.SEED = args.seed
    new = new_ids(args.rounds)
    rounds = ", ".join(map(str, args.rounds))
    for gpu in args.gpus:
        s = scores(gpu, new)
        w, n = s["without"], s["with"]
        print(
            f"{gpu:12s} held out {w['n']} ({w['n_conv']} convolutions): median |err| "
            f"{w['all']:.1f} -> {n['all']:.1f} %, convolutions {w['conv']:.1f} -> "
            f"{n['conv']:.1f} % (without -> with rounds {rounds}); dense convolutions on the "
            f"maps of 224 halved ({w['n_staged']}), median signed {w['staged']:+.1f} -> "
            f"{n['staged']:+.1f} %, on other maps ({w['n_other']}) {w['other']:+.1f} -> "
            f"{n['other']:+.1f} %; grouped convolutions of {MANY_GROUPS} groups or more "
            f"({w['n_many']}) {w['many']:.1f} -> {n['many']:.1f} %, of fewer ({w['n_few']}) "
            f"{w['few']:.1f} -> {n['few']:.1f} %",
            flush=True,
        )


if __name__ == "__main__":
    main()
