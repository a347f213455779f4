"""Tests for opcost.model.inplace_saves: which in-place ops clone their input in a
network's training step, checked by hand on toy ops (PyTorch's autograd saves the
input an op's derivative needs) and against a real trace of efficientnet_b1 on an H200
(tests/data/blind_networks), where each in-place SiLU's forward pass runs two kernels."""

from __future__ import annotations

import glob
import json
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from opcost import spec as specs
from opcost.model import inplace_saves, leaf_grads, opmodel
from opcost.train import TrainConfig, make_regressor

ROOT = Path(__file__).resolve().parents[1]


def _module(name: str, shape: list[int], inplace: bool) -> str:
    spec = {
        "args": [{"__tensor__": 0}],
        "attrs": {"inplace": inplace},
        "inputs": [{"dtype": "float32", "param": False, "shape": shape}],
        "kind": "module",
        "kwargs": {},
        "outputs": [{"dtype": "float32", "shape": shape}],
        "type": f"torch.nn.modules.activation.{name}",
    }
    return specs.canonical_json(spec)


def _method(name: str, shape: list[int]) -> str:
    inputs = [{"dtype": "float32", "param": False, "shape": shape}] * 2
    spec = {
        "args": [{"__tensor__": 0}, {"__tensor__": 1}],
        "inputs": inputs,
        "kind": "function",
        "kwargs": {},
        "type": f"torch.Tensor.{name}",
    }
    return specs.canonical_json(spec)


def test_an_in_place_op_whose_derivative_needs_its_input_clones_it():
    # SiLU's derivative needs x, which silu_ overwrites: one clone of 2x3x4x4 float32
    # (384 bytes). ReLU's needs its result, add_'s nothing: no clone. Out of place,
    # nothing is overwritten.
    shape = [2, 3, 4, 4]
    assert inplace_saves.saved_copies(_module("SiLU", shape, True)) == (1, 384)
    assert inplace_saves.saved_copies(_module("Hardswish", shape, True)) == (1, 384)
    assert inplace_saves.saved_copies(_module("ReLU6", shape, True)) == (1, 384)
    assert inplace_saves.saved_copies(_module("ReLU", shape, True)) == (0, 0)
    assert inplace_saves.saved_copies(_module("SiLU", shape, False)) == (0, 0)
    # a.mul_(b): b's gradient needs the a it overwrites.
    assert inplace_saves.saved_copies(_method("mul_", shape)) == (1, 384)
    assert inplace_saves.saved_copies(_method("add_", shape)) == (0, 0)


def _trace(name: str, mode: str) -> dict:
    archive = ROOT / "tests" / "data" / "blind_networks" / "traces.tar.gz"
    with tarfile.open(archive) as tar:
        return json.load(tar.extractfile(f"h200/default/{mode}/traces/networks/{name}.json"))


def test_a_real_networks_in_place_silu_runs_a_clone_in_training_only():
    from opcost.extract import extract_model_input
    from opcost.names import ModelInput

    name = "efficientnet_b1_8x3x224x224"
    table = extract_model_input(ModelInput("efficientnet_b1", (8, 3, 224, 224)))
    silu = {
        op_id: inplace_saves.saved_copies(spec)
        for op_id, spec in zip(table["op_id"], table["spec"], strict=True)
        if json.loads(spec)["type"].endswith("SiLU")
    }
    cloned = {op_id for op_id, (copies, _) in silu.items() if copies == 1}
    assert len(silu) >= 20
    assert cloned == set(silu)  # efficientnet's SiLUs all run in place
    for mode, kernels in (("training", 2), ("inference", 1)):
        rows = pd.DataFrame(_trace(name, mode)["breakdown"])
        forward = rows[rows["phase"].eq("forward") & rows["op_id"].isin(cloned)]
        assert len(forward) >= 60
        assert (forward["n_kernels"] == kernels).all()


def test_a_training_call_in_place_adds_the_clone_to_its_forward_pass():
    round_1 = sorted(glob.glob(str(ROOT / "data" / "op-space" / "h200" / "[0-9]*.parquet")))
    table = pd.concat([pd.read_parquet(f) for f in round_1])
    rows = table[table["family"].eq("activation")].reset_index(drop=True)
    make = lambda: make_regressor(TrainConfig(regressor="extra_trees", n_estimators=10), n_jobs=1)  # noqa: E731
    m = opmodel.fit(rows, "h200", make)
    shape = [8, 240, 28, 28]
    nbytes = 8 * 240 * 28 * 28 * 4
    ops = pd.DataFrame(
        {"spec": [_module("SiLU", shape, True)] * 2, "mode": ["training", "inference"]}
    )
    alone, in_net = m.predict(ops, isolated=True), m.predict(ops)
    copy_s = leaf_grads.copy_time_s(1, nbytes, m.peaks.memory_bytes_per_s, m.kernel_floor_s)
    for col, add in (
        ("gpu_time_s", copy_s),
        ("forward_gpu_time_s", copy_s),
        ("n_kernels", 1),
        ("forward_n_kernels", 1),
    ):
        assert in_net.loc[0, col] == pytest.approx(alone.loc[0, col] + add)
    # Inference runs nothing in place under autograd; a table carrying the clones
    # predicts the same as one that finds them.
    pd.testing.assert_series_equal(in_net.iloc[1], alone.iloc[1])
    carried = m.predict(ops.assign(inplace_save_copies=[1, 1], inplace_save_copy_bytes=nbytes))
    pd.testing.assert_frame_equal(carried, in_net)
