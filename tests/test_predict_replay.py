"""Tests for opcost.predict_replay: call order from extraction's positions, the training
step's forward-then-reversed-backward entries, and a network's time and energy against a
timeline computed by hand from the op models' per-op predictions."""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opcost.model import PredictorError, opmodel
from opcost.predict_replay import (
    call_sequence,
    gradient_sum_entries,
    replay_networks,
    step_entries,
)
from opcost.replay import GRAPH_KERNEL_GAP_S
from opcost.train import TrainConfig, make_regressor

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model() -> opmodel.OpModel:
    files = sorted(glob.glob(str(ROOT / "data" / "op-space" / "h100" / "*.parquet")))
    t = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    t = t.groupby("family", group_keys=False).head(40).reset_index(drop=True)
    make = lambda: make_regressor(TrainConfig(regressor="extra_trees", n_estimators=5), n_jobs=1)  # noqa: E731
    return opmodel.fit(t, "h100", make)


@pytest.fixture(scope="module")
def network() -> pd.DataFrame:
    """Two ops of resnet18 (a convolution and a ReLU) called conv, relu, conv."""
    ops = pd.read_parquet(ROOT / "data" / "hopper" / "ops" / "resnet18_8x3x224x224.parquet")
    conv = ops[ops["type"].str.endswith("Conv2d")].iloc[0]
    relu = ops[ops["type"].str.endswith("ReLU")].iloc[0]
    return pd.DataFrame(
        {
            "model_input": "toy",
            "op_id": [conv["op_id"], relu["op_id"]],
            "spec": [conv["spec"], relu["spec"]],
            "count": [2, 1],
            "positions": ["0,2", "1"],
        }
    )


def test_call_sequence_follows_positions(network: pd.DataFrame) -> None:
    conv, relu = network["op_id"]
    assert call_sequence(network) == [conv, relu, conv]
    with pytest.raises(PredictorError, match="no call order"):
        call_sequence(network.drop(columns="positions"))


def test_training_step_is_forward_then_reversed_backward() -> None:
    pred = pd.DataFrame(
        {
            "host_time_s": [10.0, 4.0],
            "forward_host_time_s": [3.0, 1.0],
            # The stream is busy for the kernels' union: a's overlap (half their sum).
            "gpu_time_s": [16.0, 2.0],
            "forward_gpu_time_s": [4.0, 0.5],
            "gpu_busy_time_s": [8.0, 2.0],
            "forward_gpu_busy_time_s": [2.0, 0.5],
            "n_kernels": [3.0, 2.0],
            "forward_n_kernels": [1.0, 1.0],
        },
        index=["a", "b"],
    )
    steps = step_entries(["a", "b"], pred, training=True)
    assert list(steps["op_id"]) == ["a", "b", "b", "a"]
    assert list(steps["phase"]) == ["forward", "forward", "backward", "backward"]
    assert list(steps["host"]) == [3.0, 1.0, 3.0, 7.0]
    assert list(steps["gpu"]) == [2.0, 0.5, 1.5, 6.0]
    # Kernels that take the device's gap: a's forward kernel of 2 ms busy in 4, its
    # backward's two in 6 of 12; b's run one after another.
    assert list(steps["n"]) == [0.5, 1.0, 1.0, 1.0]
    inference = step_entries(["a", "b", "a"], pred, training=False)
    assert list(inference["host"]) == [10.0, 4.0, 10.0]
    # Without graph busy times, a graph's entries take the busy times.
    assert list(steps["graph"]) == list(steps["gpu"])
    graphed = pred.assign(graph_busy_time_s=[4.0, 1.0], forward_graph_busy_time_s=[1.0, 0.5])
    steps = step_entries(["a", "b"], graphed, training=True)
    assert list(steps["graph"]) == [1.0, 0.5, 0.5, 3.0]
    assert list(steps["gpu"]) == [2.0, 0.5, 1.5, 6.0]


