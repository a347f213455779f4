"""Tests for the gradient sums of a network's backward pass (opcost.model.grad_sums,
opcost.extract.gradient_sums): counted by hand on a residual network and on a tensor
taken by three views, per recorded call."""

from __future__ import annotations

import pytest
import torch

from opcost import spec as specs
from opcost.extract import (
    extract_model_input,
    extract_ops,
    gradient_sums,
    with_gradient_sums,
)
from opcost.model.grad_sums import COLUMNS, sum_time_s
from opcost.names import ModelInput
from opcost.networks import build_for_extraction


def test_a_residual_network_sums_each_blocks_input_once() -> None:
    """resnet18 at 2x3x64x64: each of its 8 blocks' input is taken by the block's first
    convolution and by its shortcut (the add, or the downsampling convolution), so its
    gradient is summed once; each sum goes to the call that made the input (the stem's
    max pooling, then each block's last ReLU)."""
    net = build_for_extraction("resnet18")
    sums = gradient_sums(net, (2, 3, 64, 64))
    recorded = extract_ops(build_for_extraction("resnet18"), (2, 3, 64, 64))
    assert [op_id for op_id, *_ in sums] == [specs.op_id(s) for s in recorded]
    # Block inputs: 64x16x16 (layer 1, twice, and layer 2's first), 128x8x8 (twice),
    # 256x4x4 (twice), 512x2x2, float32, batch 2.
    by_hand = 4 * 2 * (3 * 64 * 16 * 16 + 2 * 128 * 8 * 8 + 2 * 256 * 4 * 4 + 512 * 2 * 2)
    assert sum(a for _, a, _, _ in sums) == 8
    assert sum(b for _, _, b, _ in sums) == by_hand == 606_208
    assert all(backward for *_, backward in sums)  # every output needs a gradient
    summed = [recorded[i]["type"] for i, (_, a, _, _) in enumerate(sums) if a]
    assert summed[0] == "torch.nn.modules.pooling.MaxPool2d"
    assert set(summed[1:]) == {"torch.nn.modules.activation.ReLU"}


class _ThreeViews(torch.nn.Module):
    """A fused projection taken by three views (Swin's q, k, v), and a tensor taken once."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.out = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x).reshape(x.shape[0], 3, 8).permute(1, 0, 2)
        q, k, v = qkv[0], qkv[1], qkv[2]
        return self.out(q * k + v)


def test_a_tensor_three_views_take_sums_two_gradients_at_the_call_that_made_it() -> None:
    sums = gradient_sums(_ThreeViews(), (4, 8))
    recorded = extract_ops(_ThreeViews(), (4, 8))
    types = [s["type"] for s in recorded]
    by_type = {t: (a, b) for t, (_, a, b, _) in zip(types, sums, strict=True) if a}
    # The permuted (3, 4, 8) float32 tensor: 3 gradients, 2 adds of 384 bytes.
    assert by_type == {"torch.Tensor.permute": (2, 2 * 3 * 4 * 8 * 4)}


class _Masked(torch.nn.Module):
    """Scores plus a mask built from the input's shape (Swin's shifted windows'): the
    mask's calls need no gradient, so a training step runs no backward pass for them."""

    def __init__(self) -> None:
        super().__init__()
        self.scores = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = x.new_zeros((x.shape[0], 8))
        mask = mask.masked_fill(mask.sub(1.0) != 0, -100.0)
        return self.scores(x) + mask


def test_a_call_none_of_whose_outputs_needs_a_gradient_runs_no_backward_pass() -> None:
    sums = gradient_sums(_Masked(), (4, 8))
    types = [s["type"].rsplit(".", 1)[-1] for s in extract_ops(_Masked(), (4, 8))]
    backward = dict(zip(types, (b for *_, b in sums), strict=True))
    assert backward == {"new_zeros": 0, "sub": 0, "ne": 0, "masked_fill": 0, "Linear": 1, "add": 1}


class _MaskBands(torch.nn.Module):
    """A mask written band by band (``mask[a:b] = k``), and a buffer the input is written
    into (``buf[:, 1:] = x``): only the second needs a gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.scores = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = x.new_zeros((x.shape[0], 8))
        mask[:, 4:] = -100.0
        buf = x.new_zeros((x.shape[0], 9))
        buf[:, 1:] = self.scores(x)
        return buf[:, 1:] + mask


def test_a_write_into_part_of_a_tensor_runs_a_backward_pass_where_its_value_needs_one() -> None:
    sums = gradient_sums(_MaskBands(), (4, 8))
    types = [s["type"].rsplit(".", 1)[-1] for s in extract_ops(_MaskBands(), (4, 8))]
    backward = [(t, b) for t, (*_, b) in zip(types, sums, strict=True)]
    assert backward == [
        ("new_zeros", 0),
        ("__setitem__", 0),
        ("new_zeros", 0),
        ("Linear", 1),
        ("__setitem__", 1),
        ("__getitem__", 1),
        ("add", 1),
    ]


def test_an_op_table_carries_its_calls_sums_per_call() -> None:
    mi = ModelInput("resnet18", (2, 3, 64, 64))
    table = with_gradient_sums(extract_model_input(mi), mi)
    assert (table[COLUMNS[0]] * table["count"]).sum() == pytest.approx(8)
    assert (table[COLUMNS[1]] * table["count"]).sum() == pytest.approx(606_208)
    relu = table[table["type"].str.endswith("ReLU")]
    # The ReLUs' calls: 17 in all, 7 of them end a block whose output is summed.
    assert int(relu["count"].sum()) == 17
    assert float((relu[COLUMNS[0]] * relu["count"]).sum()) == pytest.approx(7)
    assert (table[COLUMNS[2]] == 1.0).all()


def test_a_sum_reads_two_gradients_and_writes_one() -> None:
    # 10 adds of 1 MB each at 2 TB/s and a 2-us kernel floor: 10 x 2 us + 30 MB / 2 TB/s.
    assert sum_time_s(10, 10e6, 2e12, 2e-6) == pytest.approx(20e-6 + 15e-6)
