"""Convolutions measured again on an H200 with cuDNN's heuristics
(`tests/data/grouped_conv_benchmark`) against the op space's own measurements of them:
the op space measures with the heuristics, and they choose the same kernels every time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opcost.model.shapes import grouped_conv

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "grouped_conv_benchmark"


@pytest.mark.parametrize(
    ("record", "gpu", "n"),
    [
        ("h200_off.csv.gz", "h200", 600),
        ("dense_h200_off.csv.gz", "h200", 400),
        ("dense_h200-notf32_off.csv.gz", "h200-notf32", 400),
    ],
)
def test_the_heuristics_repeat_the_op_spaces_kernels_and_times(record, gpu, n) -> None:
    off = pd.read_csv(DATA / record)
    off = off[off["op_id"] != "regnet_y_800mf"].set_index("op_id")
    files = sorted((ROOT / "data" / "op-space" / gpu).glob("*.parquet"))
    cols = ["op_id", "mode", "gpu_time_s", "n_kernels"]
    space = pd.concat([pd.read_parquet(f, columns=cols) for f in files])
    space = space[space["mode"] == "inference"].drop_duplicates("op_id").set_index("op_id")
    both = off.merge(space, left_index=True, right_index=True, suffixes=("_again", ""))
    assert len(both) == len(off) == n
    ratio = (both["gpu_time_s_again"] / both["gpu_time_s"]).astype(float)
    assert np.abs(np.log(ratio)).median() < 0.02
    assert (both["n_kernels_again"] == both["n_kernels"]).all()


def test_every_recorded_convolution_is_grouped() -> None:
    off = pd.read_csv(DATA / "h200_off.csv.gz")
    for spec in off["spec"]:
        attrs = json.loads(spec)["attrs"]
        by_hand = 1 < attrs["groups"] < attrs["in_channels"]
        assert grouped_conv(spec) == by_hand
        assert by_hand