def test_replay_matches_a_hand_timeline(model: opmodel.OpModel, network: pd.DataFrame) -> None:
    result = replay_networks({"h100": model}, network, modes=["inference"])
    row = result.table.iloc[0]
    p = model.predict(network[["spec"]].assign(mode="inference"))
    h, k = p["host_time_s"].to_numpy(), p["n_kernels"].to_numpy()
    g = p["gpu_busy_time_s"].to_numpy()  # the stream's busy time, at most the kernels' sum
    assert (g <= p["gpu_time_s"].to_numpy()).all()
    gap = model.kernel_gap_s
    # Calls conv (0), relu (1), conv (0): the GPU starts a call's kernels when the host has
    # issued it and the stream is free.
    host_done, gpu_done = 0.0, 0.0
    for i in (0, 1, 0):
        host_done += h[i]
        gpu_done = max(gpu_done, host_done) + g[i] + k[i] * gap
    time_s = max(host_done, gpu_done) + model.sync_s
    assert row["time_s"] == pytest.approx(time_s, rel=1e-12)
    assert row["host_time_s"] == pytest.approx(2 * h[0] + h[1], rel=1e-12)
    gpu_s = 2 * g[0] + g[1]
    busy_w = p["busy_power_w"].to_numpy()
    energy = 2 * g[0] * busy_w[0] + g[1] * busy_w[1] + model.wait_power_w * (time_s - gpu_s)
    assert row["energy_j"] == pytest.approx(energy, rel=1e-12)
    assert row["power_w"] == pytest.approx(energy / time_s, rel=1e-12)
    assert row["bound"] == ("gpu" if row["gpu_busy_s"] >= row["host_time_s"] else "host")
    assert row["n_ops"] == 2
    assert row["n_calls"] == 3
    # From a CUDA graph the host issues nothing: the kernels run back to back, a graph's
    # gap apart, each call for its busy time from a graph, and the GPU waits only in the
    # gaps.
    gg = p["graph_busy_time_s"].to_numpy()
    assert (gg <= g).all()
    graph_s = 2 * (gg[0] + k[0] * GRAPH_KERNEL_GAP_S) + gg[1] + k[1] * GRAPH_KERNEL_GAP_S
    assert row["graph_time_s"] == pytest.approx(graph_s, rel=1e-12)
    graph_gpu_s = 2 * gg[0] + gg[1]
    graph_j = (
        2 * gg[0] * busy_w[0] + gg[1] * busy_w[1] + model.wait_power_w * (graph_s - graph_gpu_s)
    )
    assert row["graph_energy_j"] == pytest.approx(graph_j, rel=1e-12)
    assert row["graph_time_s"] <= row["time_s"]


def test_a_faster_host_shortens_only_host_time(model, network: pd.DataFrame) -> None:
    base = replay_networks({"h100": model}, network, modes=["training"]).table.iloc[0]
    fast = replay_networks(
        {"h100": model}, network, modes=["training"], host_probe_s=model.host_probe_s / 2
    ).table.iloc[0]
    assert fast["host_time_s"] == pytest.approx(base["host_time_s"] / 2, rel=1e-12)
    assert fast["gpu_busy_s"] == pytest.approx(base["gpu_busy_s"], rel=1e-12)
    assert fast["time_s"] <= base["time_s"]
    assert fast["time_s"] >= max(fast["host_time_s"], fast["gpu_busy_s"])


def test_best_configuration_is_the_fastest(model, network: pd.DataFrame) -> None:
    slow = opmodel.OpModel(**{**model.__dict__, "gpu": "slow", "kernel_gap_s": 1e-3})
    result = replay_networks({"h100": model, "slow": slow}, network, modes=["inference"])
    best = result.best.set_index("criterion")
    assert best.loc["time", "gpu"] == "h100"
    assert best.loc["time", "runner_up_gpu"] == "slow"
    times = result.table.set_index("gpu")["time_s"]
    assert best.loc["time", "margin"] == pytest.approx(times["slow"] / times["h100"] - 1)
    assert np.isnan(best.loc["time", "lono_mape_pct"])


def test_an_op_beyond_the_sampled_sizes_is_listed_with_them(model, network) -> None:
    from opcost import opspace
    from opcost import spec as specs
    from opcost.predict_replay import OUTSIDE_SIZES

    # A 1x1 convolution on a 1x1 map (squeeze-and-excitation): m = 1, below every sample.
    params = {
        "batch": 1, "cin": 960, "cout": 240, "kernel": 1, "stride": 1, "dilation": 1,
        "groups": 1, "spatial": 1, "bias": True, "channels_last": False,
    }  # fmt: skip
    se = opspace.build("conv", params)
    row = {"model_input": "toy", "op_id": specs.op_id(se), "spec": specs.canonical_json(se),
           "count": 1, "positions": "3"}  # fmt: skip
    result = replay_networks({"h100": model}, pd.concat([network, pd.DataFrame([row])]))
    flags = result.extrapolation.set_index("op_id")["reason"]
    assert list(flags.index) == [row["op_id"]]  # resnet18's conv and ReLU are inside
    assert flags.iloc[0].startswith(OUTSIDE_SIZES + "gemm_m 1 (sampled ")
    assert int(result.table["n_extrapolated"].iloc[0]) == 1


