"""Tests for opcost.model.features: the fixed-length encoding of thesis section 4.2.

Expected vectors are written out by hand (the thesis's own example for a Linear and a
Conv2d input); parameter counts and FLOPs are checked against PyTorch itself (the modules'
parameters, ``torch.utils.flop_counter``) on the real H100 operations.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from opcost import spec as specs
from opcost.model.features import (
    FEATURES_VERSION,
    FeatureSchema,
    SchemaError,
    build_schema,
    check_schema,
    encode_features,
    encode_grid,
    op_counts,
)

DATA = Path(__file__).parent / "data" / "h100"
LINEAR = "torch.nn.modules.linear.Linear"
CONV = "torch.nn.modules.conv.Conv2d"


def linear_spec(batch: int = 32, fin: int = 128, fout: int = 10) -> dict:
    return {
        "kind": "module",
        "type": LINEAR,
        "attrs": {"in_features": fin, "out_features": fout, "bias": True},
        "args": [{"__tensor__": 0}],
        "kwargs": {},
        "inputs": [{"shape": [batch, fin], "dtype": "float32", "param": False}],
        "outputs": [{"shape": [batch, fout], "dtype": "float32"}],
    }


def conv_spec() -> dict:
    return {
        "kind": "module",
        "type": CONV,
        "attrs": {
            "in_channels": 16,
            "out_channels": 32,
            "kernel_size": [3, 3],
            "stride": [1, 1],
            "padding": [1, 1],
            "dilation": [1, 1],
            "groups": 1,
            "bias": False,
        },
        "args": [{"__tensor__": 0}],
        "kwargs": {},
        "inputs": [{"shape": [32, 16, 256, 256], "dtype": "float32", "param": False}],
        "outputs": [{"shape": [32, 32, 256, 256], "dtype": "float32"}],
    }


def rows(*spec_list: dict, mode: str = "inference", **conditions) -> pd.DataFrame:
    base = {
        "mode": mode,
        "dtype": "float32",
        "tf32": True,
        "sm_clock_mhz": 1980.0,
        "mem_clock_mhz": 2619.0,
        "power_limit_w": 700.0,
    }
    base.update(conditions)
    return pd.DataFrame([{"spec": specs.canonical_json(s), **base} for s in spec_list])


def shape_entries(x: pd.Series, slot: int, max_dims: int) -> list[float]:
    out = []
    for j in range(max_dims):
        out += [x[f"in{slot}_d{j}"], x[f"in{slot}_d{j}_flag"]]
    return out


def test_thesis_example_linear_and_conv_input_tuples():
    # Thesis 4.2: (32, 128) -> (32, 1, 128, 1, -1, 0, -1, 0); (32, 16, 256, 256) ->
    # (32, 1, 16, 1, 256, 1, 256, 1).
    schema = FeatureSchema(op_types=(CONV, LINEAR), max_dims=4)
    x = encode_features(rows(linear_spec(), conv_spec()), schema)
    assert shape_entries(x.iloc[0], 0, 4) == [32, 1, 128, 1, -1, 0, -1, 0]
    assert shape_entries(x.iloc[1], 0, 4) == [32, 1, 16, 1, 256, 1, 256, 1]
    # A second input slot that does not exist: all (-1, 0).
    assert shape_entries(x.iloc[0], 1, 4) == [-1, 0] * 4


def test_one_hot_type_and_unseen_type():
    schema = FeatureSchema(op_types=(CONV, LINEAR))
    relu = {**linear_spec(), "type": "torch.nn.modules.activation.ReLU", "attrs": {}}
    x = encode_features(rows(linear_spec(), conv_spec(), relu), schema)
    onehot = x[[f"type[{CONV}]", f"type[{LINEAR}]"]].to_numpy().tolist()
    assert onehot == [[0, 1], [1, 0], [0, 0]]


def test_attributes_apply_or_not():
    schema = FeatureSchema(op_types=(CONV, LINEAR))
    x = encode_features(rows(linear_spec(), conv_spec()), schema)
    lin, conv = x.iloc[0], x.iloc[1]
    # Stride applies to the convolution only (thesis: -1 with a zero flag otherwise).
    assert (conv["attr_stride_0"], conv["attr_stride_0_flag"]) == (1, 1)
    assert (lin["attr_stride_0"], lin["attr_stride_0_flag"]) == (-1, 0)
    # A 2-D kernel has no third component.
    assert (conv["attr_kernel_size_2"], conv["attr_kernel_size_2_flag"]) == (-1, 0)
    assert (lin["attr_in_features_0"], lin["attr_in_features_0_flag"]) == (128, 1)
    assert (conv["attr_bias_0"], lin["attr_bias_0"]) == (0, 1)


def test_strided_inputs_counts_the_inputs_given_with_strides():
    """A channels-last convolution and a contiguous one of the same shape run other
    kernels: the feature tells them apart, and the shape entries stay the same."""
    channels_last = conv_spec()
    channels_last["inputs"][0]["stride"] = list(
        torch.empty(32, 16, 256, 256, device="meta", memory_format=torch.channels_last).stride()
    )
    schema = FeatureSchema(op_types=(CONV, LINEAR))
    x = encode_features(rows(conv_spec(), channels_last, linear_spec()), schema)
    assert x["strided_inputs"].tolist() == [0, 1, 0]
    assert shape_entries(x.iloc[0], 0, 5) == shape_entries(x.iloc[1], 0, 5)


def test_integer_kernel_is_broadcast_over_spatial_dims():
    pool = {
        "kind": "module",
        "type": "torch.nn.modules.pooling.MaxPool2d",
        "attrs": {"kernel_size": 3, "stride": 2, "padding": 0, "dilation": 1, "ceil_mode": True},
        "args": [{"__tensor__": 0}],
        "kwargs": {},
        "inputs": [{"shape": [4, 64, 31, 31], "dtype": "float32", "param": False}],
        "outputs": [{"shape": [4, 64, 15, 15], "dtype": "float32"}],
    }
    x = encode_features(rows(pool), FeatureSchema(op_types=())).iloc[0]
    assert [x[f"attr_kernel_size_{c}"] for c in range(3)] == [3, 3, -1]
    assert [x[f"attr_kernel_size_{c}_flag"] for c in range(3)] == [1, 1, 0]
    # MaxPool2d(3, stride 2) on 31x31 reads 3*3 inputs per output element.
    assert x["flops"] == 4 * 64 * 15 * 15 * 9


def test_scalar_call_arguments_are_encoded():
    flatten = json.loads(
        pd.read_parquet(DATA / "ops" / "resnet18_4x3x64x64.parquet")
        .query("type == 'torch.flatten'")["spec"]
        .iloc[0]
    )
    x = encode_features(rows(flatten), FeatureSchema(op_types=())).iloc[0]
    assert (x["arg0"], x["arg0_flag"]) == (1, 1)  # torch.flatten(x, 1)
    assert (x["arg1"], x["arg1_flag"]) == (-1, 0)


def test_conditions_mode_and_dtype():
    schema = FeatureSchema(op_types=())
    x = encode_features(
        rows(
            linear_spec(),
            mode="training",
            dtype="bfloat16",
            tf32=False,
            sm_clock_mhz=np.nan,
            mem_clock_mhz=1593.0,
            power_limit_w=np.nan,
        ),
        schema,
    ).iloc[0]
    assert (x["training"], x["dtype_bytes"], x["tf32"]) == (1, 2, 0)
    # Not measured (CPU): -1, as every other entry that does not apply.
    assert (x["sm_clock_mhz"], x["mem_clock_mhz"], x["power_limit_w"]) == (-1, 1593, -1)
    # bytes moved: inputs 32*128 + outputs 32*10 + parameters 128*10+10, 2 bytes each.
    assert x["bytes_moved"] == 2 * (32 * 128 + 32 * 10 + 128 * 10 + 10)


def test_more_dimensions_than_slots_fold_into_the_last():
    s = linear_spec()
    s["inputs"][0]["shape"] = [2, 3, 4, 5, 6, 7]
    x = encode_features(rows(s), FeatureSchema(op_types=(), max_dims=5)).iloc[0]
    assert shape_entries(x, 0, 5) == [2, 1, 3, 1, 4, 1, 5, 1, 42, 1]


def real_module_specs() -> list[dict]:
    unique = pd.read_parquet(DATA / "ops" / "unique.parquet")
    return [json.loads(s) for s in unique["spec"]]


def test_parameter_counts_match_pytorch_modules():
    # Every module op of the real H100 sample, rebuilt on the meta device: its
    # parameter count is what PyTorch allocates.
    checked = 0
    for spec in real_module_specs():
        if spec["kind"] != "module":
            continue
        module = specs.rebuild(spec, device="meta").module
        expected = sum(p.numel() for p in module.parameters())
        assert op_counts(specs.canonical_json(spec))["params"] == expected, spec["type"]
        checked += 1
    assert checked > 50


def test_multihead_attention_parameters_match_pytorch():
    with torch.device("meta"):
        mha = torch.nn.MultiheadAttention(768, 12, batch_first=True)
    spec = {
        "kind": "module",
        "type": "torch.nn.modules.activation.MultiheadAttention",
        "attrs": specs.module_attrs(mha),
        "args": [{"__tensor__": 0}, {"__tensor__": 1}, {"__tensor__": 2}],
        "kwargs": {},
        "inputs": [{"shape": [2, 197, 768], "dtype": "float32", "param": False}] * 3,
        "outputs": [{"shape": [2, 197, 768], "dtype": "float32"}],
    }
    expected = sum(p.numel() for p in mha.parameters())  # 2,362,368
    counts = op_counts(specs.canonical_json(spec))
    assert counts["params"] == expected
    # Self-attention as extraction records it (one input, named three times): the same
    # FLOPs and parameters, one input's elements.
    one = {**spec, "args": [{"__tensor__": 0}] * 3, "inputs": spec["inputs"][:1]}
    counts_one = op_counts(specs.canonical_json(one))
    assert (counts_one["flops"], counts_one["params"]) == (counts["flops"], expected)
    assert counts_one["input_numel"] == counts["input_numel"] / 3


@pytest.mark.parametrize("kind", ["Conv2d", "Linear"])
def test_flops_match_torch_flop_counter(kind):
    # torch.utils.flop_counter counts 2 FLOPs per multiply-add of convolutions and
    # matrix products, as the features do; bias additions it does not count.
    checked = 0
    for spec in real_module_specs():
        if not spec["type"].endswith(kind):
            continue
        spec = json.loads(json.dumps(spec))
        spec["attrs"]["bias"] = False
        module = specs.rebuild(spec, device="meta").module
        x = torch.empty(spec["inputs"][0]["shape"], device="meta")
        with FlopCounterMode(display=False) as counter:
            module(x)
        assert op_counts(specs.canonical_json(spec))["flops"] == counter.get_total_flops()
        checked += 1
    assert checked >= 4


def test_every_row_has_the_schema_length_on_real_data():
    data = pd.read_parquet(DATA / "dataset" / "h100.parquet").query("kind == 'op'")
    schema = build_schema(data["op_type"])
    x = encode_features(data, schema)
    assert list(x.columns) == schema.columns()
    assert x.shape == (len(data), len(schema.columns()))
    assert np.isfinite(x.to_numpy()).all()
    # The one-hot block has exactly one 1 per row: every type of the data is known.
    onehot = x[[f"type[{t}]" for t in schema.op_types]].to_numpy()
    assert (onehot.sum(axis=1) == 1).all()
    assert len(schema.op_types) == data["op_type"].nunique() == 10


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4096), min_size=1, max_size=7))
def test_shape_flags_mark_exactly_the_present_dims(shape):
    s = linear_spec()
    s["inputs"][0]["shape"] = shape
    schema = FeatureSchema(op_types=(), max_dims=5)
    x = encode_features(rows(s), schema).iloc[0]
    entries = shape_entries(x, 0, 5)
    values, flags = entries[0::2], entries[1::2]
    n = min(len(shape), 5)
    assert flags == [1] * n + [0] * (5 - n)
    assert values[n:] == [-1] * (5 - n)
    assert math.prod(int(v) for v in values[:n]) == math.prod(shape)  # folding keeps numel
    assert len(x) == len(schema.columns())


def test_schema_round_trip_and_mismatch():
    schema = build_schema([LINEAR, CONV, LINEAR])
    assert schema.op_types == (CONV, LINEAR)
    again = FeatureSchema.from_dict(json.loads(json.dumps(schema.to_dict())))
    assert again == schema
    assert again.columns() == schema.columns()
    check_schema(schema, schema.columns(), "here")
    other = build_schema([LINEAR])
    with pytest.raises(SchemaError, match="retrain"):
        check_schema(schema, other.columns(), "here")
    old = FeatureSchema(op_types=(LINEAR,), version=FEATURES_VERSION + 1)
    with pytest.raises(SchemaError, match="version"):
        check_schema(old, old.columns(), "here")
    without = build_schema([LINEAR], derived=False)
    assert "flops" not in without.columns()
    assert "flops" in build_schema([LINEAR]).columns()


def test_encode_refuses_missing_columns_and_unknown_modes():
    schema = FeatureSchema(op_types=())
    with pytest.raises(SchemaError, match="sm_clock_mhz"):
        encode_features(rows(linear_spec()).drop(columns="sm_clock_mhz"), schema)
    with pytest.raises(SchemaError, match="unknown mode"):
        encode_features(rows(linear_spec(), mode="train"), schema)
    with pytest.raises(SchemaError, match="dtype"):
        encode_features(rows(linear_spec(), dtype="int8"), schema)


def grid_conditions() -> pd.DataFrame:
    nan = float("nan")
    return pd.DataFrame(
        [
            ("inference", "float32", True, 1980.0, 2619.0, 700.0),
            ("training", "float16", False, 1410.0, nan, 300.0),
            ("training", "bfloat16", True, nan, nan, nan),
        ],
        columns=["mode", "dtype", "tf32", "sm_clock_mhz", "mem_clock_mhz", "power_limit_w"],
    )


@pytest.mark.parametrize("derived", [True, False])
def test_grid_holds_every_op_at_every_condition(derived):
    relu = {**linear_spec(), "kind": "function", "type": "torch.relu", "attrs": {}}
    op_specs = [specs.canonical_json(s) for s in (linear_spec(), conv_spec(), relu)]
    conditions = grid_conditions()
    schema = build_schema([LINEAR, CONV], derived=derived)
    grid = encode_grid(op_specs, conditions, schema)
    columns = schema.columns()
    assert grid.shape == (3, 3, len(columns))
    # Row by row, op-major, the same numbers.
    table = pd.DataFrame(
        [{"spec": s, **c} for s in op_specs for c in conditions.to_dict(orient="records")]
    )
    expected = encode_features(table, schema).to_numpy()
    np.testing.assert_array_equal(grid.reshape(9, len(columns)), expected)
    # By hand: the Linear (32x128 -> 32x10, bias) in training at float16, no TF32, memory
    # clock not measured.
    x = dict(zip(columns, grid[0, 1], strict=True))
    assert (x["training"], x["dtype_bytes"], x["tf32"]) == (1, 2, 0)
    assert (x["sm_clock_mhz"], x["mem_clock_mhz"], x["power_limit_w"]) == (1410, -1, 300)
    assert (x[f"type[{LINEAR}]"], x[f"type[{CONV}]"]) == (1, 0)
    if derived:
        params, elements = 128 * 10 + 10, 32 * 128 + 32 * 10
        assert x["bytes_moved"] == (elements + params) * 2
        assert x["flops_per_byte"] == (2 * 320 * 128 + 320) / ((elements + params) * 2)
    else:
        assert "bytes_moved" not in x


def test_grid_of_nothing_and_bad_conditions():
    schema = FeatureSchema(op_types=())
    n = len(schema.columns())
    assert encode_grid([], grid_conditions(), schema).shape == (0, 3, n)
    linear = specs.canonical_json(linear_spec())
    assert encode_grid([linear], grid_conditions()[:0], schema).shape == (1, 0, n)
    with pytest.raises(SchemaError, match="power_limit_w"):
        encode_grid([], grid_conditions().drop(columns="power_limit_w"), schema)
    with pytest.raises(SchemaError, match="unknown mode"):
        encode_grid([], grid_conditions().assign(mode="train"), schema)
