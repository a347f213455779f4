"""The cuDNN kernels of the op space's dense 3x3 convolutions with TF32 off, as recorded on
an H100 (tests/data/conv_algos), against the op space's measurements of the same
configurations: every one that beats the FP32 units' peak ran by FFT."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
#: The H100's FP32 peak, TFLOPS: no direct convolution runs faster.
FP32_PEAK_TFLOPS = 67.0


def test_every_convolution_faster_than_the_fp32_peak_ran_by_fft() -> None:
    kernels = pd.read_csv(REPO / "tests/data/conv_algos/conv_algos_h100.csv.gz")
    fft = kernels["kernel"].str.contains("fft|cf32|complex", regex=True)
    by_fft = kernels.assign(fft=fft).pivot_table(
        index="op_id", columns="mode", values="fft", aggfunc="any"
    )
    assert len(by_fft) == 489
    assert by_fft["inference"].sum() == 121
    chunks = ("r8-0", "r11-0", "r11-1")
    measured = pd.concat(
        [pd.read_parquet(REPO / f"data/op-space/h100-notf32/{c}.parquet") for c in chunks]
    )
    inference = measured[measured["mode"] == "inference"].groupby("op_id")
    spec = inference["spec"].first().map(json.loads)
    shape = spec.map(lambda s: s["inputs"][0]["shape"])
    attrs = spec.map(lambda s: s["attrs"])
    flops = [
        2.0 * x[0] * a["in_channels"] * a["out_channels"] * 9 * x[2] * x[3]
        for x, a in zip(shape, attrs, strict=True)
    ]
    tflops = pd.Series(flops, index=spec.index) / inference["gpu_time_s"].mean() / 1e12
    fast = tflops[tflops > FP32_PEAK_TFLOPS].index
    assert len(fast) == 12
    assert by_fft.loc[fast, "inference"].all()
    assert by_fft.loc[tflops.index.difference(fast), "inference"].mean() < 0.25