def test_a_networks_gradient_sums_lengthen_its_backward_pass_only(
    model: opmodel.OpModel, network: pd.DataFrame
) -> None:
    """Where the network's calls take a tensor twice, autograd sums its gradients in the
    backward pass (opcost.model.grad_sums): the ReLU's output here, 2 adds of 1 MB a
    training step. Each add reads two gradients and writes one at the GPU's memory rate,
    takes at least its shortest kernel, and costs the host a backward node; inference
    does not change, nor do the forward entries."""
    relu = network["op_id"].iloc[1]
    summed = network.assign(
        grad_sum_adds=[0.0, 2.0], grad_sum_bytes=[0.0, 2.0e6], backward_share=[1.0, 1.0]
    )
    extra = gradient_sum_entries(summed, model, host_probe_s=1e-3)
    add_s = model.kernel_floor_s + 3.0 * 1e6 / model.peaks.memory_bytes_per_s
    assert extra.loc[relu, "gpu"] == pytest.approx(2 * add_s, rel=1e-12)
    assert extra.loc[relu, "graph"] == extra.loc[relu, "gpu"]
    assert extra.loc[relu, "n"] == 2.0
    assert extra.loc[relu, "host"] == pytest.approx(2 * model.backward_node_ratio * 1e-3)
    assert extra.loc[network["op_id"].iloc[0]].tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert gradient_sum_entries(network, model, 1e-3) is None
    pred = model.predict(network[["spec"]].assign(mode="training"))
    pred.index = network["op_id"]
    seq = call_sequence(network)
    plain = step_entries(seq, pred, training=True)
    steps = step_entries(seq, pred, training=True, backward_extra=extra)
    forward = (steps["phase"] == "forward").to_numpy()
    pd.testing.assert_frame_equal(steps[forward], plain[forward])
    # Backward order conv, relu, conv: the ReLU's backward entry carries the sums.
    added = (
        steps.loc[~forward, ["host", "gpu", "n", "graph"]]
        - plain.loc[~forward, ["host", "gpu", "n", "graph"]]
    )
    assert list(steps.loc[~forward, "op_id"]) == [
        network["op_id"].iloc[0],
        relu,
        network["op_id"].iloc[0],
    ]
    assert added.iloc[1].tolist() == pytest.approx(
        extra.loc[relu, ["host", "gpu", "n", "graph"]].tolist()
    )
    assert (added.iloc[[0, 2]].to_numpy() == 0).all()
    both = replay_networks({"h100": model}, summed).table.set_index("mode")
    base = replay_networks({"h100": model}, network).table.set_index("mode")
    assert both.loc["inference", "graph_time_s"] == base.loc["inference", "graph_time_s"]
    grown = both.loc["training", "graph_time_s"] - base.loc["training", "graph_time_s"]
    assert grown == pytest.approx(2 * add_s + 2 * GRAPH_KERNEL_GAP_S, rel=1e-9)
    # A call that runs no backward pass (none of its outputs needs a gradient) keeps its
    # forward entry and loses its backward one.
    masked = network.assign(grad_sum_adds=0.0, grad_sum_bytes=0.0, backward_share=[1.0, 0.0])
    steps = step_entries(
        seq, pred, training=True, backward_extra=gradient_sum_entries(masked, model, 1e-3)
    )
    pd.testing.assert_frame_equal(steps[forward], plain[forward])
    cols = ["host", "gpu", "n", "graph"]
    assert (steps.loc[~forward, cols].iloc[1] == 0).all()
    pd.testing.assert_frame_equal(
        steps.loc[~forward, cols].iloc[[0, 2]], plain.loc[~forward, cols].iloc[[0, 2]]
    )


def _conv_row(position: int, **params) -> dict:
    from opcost import opspace
    from opcost import spec as specs

    base = {"batch": 8, "cin": 64, "cout": 64, "kernel": 3, "stride": 1, "dilation": 1,
            "groups": 1, "spatial": 28, "bias": False, "channels_last": False}  # fmt: skip
    op = opspace.build("conv", {**base, **params})
    return {"model_input": "toy", "op_id": specs.op_id(op), "spec": specs.canonical_json(op),
            "count": 1, "positions": str(position)}  # fmt: skip


def test_grouped_convolutions_share_of_the_gpu_time(model, network) -> None:
    from opcost.model.shapes import grouped_conv

    grouped = _conv_row(3, groups=4)
    depthwise = _conv_row(4, groups=64)
    net = pd.concat([network, pd.DataFrame([grouped, depthwise])], ignore_index=True)
    conv, relu = network["spec"]
    assert grouped_conv(grouped["spec"])
    assert not grouped_conv(depthwise["spec"])
    assert not grouped_conv(conv)
    assert not grouped_conv(relu)
    row = replay_networks({"h100": model}, net, modes=["inference"]).table.iloc[0]
    busy = model.predict(net[["spec"]].assign(mode="inference"))["gpu_busy_time_s"].to_numpy()
    # Calls: resnet18's conv twice, its ReLU, the grouped and the depthwise conv once each.
    total = 2 * busy[0] + busy[1] + busy[2] + busy[3]
    assert row["grouped_conv_share"] == pytest.approx(busy[2] / total, rel=1e-12)
    assert 0 < row["grouped_conv_share"] < 1
    alone = replay_networks({"h100": model}, network, modes=["inference"]).table.iloc[0]
    assert alone["grouped_conv_share"] == 0.0


def test_the_output_is_less_sure_where_grouped_convolutions_hold_the_time() -> None:
    from opcost.cli.predict import _grouped_conv_line

    below = pd.DataFrame({"gpu": ["a", "b"], "grouped_conv_share": [0.05, 0.19]})
    assert _grouped_conv_line("inference", below) is None
    above = below.assign(grouped_conv_share=[0.1, 0.3])
    line = _grouped_conv_line("training", above)
    assert line.startswith("less sure, training: grouped convolutions are 10-30 % of the")
