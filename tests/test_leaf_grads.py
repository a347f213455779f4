"""Tests for opcost.model.leaf_grads: which leaf inputs' gradients an op measured alone in
training copies, checked by hand on toy ops (PyTorch's AccumulateGrad rules) and against
the backward kernels the committed op-space samples ran (data/op-space, H100 and H200)."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opcost import spec as specs
from opcost.model import leaf_grads, opmodel
from opcost.train import TrainConfig, make_regressor

DATA = Path(__file__).resolve().parents[1] / "data" / "op-space"


def _function(name: str, shapes: list[list[int]], *, tuple_args: bool = False, **kwargs) -> str:
    tensors = [{"__tensor__": i} for i in range(len(shapes))]
    args = [{"__tuple__": tensors}] if tuple_args else tensors
    inputs = [{"dtype": "float32", "param": False, "shape": s} for s in shapes]
    spec = {"args": args, "inputs": inputs, "kind": "function", "kwargs": kwargs, "type": name}
    return specs.canonical_json(spec)


def test_a_gradient_handed_on_or_laid_out_otherwise_is_copied_one_computed_is_kept():
    # add hands the output's gradient, which the harness holds, to both inputs: 2 copies
    # of 2x3 float32 (24 bytes each).
    assert leaf_grads.copied_leaves(_function("torch.add", [[2, 3], [2, 3]])) == (2, 48)
    # mul computes each input's gradient afresh: AccumulateGrad keeps it.
    assert leaf_grads.copied_leaves(_function("torch.mul", [[2, 3], [2, 3]])) == (0, 0)
    # cat along the channels hands each input a slice of the gradient whose strides are
    # not the input's (2x3 and 2x5 of a 2x8 gradient): both copied, (6 + 10) * 4 bytes.
    cat = _function("torch.cat", [[2, 3], [2, 5]], tuple_args=True, dim=1)
    assert leaf_grads.copied_leaves(cat) == (2, 64)
    # Along the first dimension each slice is contiguous, strided as its input: kept.
    cat0 = _function("torch.cat", [[2, 3], [4, 3]], tuple_args=True, dim=0)
    assert leaf_grads.copied_leaves(cat0) == (0, 0)
    # A module's parameters are leaves in a network too: not counted.
    conv = opmodel_conv_spec()
    assert leaf_grads.copied_leaves(conv) == (0, 0)


def opmodel_conv_spec() -> str:
    import torch

    from opcost.extract import extract_ops

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=True)

        def forward(self, x):
            return self.conv(x)

    (found,) = extract_ops(Net(), (2, 3, 8, 8))
    return specs.canonical_json(found)


def test_copy_time_is_the_bytes_read_and_written_at_the_memory_rate_plus_a_kernel_each():
    # 2 copies of 1 MB at 1 TB/s: 2 * 2 MB / 1e12 B/s = 4 us, plus 2 floors of 1 us.
    assert leaf_grads.copy_time_s(2, 2e6, 1e12, 1e-6) == pytest.approx(6e-6)
    assert leaf_grads.copy_time_s(0, 0, 1e12, 1e-6) == 0


@pytest.fixture(scope="module")
def training_samples() -> pd.DataFrame:
    files = [
        f for gpu in ("h100", "h200") for f in sorted(glob.glob(str(DATA / gpu / "*.parquet")))
    ]
    table = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    table = table[(table["mode"] == "training") & (table["status"] == "ok")]
    kinds = ("torch.Tensor.add", "torch.Tensor.add_", "torch.cat", "torch.Tensor.contiguous")
    table = table[table["op_type"].isin(kinds)]
    # An add that broadcasts (generator 21's scores plus a position bias) reduces the
    # gradient of its broadcast input: a kernel of its own, not a copy.
    shapes = table["spec"].map(lambda s: {str(t["shape"]) for t in json.loads(s)["inputs"]})
    broadcast = table["op_type"].str.startswith("torch.Tensor.add") & (shapes.map(len) > 1)
    return table[~broadcast].reset_index(drop=True)


def test_the_samples_backward_kernels_are_their_gradient_copies(training_samples):
    # add, cat and contiguous compute no gradient of their own: every kernel of their
    # backward pass, as the op space traced it, is a copy AccumulateGrad made.
    assert set(training_samples["op_type"].str.rsplit(".", n=1).str[-1]) == {
        "add", "add_", "cat", "contiguous"
    }  # fmt: skip
    assert len(training_samples) > 700
    backward = training_samples["n_kernels"] - training_samples["forward_n_kernels"]
    copies = training_samples["spec"].map(lambda s: leaf_grads.copied_leaves(s)[0])
    assert (backward.to_numpy() == copies.to_numpy()).all()
    assert set(copies) >= {0, 1, 2, 3, 4}


def test_large_copies_run_at_the_measured_memory_rate(training_samples):
    # The backward pass of an add of 50 MB or more: two copies, read and written once at
    # the GPU's measured memory rate (peak_memory_bytes_per_s, recorded with the samples).
    adds = training_samples[training_samples["op_type"].str.endswith(("add", "add_"))]
    found = adds["spec"].map(leaf_grads.copied_leaves)
    nbytes = found.map(lambda f: f[1]).to_numpy(dtype=float)
    large = nbytes >= 50e6
    assert large.sum() >= 10
    backward = (adds["gpu_time_s"] - adds["forward_gpu_time_s"]).to_numpy()[large]
    copy_s = leaf_grads.copy_time_s(
        2, nbytes[large], adds["peak_memory_bytes_per_s"].to_numpy()[large], 1e-6
    )
    assert 0.95 < np.median(backward / copy_s) < 1.2


def test_a_network_call_runs_no_gradient_copy_an_isolated_one_does():
    round_1 = sorted(glob.glob(str(DATA / "h200" / "[0-9]*.parquet")))
    table = pd.concat([pd.read_parquet(f) for f in round_1])
    rows = table[table["family"].isin(["elementwise", "conv"])].reset_index(drop=True)
    make = lambda: make_regressor(TrainConfig(regressor="extra_trees", n_estimators=10), n_jobs=1)  # noqa: E731
    m = opmodel.fit(rows, "h200", make)
    add = _function("torch.add", [[64, 256, 56, 56], [64, 256, 56, 56]])
    ops = pd.DataFrame({"spec": [add, add], "mode": ["training", "inference"]})
    alone = m.predict(ops, isolated=True)
    in_net = m.predict(ops)
    train = alone.index[0]
    # Its isolated backward pass is its two copies: in a network it runs no kernel, and
    # the call takes its forward pass's time.
    backward_k = alone.loc[train, "n_kernels"] - alone.loc[train, "forward_n_kernels"]
    assert backward_k == pytest.approx(2, abs=0.5)
    assert in_net.loc[train, "gpu_time_s"] == alone.loc[train, "forward_gpu_time_s"]
    assert in_net.loc[train, "gpu_time_s"] < alone.loc[train, "gpu_time_s"]
    assert in_net.loc[train, "n_kernels"] == pytest.approx(
        max(alone.loc[train, "n_kernels"] - 2, alone.loc[train, "forward_n_kernels"])
    )
    # Inference runs no backward pass; a table carrying the copies gives the same.
    pd.testing.assert_series_equal(in_net.iloc[1], alone.iloc[1])
    carried = m.predict(
        ops.assign(leaf_grad_copies=[2, 2], leaf_grad_copy_bytes=[2 * 64 * 256 * 56 * 56 * 4] * 2)
    )
    assert carried.loc[train, "gpu_time_s"] == pytest.approx(in_net.loc[train, "gpu_time_s"])


def test_a_broadcast_add_keeps_the_reduction_its_backward_computes():
    # Adding a 1x8x64x64 bias to 64x8x64x64 scores: the full input's gradient is the
    # output's, copied alone; the bias's is a sum over the batch, a kernel a network runs
    # too. Its backward keeps that kernel and all but the copy's time.
    round_1 = sorted(glob.glob(str(DATA / "h200" / "[0-9]*.parquet")))
    table = pd.concat([pd.read_parquet(f) for f in round_1])
    rows = table[table["family"].isin(["elementwise"])].reset_index(drop=True)
    make = lambda: make_regressor(TrainConfig(regressor="extra_trees", n_estimators=10), n_jobs=1)  # noqa: E731
    m = opmodel.fit(rows, "h200", make)
    add = _function("torch.add", [[64, 8, 64, 64], [1, 8, 64, 64]])
    assert leaf_grads.copied_leaves(add) == (1, 64 * 8 * 64 * 64 * 4)
    ops = pd.DataFrame({"spec": [add], "mode": ["training"]})
    alone, in_net = m.predict(ops, isolated=True).iloc[0], m.predict(ops).iloc[0]
    assert alone["n_kernels"] - alone["forward_n_kernels"] == pytest.approx(2, abs=0.5)
    copy_s = leaf_grads.copy_time_s(
        1, 64 * 8 * 64 * 64 * 4, m.peaks.memory_bytes_per_s, m.kernel_floor_s
    )
    expected = max(alone["gpu_time_s"] - copy_s, alone["forward_gpu_time_s"])
    assert in_net["gpu_time_s"] == pytest.approx(expected)
    assert in_net["gpu_time_s"] > alone["forward_gpu_time_s"]
    assert in_net["n_kernels"] == pytest.approx(alone["n_kernels"] - 1)


def test_a_residual_add_runs_no_backward_kernel_in_a_real_network():
    # What the rule above rests on, in a real trace (resnet34 at 8x3x224x224 in training,
    # H200, tests/data/unseen_networks): each residual add's backward node hands the
    # gradient on and runs no kernel, while the isolated samples' ran two copies.
    import tarfile

    name = "h200/default/training/traces/networks/resnet34_8x3x224x224.json"
    archive = Path(__file__).resolve().parent / "data" / "unseen_networks" / "traces.tar.gz"
    with tarfile.open(archive) as tar:
        record = json.load(tar.extractfile(name))
    rows = pd.DataFrame(record["breakdown"])
    adds = rows[rows["label"].str.startswith("AddBackward0")]
    assert len(adds) == 16  # resnet34's 3 + 4 + 6 + 3 blocks
    assert (adds["n_kernels"] == 0).all()
