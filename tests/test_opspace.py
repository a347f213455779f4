"""The op-space study (issue #23): the generator (opcost.opspace), its measurement
(opcost.opspace_measure) on the CPU, the workflow's helpers and rules, and the committed
real measurements under data/op-space."""

import json
import math
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import as_ordinary_user

from opcost import (
    harness,
    opspace,
    opspace_conv,
    opspace_draw,
    opspace_grouped,
    opspace_stages,
)
from opcost import opspace_measure as om
from opcost import opspace_workflow as osw
from opcost import spec as specs
from opcost.config import ConfigError, GpuConfig, load_schema, load_study_file, validate_config
from opcost.extract import extract_ops
from opcost.model import shares
from opcost.model.features import op_counts

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data/op-space"
CPU = GpuConfig("cpu", "cpu", True, "float32", (), None, None)


def _numel(spec):
    return sum(math.prod(t["shape"]) for t in [*spec["inputs"], *spec["outputs"]])


@pytest.fixture(scope="module")
def sampled():
    """32 configurations of every family (seed 3), with their parameters after fitting."""
    rows = []
    for name, family in opspace.FAMILIES.items():
        for i, u in enumerate(opspace.points(name, 32, seed=3)):
            params, spec = opspace.fit(name, family.params(u))
            rows.append({"family": name, "sample": i, "params": params, "spec": spec})
    return rows


def _smallest(sampled, per_family):
    out = []
    for name in opspace.FAMILIES:
        rows = sorted((r for r in sampled if r["family"] == name), key=lambda r: _numel(r["spec"]))
        out += rows[:per_family]
    return out


# -- the generator ---------------------------------------------------------------------------


class _InANetwork(torch.nn.Module):
    """A network whose forward makes one configuration's call, as a layer of a network: a
    module as its child; a function called in its own forward, beside a child module (the
    recorder keeps the functional calls of a module that calls a child)."""

    def __init__(self, call):
        super().__init__()
        self.call = call
        self.layer = call.module if call.module is not None else torch.nn.Identity()

    def forward(self, x):
        if self.call.module is not None:
            return self.layer(*self.call.args, **self.call.kwargs)
        self.layer(x)
        return self.call.fn(*self.call.args, **self.call.kwargs)


def test_every_family_is_sampled_with_the_spec_extraction_records_in_a_network(sampled):
    checked = set()
    for row in (r for r in sampled if r["sample"] < 8):
        call = opspace.FAMILIES[row["family"]].call(row["params"])
        found = extract_ops(_InANetwork(call), (1,))
        ours = [s for s in found if s["type"] == row["spec"]["type"]]
        assert len(ours) == 1, (row["family"], row["spec"]["type"], [s["type"] for s in found])
        assert specs.canonical_json(ours[0]) == specs.canonical_json(row["spec"])
        assert specs.op_id(ours[0]) == specs.op_id(row["spec"])
        checked.add(row["family"])
    assert checked == set(opspace.FAMILIES)


def test_the_matrix_operator_is_sampled_as_a_network_records_a_at_b():
    class AtB(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Identity()

        def forward(self, x):
            a = self.layer(x)
            return a @ torch.empty(3, 5, 7, device=a.device)

    (recorded,) = [s for s in extract_ops(AtB(), (3, 4, 5)) if "matmul" in s["type"]]
    params = {"type": "operator", "batch": 3, "heads": 0, "m": 4, "k": 5, "n": 7}
    assert opspace.build("matmul", params) == recorded


def test_small_sampled_configurations_rebuild_and_run_on_the_cpu(sampled):
    small = _smallest(sampled, 2)
    assert {r["family"] for r in small} == set(opspace.FAMILIES)
    for row in small:
        spec = row["spec"]
        for training in (False, True):
            op = specs.rebuild(spec, inplace_ok=not training)
            if op.module is not None:
                op.module.train(training)
            inputs = specs.random_inputs(spec, requires_grad=training)
            with torch.set_grad_enabled(training):
                out = op(inputs)
            outs = [out] if isinstance(out, torch.Tensor) else [o for o in out if o is not None]
            shapes = [list(o.shape) for o in outs]
            assert shapes == [o["shape"] for o in spec["outputs"]], row["family"]
            if training and outs[0].requires_grad:
                outs[0].sum().backward()


def test_the_same_seed_gives_the_same_configurations_and_starts_continue_the_sequence():
    counts = {"conv": 6, "view": 5}
    first = opspace.sample(counts, seed=7)
    assert first["op_id"].tolist() == opspace.sample(counts, seed=7)["op_id"].tolist()
    assert first["op_id"].tolist() != opspace.sample(counts, seed=8)["op_id"].tolist()
    for family in ("conv", "view"):
        whole = opspace.points(family, 8, seed=0)
        for cut in (4, 3):
            head = opspace.points(family, cut, seed=0)
            tail = opspace.points(family, 8 - cut, seed=0, start=cut)
            assert np.array_equal(whole, np.vstack([head, tail]))
    eight = opspace.sample({"conv": 8}, seed=0)
    halves = pd.concat(
        [
            opspace.sample({"conv": 4}, seed=0),
            opspace.sample({"conv": 4}, seed=0, starts={"conv": 4}, round_=2),
        ],
        ignore_index=True,
    )
    assert halves["op_id"].tolist() == eight["op_id"].tolist()
    assert halves["sample"].tolist() == list(range(8))
    assert halves["round"].tolist() == [1] * 4 + [2] * 4


def _size(spec):
    """Forward FLOPs and largest tensor bytes, counted here from the spec."""
    flops = op_counts(specs.canonical_json(spec))["flops"]
    largest = max(math.prod(t["shape"]) for t in [*spec["inputs"], *spec["outputs"]])
    return flops, 4 * largest


def _within_bounds(spec, bounds=(opspace.MAX_FORWARD_FLOPS, opspace.MAX_TENSOR_BYTES)):
    flops, largest = _size(spec)
    return flops <= bounds[0] and largest <= bounds[1]


def test_every_sampled_configuration_is_within_the_size_bounds(sampled):
    assert all(_within_bounds(r["spec"]) for r in sampled)
    committed = pd.read_parquet(DATA / "samples.parquet")
    assert all(_within_bounds(json.loads(s)) for s in committed["spec"])


def test_an_oversized_configuration_is_shrunk_batch_first():
    params = {
        "batch": 256, "cin": 2048, "cout": 2048, "kernel": 7, "stride": 1, "dilation": 1,
        "groups": 1, "spatial": 224, "bias": False, "channels_last": False,
    }  # fmt: skip
    fitted, spec = opspace.fit("conv", params)
    assert _within_bounds(spec)
    assert fitted["batch"] == 1  # 2 * 49 * 2048^2 * 224^2 FLOPs per image: 2e13 > 2e11
    assert fitted["spatial"] < 224
    assert spec["inputs"][0]["shape"] == [1, 2048, fitted["spatial"], fitted["spatial"]]


def _committed_specs(family):
    committed = pd.read_parquet(DATA / "samples.parquet")
    return [json.loads(s) for s in committed.loc[committed["family"] == family, "spec"]]


def test_the_committed_samples_cover_the_ranges_the_study_asks_for():
    committed = pd.read_parquet(DATA / "samples.parquet")
    assert set(committed["family"]) == set(opspace.FAMILIES)
    assert committed["op_id"].is_unique
    convs = _committed_specs("conv")
    attrs = [c["attrs"] for c in convs]
    assert {a["kernel_size"][0] for a in attrs} == {1, 3, 5, 7}
    assert {a["stride"][0] for a in attrs} == {1, 2}
    assert {a["dilation"][0] for a in attrs} == {1, 2}
    assert any(a["groups"] == a["in_channels"] > 1 for a in attrs)  # depthwise
    assert any(1 < a["groups"] < a["in_channels"] for a in attrs)  # grouped
    assert any("stride" in c["inputs"][0] for c in convs)  # channels-last inputs
    batches = [c["inputs"][0]["shape"][0] for c in convs]
    assert min(batches) == 1
    assert max(batches) >= 128
    channels = [a["in_channels"] for a in attrs]
    assert min(channels) <= 4
    assert max(channels) >= 1024
    spatial = [c["inputs"][0]["shape"][2] for c in convs]
    assert min(spatial) <= 8
    assert max(spatial) >= 112
    linear = [c["inputs"][0]["shape"] for c in _committed_specs("linear")]
    assert {len(s) for s in linear} == {2, 3}  # (N, C) and tokens (N, L, C)
    assert min(s[-1] for s in linear) <= 16
    assert max(s[-1] for s in linear) >= 4096
    assert {c["type"] for c in _committed_specs("matmul")} >= {"torch.matmul", "torch.bmm"}
    attention = _committed_specs("attention")
    assert {c["type"].rsplit(".", 1)[-1] for c in attention} == {
        "MultiheadAttention",
        "scaled_dot_product_attention",
    }
    for family, names in {
        "norm": {"BatchNorm2d", "LayerNorm", "LayerNorm2d", "GroupNorm"},
        "activation": {"ReLU", "ReLU6", "GELU", "SiLU", "Hardswish", "Hardsigmoid", "Sigmoid",
                       "Tanh"},
        "pool": {"MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"},
    }.items():  # fmt: skip
        assert {c["type"].rsplit(".", 1)[-1] for c in _committed_specs(family)} == names
    for family in opspace.FAMILIES:
        first = [c["inputs"][0]["shape"][0] for c in _committed_specs(family)]
        assert min(first) == 1, family
        assert max(first) >= 64, family


def test_allocate_gives_the_floor_and_the_rest_in_proportion_to_the_error():
    rng = np.random.default_rng(0)
    names = sorted(opspace.FAMILIES)
    for _ in range(200):
        errors = {f: float(e) for f, e in zip(names, rng.uniform(0, 1, len(names)), strict=True)}
        floor = int(rng.integers(0, 5))
        total = floor * len(names) + int(rng.integers(0, 500))
        out = opspace.allocate(errors, total, floor=floor)
        assert sum(out.values()) == total
        assert min(out.values()) >= floor
        ranked = sorted(names, key=errors.get)
        assert all(out[a] <= out[b] + 1 for a, b in zip(ranked, ranked[1:], strict=False))
    assert opspace.allocate({"conv": 3.0, "view": 1.0}, 10, floor=1) == {"conv": 7, "view": 3}
    assert opspace.allocate({"conv": 0.0, "view": 0.0}, 5) == {"conv": 3, "view": 2}


@pytest.mark.parametrize(
    ("errors", "words"),
    [
        ({"convolution": 0.1}, "convolution"),
        ({"conv": -0.1}, "op family conv: error -0.1"),
        ({"conv": float("nan")}, "op family conv: error nan"),
    ],
)
def test_allocate_refuses_unknown_families_and_bad_errors(errors, words):
    with pytest.raises(opspace.OpSpaceError, match=words):
        opspace.allocate(errors, 10)


def test_sample_refuses_unknown_families_and_negative_counts_before_sampling(monkeypatch):
    def no_sampling(*args, **kwargs):
        raise AssertionError("sampled before checking the counts")

    monkeypatch.setattr(opspace, "build", no_sampling)
    with pytest.raises(opspace.OpSpaceError, match=r"unknown op families \['convolution'\]"):
        opspace.sample({"conv": 1, "convolution": 1})
    with pytest.raises(opspace.OpSpaceError, match="op family view: -1 samples"):
        opspace.sample({"conv": 2, "view": -1})


def test_the_schema_names_exactly_the_generators_families():
    schema = load_schema()["properties"]["op_space"]["properties"]["samples"]
    assert schema["propertyNames"]["enum"] == list(opspace.FAMILIES)


def test_a_misspelt_family_in_the_config_fails_naming_the_field():
    with pytest.raises(ConfigError) as info:
        validate_config({"op_space": {"samples": {"convolution": 3}}})
    lines = str(info.value).splitlines()
    assert lines[0] == "invalid config:"
    assert len(lines) == 2
    assert lines[1].startswith("  op_space.samples.convolution: unknown key; allowed here: conv,")


# -- measuring on the CPU --------------------------------------------------------------------


def _table(rows, power=False):
    return pd.DataFrame(
        [
            {
                "op_id": specs.op_id(r["spec"]),
                "family": r["family"],
                "type": r["spec"]["type"],
                "kind": r["spec"]["kind"],
                "spec": specs.canonical_json(r["spec"]),
                "sample": r["sample"],
                "round": 1,
                "power": power,
            }
            for r in rows
        ]
    )


@pytest.fixture(scope="module")
def tiny(sampled):
    """The smallest configuration of the activation, linear and conv families."""
    small = {r["family"]: r for r in _smallest(sampled, 1)}
    return [small["activation"], small["linear"], small["conv"]]


def test_measure_chunk_measures_tiny_configurations_in_both_modes(tiny, tmp_path):
    out = tmp_path / "0.parquet"
    table = om.measure_chunk(
        gpu=CPU, profile_config={}, samples=_table(tiny, power=True), out_path=out
    )
    written = pd.read_parquet(out)
    assert list(written.columns) == list(om.COLUMNS)
    assert len(written) == 6
    assert sorted(written["mode"]) == ["inference"] * 3 + ["training"] * 3
    assert (written["status"] == "ok").all()
    assert (written["host_time_s"] > 0).all()
    assert (written["forward_host_time_s"] > 0).all()
    assert written["power_w"].isna().all()  # the CPU has no energy counter
    assert (written["gpu"] == "cpu").all()
    assert (written["device"] == "cpu").all()
    assert (written["torch_version"] == torch.__version__).all()
    assert written["host_cpu"].notna().all()
    assert written["host"].notna().all()
    assert (written["peak_matmul_flops_per_s"] > 0).all()
    assert (written["peak_memory_bytes_per_s"] > 0).all()
    assert written["op_id"].tolist() == [specs.op_id(r["spec"]) for r in tiny] * 2
    assert len(table) == len(written)


def test_a_configuration_that_cannot_run_is_a_failed_row_and_the_chunk_goes_on(tiny, tmp_path):
    unknown = json.loads(json.dumps(tiny[0]["spec"]))
    unknown["type"] = "torch.nn.modules.nowhere.Nothing"
    misfit = json.loads(json.dumps(tiny[2]["spec"]))  # a conv given one channel too many
    misfit["inputs"][0]["shape"][1] += 1
    rows = [
        {**tiny[0], "spec": unknown},
        {**tiny[2], "spec": misfit},
        tiny[1],
    ]
    out = tmp_path / "0.parquet"
    om.measure_chunk(gpu=CPU, profile_config={}, samples=_table(rows), out_path=out)
    written = pd.read_parquet(out)
    assert written["status"].tolist() == ["failed", "failed", "ok"] * 2
    reasons = written["failure_reason"].tolist()
    assert "cannot import 'torch.nn.modules.nowhere.Nothing'" in reasons[0]
    assert reasons[1].startswith("RuntimeError: ")
    assert "channels" in reasons[1]
    assert written.loc[written["status"] == "failed", "gpu_time_s"].isna().all()


def test_chunk_of_slices_the_samples_and_is_empty_past_the_end():
    samples = pd.DataFrame({"op_id": [f"{i:016x}" for i in range(7)]})
    chunks = [om.chunk_of(samples, c, 3)["op_id"].tolist() for c in range(4)]
    assert chunks == [
        samples["op_id"][0:3].tolist(),
        samples["op_id"][3:6].tolist(),
        samples["op_id"][6:7].tolist(),
        [],
    ]


def test_measure_chunk_file_measures_only_the_families_asked(tiny, tmp_path):
    path = tmp_path / "samples.parquet"
    _table(tiny).to_parquet(path)
    out = tmp_path / "0.parquet"
    summary = om.measure_chunk_file(
        gpu=CPU, profile_config={}, samples_path=path, chunk=0, chunk_size=2,
        out_path=out, families=["linear", "conv"],
    )  # fmt: skip
    written = pd.read_parquet(out)
    assert set(written["family"]) == {"linear"}  # chunk 0 is activation and linear
    assert summary == {
        "status": "ok", "configurations": 1, "measured": 2, "failed": 0, "device": "cpu",
    }  # fmt: skip


def test_an_empty_chunk_writes_the_same_columns_without_measuring(tiny, tmp_path, monkeypatch):
    def no_device_work(*args, **kwargs):
        raise AssertionError("an empty chunk measured the device")

    monkeypatch.setattr(om, "measure_peaks", no_device_work)
    path = tmp_path / "samples.parquet"
    _table(tiny).to_parquet(path)
    out = tmp_path / "1.parquet"
    summary = om.measure_chunk_file(
        gpu=CPU, profile_config={}, samples_path=path, chunk=0, chunk_size=3,
        out_path=out, families=["attention"],
    )  # fmt: skip
    written = pd.read_parquet(out)
    assert written.empty
    assert list(written.columns) == list(om.COLUMNS)
    assert summary["configurations"] == 0


# -- the workflow's helpers ------------------------------------------------------------------


def test_the_op_space_config_twins_and_families(repo):
    study = load_study_file(repo / "config/op-space.yaml")
    assert osw.default_twin(study, "h100") is None
    assert osw.default_twin(study, "h100-notf32") == "h100"
    assert osw.default_twin(study, "h200-notf32") == "h200"
    assert osw.op_space_families(study, "h200") is None
    assert osw.op_space_families(study, "h100-notf32") == ["conv", "linear", "matmul", "attention"]
    total = sum(study.config["op_space"]["samples"].values())
    assert total == 2272
    assert osw.op_space_chunks(study) == list(range(10))  # ceil(2272 / 250)
    assert osw.op_space_sampling_params(study)["seed"] == 0


def test_a_cudnn_benchmark_configuration_measures_its_changed_families_only():
    """cudnn_benchmark changes only cuDNN's convolutions: a configuration with it measures
    those and takes the rest from the same GPU's configuration with PyTorch's defaults
    (TF32 on, benchmark off), with TF32 off too the TF32 families; another GPU, or a twin
    with TF32 off, is no twin."""
    from opcost.config import load_study

    gpu = {"device": "cuda", "slurm_gpu_model": "h200", "gpu_name": "H200"}
    study = load_study({
        "gpus": {"plain": gpu, "bench": {**gpu, "cudnn_benchmark": True},
                 "off": {**gpu, "tf32": False},
                 "off-bench": {**gpu, "tf32": False, "cudnn_benchmark": True},
                 "h100-bench": {**gpu, "slurm_gpu_model": "h100", "gpu_name": "H100",
                                "cudnn_benchmark": True}},
        "op_space": {"samples": {"conv": 1}},
    })  # fmt: skip
    assert [osw.default_twin(study, g) for g in study.gpus] == [
        None, "plain", "plain", "plain", None]  # fmt: skip
    assert osw.op_space_families(study, "plain") is None
    assert osw.op_space_families(study, "bench") == ["conv"]
    assert osw.op_space_families(study, "off") == ["conv", "linear", "matmul", "attention"]
    assert osw.op_space_families(study, "off-bench") == ["conv", "linear", "matmul", "attention"]
    assert osw.op_space_families(study, "h100-bench") is None
    # Pooling across GPUs keeps to one setting of cudnn_benchmark.
    assert osw.gpu_peers(study, "bench") == ["h100-bench"]
    assert osw.gpu_peers(study, "plain") == []


def test_without_a_default_twin_a_tf32_off_configuration_measures_every_family(repo):
    config = {
        "gpus": {"off": {"device": "cuda", "tf32": False, "slurm_gpu_model": "h100"},
                 "on": {"device": "cuda", "tf32": True, "slurm_gpu_model": "h200"}},
        "op_space": {"samples": {"conv": 1}},
    }  # fmt: skip
    from opcost.config import load_study

    study = load_study(config)
    assert osw.default_twin(study, "off") is None  # another GPU model is no twin
    assert osw.op_space_families(study, "off") is None


# -- the committed measurements (data/op-space) ---------------------------------------------


def _measured(gpu):
    tables = [pd.read_parquet(p) for p in sorted((DATA / gpu).glob("*.parquet"))]
    return pd.concat([t for t in tables if len(t)], ignore_index=True)


#: Ops that launch no kernel in inference (eval): identities there, ``contiguous`` of
#: an input that is already contiguous (its spec has no strides), and views of part of a
#: tensor (``chunk``, indexing without an index tensor).
def _no_kernel_in_inference(row):
    if row.op_type in (
        "torch.nn.modules.dropout.Dropout",
        "torchvision.ops.stochastic_depth.StochasticDepth",
        "torch.Tensor.chunk",
        "torch.chunk",
    ):
        return True
    spec = json.loads(row.spec)
    if row.op_type == "torch.Tensor.__getitem__":
        return spec["args"][1:] != [{"__tensor__": 1}]
    return row.op_type == "torch.Tensor.contiguous" and "stride" not in spec["inputs"][0]


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_the_committed_measurements_are_sane(gpu):
    # Round 1, the adaptive rounds 2 and 3, the power round 4 and the convolutions of rounds
    # 5 and 6 (data/op-space/README.md), each fully measured; on the H100 rounds 9, 12, 14;
    # on both the power rounds 16 and 17; on the H200 rounds 18, 19, 22, 24, 26, 28, 30-34, 36,
    # 38, 40, 42, 44, 46, 48, 51-54, 56-59.
    own = (
        (9, 12, 14)
        if gpu == "h100"
        else (
            18,
            19,
            22,
            24,
            26,
            28,
            *range(30, 35),
            36,
            38,
            40,
            42,
            44,
            46,
            48,
            *range(51, 55),
            *range(56, 60),
        )
    )
    measured = (2, 3, 4, 5, 6, *own, 16, 17)
    rounds = ["samples.parquet", *(f"samples-r{r}.parquet" for r in measured)]
    samples = pd.concat([pd.read_parquet(DATA / r) for r in rounds], ignore_index=True)
    table = _measured(gpu)
    assert (table["status"] == "ok").all()
    assert len(table) == 2 * len(samples)
    assert set(table["op_id"]) == set(samples["op_id"])
    views = table["family"] == "view"
    assert (table.loc[views, "n_kernels"] == 0).all()
    others = table[~views]
    idle = [r.mode == "inference" and _no_kernel_in_inference(r) for r in others.itertuples()]
    assert (others.loc[idle, "gpu_time_s"] == 0).all()
    assert (others.loc[[not i for i in idle], "gpu_time_s"] > 0).all()
    wide = table.pivot_table(index="op_id", columns="mode", values="gpu_time_s")
    assert (wide["training"] >= wide["inference"]).mean() >= 0.95
    assert (table["peak_matmul_flops_per_s"] > 0).all()
    assert (table["peak_memory_bytes_per_s"] > 0).all()
    power = table[table["power_w"].notna()]
    assert len(power) == 2 * samples["power"].sum()
    # Where kernels keep the GPU busy over half the window, it draws at least about idle
    # power, and well above it where the kernels run 20 us or more each, but for a
    # kernel whose grid fills few SMs (the H200's round 16 has one: 1,792 to 16 channels,
    # 7x7, on a 12x12 map, 0.6 ms a kernel at 145 W, idle 137 W).
    busy = power[power["gpu_time_s"] > 0.5 * power["power_time_s"]]
    assert (busy["power_w"] > 0.9 * busy["idle_power_w"]).all()
    long = busy[busy["gpu_time_s"] > 2e-5 * busy["n_kernels"]]
    assert len(long) >= 20
    assert (long["power_w"] > 1.2 * long["idle_power_w"]).mean() >= 0.99
    # Round 4 windowed every configuration from a CUDA graph: microsecond kernels too, and
    # those keep the GPU busy through the window all the same.
    graphed = table[
        table["op_id"].isin(set(pd.read_parquet(DATA / "samples-r4.parquet")["op_id"]))
        & table["power_w"].notna()
    ]
    assert graphed["power_graphed"].astype(bool).all()
    short = graphed[graphed["gpu_time_s"].between(1e-9, 5e-6 * graphed["n_kernels"])]
    assert len(short) >= 50
    assert (short["gpu_time_s"] > 0.7 * short["power_time_s"]).mean() >= 0.95
    for key, value in {
        "driver_version": "580.159.04",
        "host_cpu": "Intel(R) Xeon(R) Processor",
        "tf32": True,
    }.items():
        assert (table[key] == value).all(), key


def test_the_h200_moves_memory_faster_than_the_h100():
    h100, h200 = _measured("h100"), _measured("h200")
    assert h200["peak_memory_bytes_per_s"].min() > 1.2 * h100["peak_memory_bytes_per_s"].max()
    assert set(h100["gpu_name"]) == {"NVIDIA H100 80GB HBM3"}
    assert set(h200["gpu_name"]) == {"NVIDIA H200"}


@pytest.mark.parametrize("gpu", ["h100-notf32", "h200-notf32"])
def test_the_committed_tf32_off_measurements_are_of_the_tf32_families_only(gpu):
    table = _measured(gpu)
    assert (table["status"] == "ok").all()
    assert not table["tf32"].any()
    assert set(table["family"]) <= set(osw.TF32_FAMILIES)
    assert (table["gpu_time_s"] > 0).all()
    # FP32 without TF32: a few times below the TF32 peak (H100 SXM: 67 vs 495 TFLOP/s).
    twin = _measured(gpu.removesuffix("-notf32"))
    assert table["peak_matmul_flops_per_s"].max() < 0.25 * twin["peak_matmul_flops_per_s"].min()


# -- the pipeline ----------------------------------------------------------------------------


@pytest.mark.slow
def test_op_space_raw_measures_every_chunk_once_and_protects_it(repo, tmp_path):
    from test_workflow import snakemake

    config = {
        "models": [],
        "modes": ["inference", "training"],
        "gpus": {"cpu": {"device": "cpu", "tf32": True, "dtype": "float32"}},
        "op_space": {
            "samples": {"view": 2, "activation": 2},
            "power_samples": 0,
            "chunk_size": 2,
            "seed": 2,  # small configurations: the CPU trains them in milliseconds
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    args = ("op_space_raw", "--configfile", str(path), "--cores", "2")
    run = snakemake(repo, tmp_path, *args)
    assert run.returncode == 0, run.stderr[-4000:]
    samples = pd.read_parquet(tmp_path / "results/op-space/samples.parquet")
    assert sorted(samples["family"]) == ["activation", "activation", "view", "view"]
    raw = sorted((tmp_path / "results/op-space/raw/cpu").glob("*.parquet"))
    assert [p.name for p in raw] == ["0.parquet", "1.parquet"]
    tables = pd.concat([pd.read_parquet(p) for p in raw], ignore_index=True)
    assert sorted(tables["op_id"]) == sorted(samples["op_id"].tolist() * 2)
    assert (tables["status"] == "ok").all()
    probe = "import os, sys; print(os.access(sys.argv[1], os.W_OK))"
    for p in raw:
        assert not p.stat().st_mode & 0o222
        access = subprocess.run(
            as_ordinary_user([sys.executable, "-c", probe, str(p)]), capture_output=True, text=True
        )
        assert access.stdout == "False\n", access.stderr
    again = snakemake(repo, tmp_path, *args, "-n")
    assert again.returncode == 0, again.stderr[-4000:]
    assert "Nothing to be done" in again.stdout + again.stderr


def _assert_round_trips(generator, n, family="conv", points=None):
    """``n`` random configurations of ``family`` (or those at ``points``) of
    ``generator``, fitted to its bounds, round-trip through extraction's spec format, as a
    network's layer (the one op of the configuration's type it records)."""
    fam = opspace.FAMILIES[family]
    us = np.random.default_rng(generator).random((n, fam.dims)) if points is None else points
    for u in us:
        params, spec = opspace.fit(family, fam.params(u, generator), generator)
        found = extract_ops(_InANetwork(fam.call(params)), (1,))
        (ours,) = [s for s in found if s["type"] == spec["type"]]
        assert specs.canonical_json(ours) == specs.canonical_json(spec)


def _conv_attrs(table):
    specs_ = [json.loads(s) for s in table["spec"]]
    return [(c["attrs"], c["inputs"][0]["shape"]) for c in specs_]


def test_generator_2_samples_small_maps_and_grouped_convolutions_as_networks_build_them():
    one = opspace.sample({"conv": 300}, seed=0, generator=1)
    two = opspace.sample({"conv": 300}, seed=0, generator=2)
    assert set(one["generator"]) == {1}
    assert set(two["generator"]) == {2}
    maps1 = [shape[2] for _, shape in _conv_attrs(one)]
    maps2 = [shape[2] for _, shape in _conv_attrs(two)]
    assert min(maps1) >= 7  # generator 1: maps of 7-224, as rounds 1-4 were measured
    # Log-uniform over 1-224: ln 7 / ln 224 = 36 % of the maps below 7, some of 1 pixel.
    assert 0.25 < np.mean(np.array(maps2) < 7) < 0.45
    assert 1 in maps2
    for a, shape in _conv_attrs(two):
        # No kernel wider than its map (padding would be most of it).
        k, d = a["kernel_size"][0], a["dilation"][0]
        assert k * d <= shape[2] or k == 1
        if 1 < a["groups"] < a["in_channels"]:  # grouped: the width per group kept, or doubled
            assert a["out_channels"] in (a["in_channels"], 2 * a["in_channels"])
    grouped1 = [a for a, _ in _conv_attrs(one) if 1 < a["groups"] < a["in_channels"]]
    assert any(a["out_channels"] not in (a["in_channels"], 2 * a["in_channels"]) for a in grouped1)
    # Every other family is the same under both versions.
    counts = {f: 4 for f in opspace.FAMILIES if f != "conv"}
    assert opspace.sample(counts, seed=0, generator=1)["op_id"].tolist() == (
        opspace.sample(counts, seed=0, generator=2)["op_id"].tolist()
    )
    with pytest.raises(opspace.OpSpaceError, match="generator 26"):
        opspace.sample({"conv": 1}, generator=26)


def test_generator_6_samples_dense_convolutions_of_aligned_widths():
    convs = _conv_attrs(opspace.sample({"conv": 400}, seed=0, generator=6))
    assert len(convs) == 400
    aligned = 0
    for a, shape in convs:
        assert a["groups"] == 1
        assert a["dilation"] == [1, 1]
        batch, cin, cout = shape[0], a["in_channels"], a["out_channels"]
        assert batch & (batch - 1) == 0  # a power of two
        for width in (cin, cout):
            power_of_two = width & (width - 1) == 0
            assert width == 3 or power_of_two or width % 32 == 0, width
            aligned += width % 32 == 0
        assert a["kernel_size"][0] <= shape[2] or a["kernel_size"][0] == 1
    # RGB images in about one in ten; multiples of 32 most of the rest.
    assert 0.05 < np.mean([a["in_channels"] == 3 for a, _ in convs]) < 0.15
    assert aligned / (2 * len(convs)) > 0.7
    kernels = {a["kernel_size"][0] for a, _ in convs}
    strides = {a["stride"][0] for a, _ in convs}
    assert kernels == {1, 3, 5, 7}
    assert strides == {1, 2}


def test_generator_7_samples_dense_convolutions_at_large_batches_beyond_the_default_bounds():
    table = opspace.sample({"conv": 400}, seed=0, generator=7)
    convs = _conv_attrs(table)
    assert len(convs) > 390  # a few small ones repeat
    sizes = [_size(json.loads(s)) for s in table["spec"]]
    heavy = (1.0e12, 2**30)
    assert opspace.bounds("conv", 7) == heavy
    assert opspace.bounds("conv", 6) == opspace.bounds("linear", 7) == (2.0e11, 2**29)
    assert all(_within_bounds(json.loads(s), heavy) for s in table["spec"])
    # What the default bounds would have halved: about a fifth of them.
    beyond = np.mean([not _within_bounds(json.loads(s)) for s in table["spec"]])
    assert 0.1 < beyond < 0.4
    assert max(f for f, _ in sizes) > 5e11
    batches = np.array([shape[0] for _, shape in convs])
    assert np.mean(batches >= 16) > 0.9
    assert set(batches[batches >= 16]) == {16, 32, 64, 128, 256}
    # Drawn at 16-256 (powers of two); shrunk only beyond the heavy bounds.
    for u in opspace.points("conv", 60, seed=0):
        drawn = opspace.FAMILIES["conv"].params(u, 7)
        assert drawn["batch"] in (16, 32, 64, 128, 256)
        fitted, _ = opspace.fit("conv", drawn, 7)
        whole = _within_bounds(opspace.record(opspace.FAMILIES["conv"].call(drawn)), heavy)
        assert (fitted == drawn) == whole
    for a, shape in convs:
        assert a["groups"] == 1
        assert a["dilation"] == [1, 1]
        assert (shape[2] == 224) if a["in_channels"] == 3 else (7 <= shape[2] <= 112)
    assert {a["kernel_size"][0] for a, _ in convs} == {1, 3, 5, 7}
    _assert_round_trips(generator=7, n=1)


def test_generator_8_samples_grouped_and_depthwise_convolutions_only():
    convs = _conv_attrs(opspace.sample({"conv": 400}, seed=0, generator=8))
    assert len(convs) == 400
    depthwise = [a for a, _ in convs if a["groups"] == a["in_channels"]]
    grouped = [a for a, _ in convs if 1 < a["groups"] < a["in_channels"]]
    assert len(depthwise) + len(grouped) == len(convs)  # no dense one
    assert 0.2 < len(depthwise) / len(convs) < 0.4
    per_group = {a["in_channels"] // a["groups"] for a in grouped}
    assert per_group == set(opspace_grouped.GROUP_WIDTHS)
    for a, shape in convs:
        assert a["out_channels"] in (a["in_channels"], 2 * a["in_channels"])
        assert a["out_channels"] <= 2048
        assert 16 <= a["in_channels"] <= 2048
        assert a["in_channels"] % (a["in_channels"] // a["groups"]) == 0
        assert 1 <= shape[2] <= 112
        assert a["kernel_size"][0] <= shape[2] or a["kernel_size"][0] == 1
        assert shape[0] & (shape[0] - 1) == 0
    assert {a["kernel_size"][0] for a, _ in convs} == {1, 3, 5, 7}
    _assert_round_trips(generator=8, n=1)


def _stage_maps(halvings=opspace_stages.HALVINGS) -> set[int]:
    """Every map of a network's stage that generators 9-12 draw (opspace_stages.stage_map),
    or with ``halvings`` those of a patch network's stages."""
    sizes, _ = opspace_stages.INPUT_SIZES
    return {size >> h for size in sizes for h in halvings[0]}


def test_generator_9_samples_convolutions_on_the_maps_of_a_networks_stages():
    stages = _stage_maps()
    assert {224, 112, 56, 28, 14, 7} <= stages
    convs = _conv_attrs(opspace.sample({"conv": 600}, seed=0, generator=9))
    assert len(convs) == 600
    maps = [shape[2] for _, shape in convs]
    assert set(maps) <= stages
    # ImageNet's 224 is three in ten of the input sizes: its stages are the most common.
    assert 0.2 < np.mean([m in (224, 112, 56, 28, 14, 7) for m in maps]) < 0.45
    dense = [a for a, _ in convs if a["groups"] == 1]
    assert 0.5 < len(dense) / len(convs) < 0.7  # the rest grouped or depthwise
    for a, shape in convs:
        assert a["dilation"] == [1, 1]
        assert a["kernel_size"][0] <= shape[2] or a["kernel_size"][0] == 1
        assert shape[0] & (shape[0] - 1) == 0
    _assert_round_trips(generator=9, n=3)


def _assert_grouped_on_stages(convs) -> None:
    """Generators 10 and 11: grouped convolutions keeping their width per group (out as
    many as in, or twice), no wider than the widest, on a stage's map, batch a power of
    two, undilated, the kernel no wider than the map."""
    stages = _stage_maps()
    for a, shape in convs:
        assert a["in_channels"] % a["groups"] == 0
        assert a["out_channels"] in (a["in_channels"], 2 * a["in_channels"])
        assert a["out_channels"] <= opspace_grouped.MAX_GROUPED_WIDTH
        assert a["dilation"] == [1, 1]
        assert shape[2] in stages
        assert a["kernel_size"][0] <= shape[2] or a["kernel_size"][0] == 1
        assert shape[0] & (shape[0] - 1) == 0


def test_generator_10_samples_grouped_convolutions_by_their_number_of_groups():
    convs = _conv_attrs(opspace.sample({"conv": 600}, seed=0, generator=10))
    assert len(convs) >= 590  # a few drawn twice
    lo, hi = opspace_grouped.GROUP_COUNTS
    groups = np.array([a["groups"] for a, _ in convs])
    assert all(1 < a["groups"] < a["in_channels"] for a, _ in convs)  # none dense or depthwise
    assert groups.min() >= lo
    assert groups.max() <= hi
    # Log-uniform in the number of groups: about half below the geometric middle (45),
    # where generator 8, which derives the groups from the width, puts few samples.
    assert 0.4 < np.mean(groups < np.sqrt(lo * hi)) < 0.65
    eight = _conv_attrs(opspace.sample({"conv": 600}, seed=0, generator=8))
    assert np.mean([16 <= a["groups"] < a["in_channels"] for a, _ in eight]) < 0.5 * np.mean(
        groups >= 16
    )
    _assert_grouped_on_stages(convs)
    assert {a["in_channels"] // a["groups"] for a, _ in convs} == set(opspace_grouped.GROUP_WIDTHS)
    kernels = [a["kernel_size"][0] for a, _ in convs]
    assert 0.6 < np.mean(np.array(kernels) == 3) < 0.85
    _assert_round_trips(generator=10, n=1)


def test_generator_11_samples_grouped_convolutions_of_narrow_groups():
    convs = _conv_attrs(opspace.sample({"conv": 600}, seed=0, generator=11))
    assert len(convs) >= 590  # a few drawn twice
    lo, hi = opspace_grouped.NARROW_GROUP_COUNTS
    groups = np.array([a["groups"] for a, _ in convs])
    per_group = np.array([a["in_channels"] // a["groups"] for a, _ in convs])
    assert all(1 < a["groups"] < a["in_channels"] for a, _ in convs)  # none dense or depthwise
    assert set(per_group) == set(opspace_grouped.NARROW_GROUP_WIDTHS)
    for w in opspace_grouped.NARROW_GROUP_WIDTHS:  # each width about a third
        assert 0.25 < np.mean(per_group == w) < 0.42
    assert groups.min() >= lo
    assert groups.max() <= hi
    # Log-uniform in the number of groups (capped by the widest convolution): about half
    # below the geometric middle (64); generator 10 draws none above 256.
    assert 0.4 < np.mean(groups < np.sqrt(lo * hi)) < 0.65
    assert np.mean(groups > 256) > 0.05
    # Narrow groups: generator 10 draws 8 channels a group or fewer a quarter of the time.
    ten = _conv_attrs(opspace.sample({"conv": 600}, seed=0, generator=10))
    assert np.mean([a["in_channels"] // a["groups"] <= 8 for a, _ in ten]) < 0.35
    assert np.mean(per_group <= 8) > 0.6
    _assert_grouped_on_stages(convs)
    kernels = np.array([a["kernel_size"][0] for a, _ in convs])
    assert 0.5 < np.mean(kernels == 3) < 0.75
    assert 0.12 < np.mean(kernels == 1) < 0.3
    _assert_round_trips(generator=11, n=1)


def test_generator_12_samples_a_network_stages_same_width_3x3_convolutions():
    convs = _conv_attrs(opspace.sample({"conv": 400}, seed=0, generator=12))
    assert len(convs) >= 300  # a small space: some drawn twice
    stages = _stage_maps()
    down = 0
    for a, shape in convs:
        cin, cout = a["in_channels"], a["out_channels"]
        assert a["groups"] == 1
        assert a["kernel_size"] == [3, 3] or shape[2] < 3
        assert a["dilation"] == [1, 1]
        assert 32 <= cin <= 2048
        assert cin & (cin - 1) == 0
        assert shape[0] & (shape[0] - 1) == 0
        assert shape[2] in stages
        if a["stride"] == [2, 2]:
            assert cout == 2 * cin  # a stage's first block doubles the width
            down += 1
        else:
            assert cout == cin
        # Within the default bounds: the batch halved where one step would exceed them.
        flops = 2 * shape[0] * cout * cin * 9 * (shape[2] // a["stride"][0]) ** 2
        assert flops <= 1.01 * opspace.MAX_FORWARD_FLOPS or shape[0] == 1
    assert 0.1 < down / len(convs) < 0.3
    # The other versions seldom draw it: 48 of rounds 1-27's 12,570 convolutions.
    nine = _conv_attrs(opspace.sample({"conv": 400}, seed=0, generator=9))
    same = [a for a, _ in nine if a["groups"] == 1 and a["kernel_size"] == [3, 3]]
    same = [a for a in same if a["stride"] == [1, 1] and a["in_channels"] == a["out_channels"]]
    assert len(same) < 0.1 * len(nine)
    _assert_round_trips(generator=12, n=1)


def _sampled_norms(generator: int) -> tuple[list[dict], list[str]]:
    """600 norms of ``generator``: their specs and their module types' short names."""
    table = opspace.sample({"norm": 600}, seed=0, generator=generator)
    norms = [json.loads(s) for s in table["spec"]]
    return norms, [n["type"].rsplit(".", 1)[-1] for n in norms]


def test_generator_13_samples_the_norms_of_a_networks_stages():
    norms, kinds = _sampled_norms(13)
    assert set(kinds) == {"BatchNorm2d", "LayerNorm", "LayerNorm2d"}
    assert 0.5 < kinds.count("BatchNorm2d") / len(kinds) < 0.7
    assert 0.15 < kinds.count("LayerNorm") / len(kinds) < 0.35
    stages = _stage_maps()
    tokens = {max((m // 4) ** 2, 1) + extra for m in stages for extra in (0, 1)}
    shapes = [n["inputs"][0]["shape"] for n in norms]
    for kind, n, shape in zip(kinds, norms, shapes, strict=True):
        assert shape[0] & (shape[0] - 1) == 0  # a power-of-two batch
        if kind == "LayerNorm":
            assert shape[1] in tokens
            assert n["attrs"]["normalized_shape"] == [shape[2]]
        else:
            assert shape[2] == shape[3]
            assert shape[2] in stages | {2}
            assert 8 <= shape[1] <= 2048
    # ViT's 197 and 50 tokens, Swin's 3,136 and 784.
    drawn = {s[1] for k, s in zip(kinds, shapes, strict=True) if k == "LayerNorm"}
    assert {197, 50, 3136, 784} & drawn
    # The few channels on a large map of networks' early layers: 32 or fewer on 96 or more.
    batchnorms = [s for k, s in zip(kinds, shapes, strict=True) if k == "BatchNorm2d"]
    assert sum(s[1] <= 32 and s[2] >= 96 for s in batchnorms) >= 5
    # Convolutions map as version 12 does; the other families as version 1.
    assert opspace.sample({"conv": 20}, seed=0, generator=13)["spec"].tolist() == (
        opspace.sample({"conv": 20}, seed=0, generator=12)["spec"].tolist()
    )
    counts = {f: 4 for f in opspace.FAMILIES if f not in ("conv", "norm")}
    assert opspace.sample(counts, seed=0, generator=13)["op_id"].tolist() == (
        opspace.sample(counts, seed=0, generator=1)["op_id"].tolist()
    )


def test_generator_14_samples_layernorms_on_a_stage_s_map_with_its_channels_last():
    norms, kinds = _sampled_norms(14)
    assert set(kinds) == {"BatchNorm2d", "LayerNorm", "LayerNorm2d"}
    assert 0.35 < kinds.count("BatchNorm2d") / len(kinds) < 0.55
    maps = [n for k, n in zip(kinds, norms, strict=True) if k == "LayerNorm"]
    maps = [n for n in maps if len(n["inputs"][0]["shape"]) == 4]
    assert 0.2 < len(maps) / len(norms) < 0.4
    stages = _stage_maps(opspace_stages.PATCH_HALVINGS)
    permuted = 0
    for n in maps:
        x = n["inputs"][0]
        batch, h, w, c = x["shape"]
        assert batch & (batch - 1) == 0  # a power-of-two batch
        assert h == w
        assert h in stages
        assert n["attrs"]["normalized_shape"] == [c]  # over the channels of each pixel
        if "stride" in x:  # a permuted view of an NCHW map: channels h*w apart
            assert x["stride"] == [c * h * w, w, 1, h * w]
            permuted += 1
    assert 0.2 < permuted / len(maps) < 0.45  # a third: Swin's first LayerNorm
    # Swin's and ConvNeXt's stage maps of a 224 input: 56, 28, 14 and 7, about as often.
    drawn = [n["inputs"][0]["shape"][1] for n in maps]
    assert {56, 28, 14, 7} <= set(drawn)
    assert 0.15 < np.mean([d >= 32 for d in drawn]) < 0.45
    # Tokens of a patch network: ViT's 197 and 50, Swin's 3,136 and 784.
    tokens = [
        n["inputs"][0]["shape"] for k, n in zip(kinds, norms, strict=True) if k == "LayerNorm"
    ]
    assert {197, 50, 3136, 784} <= {s[1] for s in tokens if len(s) == 3}
    # Generator 13's norms stay as they were: round 30's samples are drawn again.
    assert opspace.sample({"norm": 50}, seed=0, generator=13)["spec"].tolist() != (
        opspace.sample({"norm": 50}, seed=0, generator=14)["spec"].tolist()
    )
    assert opspace.sample({"conv": 20}, seed=0, generator=14)["spec"].tolist() == (
        opspace.sample({"conv": 20}, seed=0, generator=12)["spec"].tolist()
    )
    # LayerNorms on a map, contiguous and permuted, round-trip with their strides.
    us = opspace.points("norm", 600, seed=0)
    drawn = [opspace.FAMILIES["norm"].params(u, 14) for u in us]
    on_map = [p.get("permuted") for p in drawn]
    points = [us[on_map.index(True)], us[on_map.index(False)]]
    _assert_round_trips(generator=14, n=2, family="norm", points=points)


def test_generator_15_samples_grouped_convolutions_of_few_groups_on_a_stage_s_maps():
    attrs = _conv_attrs(opspace.sample({"conv": 400}, seed=0, generator=15))
    stages = _stage_maps()
    groups = [a["groups"] for a, _ in attrs]
    assert set(groups) == set(range(2, 9))
    assert groups.count(8) < groups.count(2)  # log-uniform: as many 2-3 as 4-8
    for a, shape in attrs:
        per_group = a["in_channels"] // a["groups"]
        assert a["in_channels"] == per_group * a["groups"]
        assert per_group in opspace_grouped.GROUP_WIDTHS
        assert a["out_channels"] in (a["in_channels"], 2 * a["in_channels"])
        assert shape[2] in stages
        assert shape[0] & (shape[0] - 1) == 0  # a power-of-two batch
    threes = [a for a, _ in attrs if a["kernel_size"] == [3, 3]]
    assert 0.6 < len(threes) / len(attrs) < 0.8
    # Versions 13 and 14 map convolutions as 12; norms map at 15 as at 14.
    twelve = opspace.sample({"conv": 20}, seed=0, generator=12)["spec"].tolist()
    for version in (13, 14):
        assert opspace.sample({"conv": 20}, seed=0, generator=version)["spec"].tolist() == twelve
    assert opspace.sample({"norm": 20}, seed=0, generator=15)["spec"].tolist() == (
        opspace.sample({"norm": 20}, seed=0, generator=14)["spec"].tolist()
    )
    _assert_round_trips(generator=15, n=2)


def test_generator_16_samples_a_network_block_s_1x1_convolutions_on_a_stage_s_maps():
    attrs = _conv_attrs(opspace.sample({"conv": 600}, seed=0, generator=16))
    assert len(attrs) > 590  # a few small ones repeat
    stages = _stage_maps()
    ratios = []
    for a, shape in attrs:
        cin, cout = a["in_channels"], a["out_channels"]
        assert a["kernel_size"] == [1, 1]
        assert a["groups"] == 1
        assert a["padding"] == [0, 0]
        assert a["stride"] in ([1, 1], [2, 2])
        assert 16 <= cin <= 2048
        assert 8 <= cout <= 2048
        assert cin % 8 == 0
        assert cout % 8 == 0
        assert shape[2] in stages
        assert shape[2] == shape[3]
        assert shape[0] & (shape[0] - 1) == 0  # a power-of-two batch
        ratios.append(cout / cin)
    ratios = np.array(ratios)
    # Kept (a fifth), expanded by a bottleneck's 4 or an inverted residual's 6, reduced as
    # much; the clipped ones at 8 and 2,048 channels aside.
    assert 0.15 < np.mean(ratios == 1) < 0.3
    assert np.mean(ratios == 4) > 0.05
    assert np.mean(ratios == 0.25) > 0.1
    assert np.mean(np.isclose(ratios, 6)) > 0.03
    assert 0.1 < np.mean([a["stride"] == [2, 2] for a, _ in attrs]) < 0.3
    # ResNet's widths (powers of two) and the multiples of 8 of MobileNet's.
    widths = np.array([a["in_channels"] for a, _ in attrs])
    assert 0.35 < np.mean(widths & (widths - 1) == 0) < 0.65
    assert np.mean(widths % 32 != 0) > 0.1
    # Norms map at 16 as at 14; earlier rounds' convolutions stay as measured.
    assert opspace.sample({"norm": 20}, seed=0, generator=16)["spec"].tolist() == (
        opspace.sample({"norm": 20}, seed=0, generator=14)["spec"].tolist()
    )
    assert opspace.sample({"conv": 20}, seed=0, generator=15)["spec"].tolist() != (
        opspace.sample({"conv": 20}, seed=0, generator=16)["spec"].tolist()
    )
    _assert_round_trips(generator=16, n=2)


def test_generator_17_samples_an_attention_block_s_matrix_products_on_views():
    table = opspace.sample({"matmul": 400}, seed=0, generator=17)
    products = [json.loads(s) for s in table["spec"]]
    kinds = [p["type"] for p in products]
    assert 0.4 < kinds.count("torch.functional.einsum") / len(kinds) < 0.6
    assert set(kinds) == {"torch.functional.einsum", "torch.matmul"}
    tokens, fused = set(), 0
    for p in products:
        a, b = (i["shape"] for i in p["inputs"])
        rank = 5 if p["type"] == "torch.functional.einsum" else 4
        assert len(a) == len(b) == rank
        assert a[0] & (a[0] - 1) == 0  # a power-of-two batch (times the window groups)
        if p["type"] == "torch.functional.einsum":
            assert p["args"][0] in ("bghid,bghjd->bghij", "bghij,bghjd->bghid")
        # Scores: q (tokens, head) times k; values: the (tokens, tokens) scores times v.
        n, d = a[-2], (b[-1] if a[-1] == a[-2] else a[-1])
        assert d in opspace_draw.HEAD_DIMS[0]
        tokens.add(n)
        fused += any("stride" in i for i in p["inputs"])
    drawn = opspace_draw.ATTENTION_TOKENS[0]  # or halved, where the bounds shrink the largest
    assert all(any(t >> s == n for t in drawn for s in range(4)) for n in tokens)
    assert {49, 197} <= tokens
    assert 0.7 < fused / len(products) < 0.9  # q, k, v as views of a fused projection
    # A fused q's strides: the (tokens, 3, heads, head) projection, heads moved ahead.
    q = next(
        p["inputs"][0] for p in products
        if p["type"] == "torch.functional.einsum" and "stride" in p["inputs"][0]
    )  # fmt: skip
    b, g, h, n, d = q["shape"]
    assert q["stride"] == [g * n * 3 * h * d, n * 3 * h * d, d, 3 * h * d, 1]
    # Other families map at 17 as at 16; matrix products of generators 1-16 stay.
    assert opspace.sample({"conv": 20}, seed=0, generator=17)["spec"].tolist() == (
        opspace.sample({"conv": 20}, seed=0, generator=16)["spec"].tolist()
    )
    assert opspace.sample({"matmul": 20}, seed=0, generator=16)["spec"].tolist() == (
        opspace.sample({"matmul": 20}, seed=0, generator=1)["spec"].tolist()
    )
    # Each round-trips through extraction, as a network's call.
    _assert_round_trips(generator=17, n=4, family="matmul")


def test_generator_18_samples_a_network_s_first_layer_on_an_rgb_image():
    attrs = _conv_attrs(opspace.sample({"conv": 400}, seed=0, generator=18))
    assert len(attrs) > 390
    patches = 0
    for a, shape in attrs:
        (k, _), (s, _), (pad, _) = a["kernel_size"], a["stride"], a["padding"]
        assert a["in_channels"] == shape[1] == 3
        assert a["groups"] == 1
        assert 16 <= a["out_channels"] <= 2048
        assert shape[2] == shape[3]
        assert shape[0] & (shape[0] - 1) == 0  # a power-of-two batch
        if k == s and pad == 0:  # a patch embedding: the map cut into k x k patches
            assert k in opspace_conv.PATCH_SIZES[0]
            patches += 1
        else:  # an overlapping stem, padded by half its kernel
            assert k in opspace_conv.STEM_KERNELS[0]
            assert s in opspace_conv.STEM_STRIDES[0]
            assert pad == k // 2
        # An input size networks run at, halved only where the bounds shrink it.
        sizes = opspace_stages.INPUT_SIZES[0]
        assert any(size >> h == shape[2] for size in sizes for h in range(3))
    assert 0.4 < patches / len(attrs) < 0.6
    kernels = {a["kernel_size"][0] for a, _ in attrs}
    assert {11, 16, 32} <= kernels  # wider than any other version draws
    # Other families map at 18 as at 17.
    assert opspace.sample({"matmul": 20}, seed=0, generator=18)["spec"].tolist() == (
        opspace.sample({"matmul": 20}, seed=0, generator=17)["spec"].tolist()
    )
    _assert_round_trips(generator=18, n=2)


def test_generator_19_samples_a_transformer_block_s_linear_layers_and_heads():
    table = opspace.sample({"linear": 400}, seed=0, generator=19)
    layers = [json.loads(s) for s in table["spec"]]
    assert len(layers) > 390
    ranks, ratios, heads = [], [], 0
    for p in layers:
        (x,) = p["inputs"]
        fin, fout = p["attrs"]["in_features"], p["attrs"]["out_features"]
        shape = x["shape"]
        assert shape[-1] == fin
        assert shape[0] & (shape[0] - 1) == 0  # a power-of-two batch
        ranks.append(len(shape))
        if len(shape) == 2:  # a classifier head
            heads += 1
            assert 32 <= fin <= 2048
            continue
        assert fin % 8 == 0
        assert fout % 8 == 0
        if len(shape) == 3:  # an attention block's tokens, or fewer where the bounds shrink
            drawn = opspace_draw.ATTENTION_TOKENS[0]
            assert any(t >> s == shape[1] for t in drawn for s in range(4))
        else:  # a stage's channels-last map
            assert shape[1] == shape[2]
        ratios.append(fout / fin)
    ranks = np.array(ranks)
    assert 0.1 < np.mean(ranks == 2) < 0.3
    assert 0.3 < np.mean(ranks == 3) < 0.5
    assert 0.3 < np.mean(ranks == 4) < 0.5
    ratios = np.array(ratios)
    # q, k, v (3), projections (1), an MLP's expansion (4) and its contraction (1/4).
    for r in (3, 1, 4, 1 / 4):
        assert np.mean(np.isclose(ratios, r, rtol=0.05)) > 0.1
    classes = [p["attrs"]["out_features"] for p in layers if len(p["inputs"][0]["shape"]) == 2]
    assert 0.3 < classes.count(1000) / heads < 0.7
    # Other families map at 19 as at 18; linear layers of generators 1-18 stay.
    assert opspace.sample({"conv": 20}, seed=0, generator=19)["spec"].tolist() == (
        opspace.sample({"conv": 20}, seed=0, generator=18)["spec"].tolist()
    )
    assert opspace.sample({"linear": 20}, seed=0, generator=18)["spec"].tolist() == (
        opspace.sample({"linear": 20}, seed=0, generator=1)["spec"].tolist()
    )
    _assert_round_trips(generator=19, n=4, family="linear")


def test_generator_20_samples_a_transformer_block_s_attention():
    from opcost.model.op_spec import OpSpec
    from opcost.model.shapes import fast_path

    table = opspace.sample({"attention": 400}, seed=0, generator=20)
    calls = [json.loads(s) for s in table["spec"]]
    assert len(calls) > 350  # a categorical space: a few small ones repeat
    mha = [c for c in calls if c["type"].endswith("MultiheadAttention")]
    assert 0.6 < len(mha) / len(calls) < 0.8
    heads = []
    for c in calls:
        x = c["inputs"][0]["shape"]
        assert x[0] & (x[0] - 1) == 0  # a power-of-two batch
        if c in mha:  # (batch, tokens, heads x head)
            h, e = c["attrs"]["num_heads"], c["attrs"]["embed_dim"]
            tokens, head = x[1], e // h
        else:  # (batch, heads, tokens, head)
            h, tokens, head = x[1], x[2], x[3]
        assert h in opspace_draw.TRANSFORMER_HEADS[0]
        assert head in opspace_draw.HEAD_DIMS[0]
        drawn = opspace_draw.ATTENTION_TOKENS[0]  # or fewer, where the bounds shrink them
        assert any(t >> s == tokens for t in drawn for s in range(4))
        heads.append(h)
    assert np.mean(np.array(heads) % 2 == 0) > 0.9
    # Most modules may take PyTorch's fused inference path, as ViT's 12 heads do.
    assert np.mean([fast_path(OpSpec(c, None)) for c in mha]) > 0.9
    # Other families map at 20 as at 19; attention of generators 1-19 stays.
    assert opspace.sample({"linear": 20}, seed=0, generator=20)["spec"].tolist() == (
        opspace.sample({"linear": 20}, seed=0, generator=19)["spec"].tolist()
    )
    assert opspace.sample({"attention": 20}, seed=0, generator=19)["spec"].tolist() == (
        opspace.sample({"attention": 20}, seed=0, generator=1)["spec"].tolist()
    )
    _assert_round_trips(generator=20, n=4, family="attention")


def test_generator_3_samples_grouped_convolutions_more_often_as_networks_build_them():
    two = _conv_attrs(opspace.sample({"conv": 400}, seed=0, generator=2))
    three = _conv_attrs(opspace.sample({"conv": 400}, seed=0, generator=3))

    def grouped(convs):
        return [a for a, _ in convs if 1 < a["groups"] < a["in_channels"]]

    # Quantiles of the kind: grouped above 0.85 (generator 2), above 0.6 (generator 3).
    assert 0.10 < len(grouped(two)) / 400 < 0.20
    assert 0.33 < len(grouped(three)) / 400 < 0.47
    per_group = {a["in_channels"] // a["groups"] for a in grouped(three)}
    assert per_group == {4, 8, 16, 24, 32, 48, 64}
    for a in grouped(three):
        assert a["out_channels"] in (a["in_channels"], 2 * a["in_channels"])
    # Maps of 1-224, as generator 2.
    assert min(shape[2] for _, shape in three) == 1


def test_generator_4_samples_dense_3x3_convolutions_on_every_map_of_7_to_64():
    table = opspace.sample({"conv": 400}, seed=0, generator=4)
    convs = _conv_attrs(table)
    for a, _ in convs:
        assert (a["kernel_size"], a["stride"], a["padding"]) == ([3, 3], [1, 1], [1, 1])
        assert (a["groups"], a["dilation"]) == (1, [1, 1])
        assert 64 <= a["in_channels"] <= 1024
        assert 64 <= a["out_channels"] <= 2048
    maps = np.array([shape[2] for _, shape in convs])
    # Uniform over the 58 maps of 7-64 (not log-uniform: as many of 50-64 as of 7-21),
    # unless a configuration above the size bounds had its map halved (after its batch).
    drawn = maps[[shape[0] > 1 for _, shape in convs]]
    assert set(drawn) == set(range(7, 65))
    assert 0.2 < np.mean(drawn >= 50) < 0.32
    same = [a["out_channels"] == a["in_channels"] for a, _ in convs]
    assert 0.4 < np.mean(same) < 0.65
    _assert_round_trips(generator=4, n=5)


def test_generator_5_draws_generator_4s_convolutions_with_powers_of_two():
    four = _conv_attrs(opspace.sample({"conv": 300}, seed=0, generator=4))
    five = _conv_attrs(opspace.sample({"conv": 300}, seed=0, generator=5))
    powers = {2**i for i in range(12)}
    assert {a["in_channels"] for a, _ in five} == {64, 128, 256, 512, 1024}
    assert {a["out_channels"] for a, _ in five} <= powers
    assert {shape[0] for _, shape in five} <= powers
    assert {a["in_channels"] for a, _ in four} - powers  # generator 4's widths: any grain
    # Generator 4's maps and kernels: dense 3x3 on maps of 7-64.
    for a, shape in five:
        assert (a["kernel_size"], a["groups"]) == ([3, 3], 1)
        assert 7 <= shape[2] <= 64
    assert len({shape[2] for _, shape in five}) > 50


def _shapes(table):
    specs_ = [json.loads(s) for s in table["spec"]]
    return [
        (f, t, [i["shape"] for i in sp["inputs"]], sp.get("attrs", {}).get("groups"))
        for f, t, sp in zip(table["family"], table["type"], specs_, strict=True)
    ]


def test_the_committed_rounds_are_what_the_study_config_samples():
    """config/op-space.yaml, sampled again, gives the committed samples of each round: the
    generator version a round names keeps it as measured."""
    study = load_study_file(REPO / "config/op-space.yaml")
    rounds = osw.op_space_round_counts(study)
    assert len(rounds) == 59
    for r in range(2, len(rounds) + 1):
        params = osw.op_space_round_params(study, r)
        committed = pd.read_parquet(DATA / f"samples-r{r}.parquet")
        again = opspace.sample(
            params["samples"], seed=params["seed"], starts=params["starts"], round_=r,
            generator=params["generator"],
        )  # fmt: skip
        # Op ids hash module attributes, which differ between torch versions (GroupNorm's
        # ``bias``): the configurations are compared by their types and tensor shapes.
        assert _shapes(again) == _shapes(committed), r
    assert osw.op_space_round_params(study, 5)["generator"] == 2
    assert osw.op_space_round_params(study, 6)["generator"] == 3
    assert osw.op_space_round_params(study, 7)["generator"] == 4
    assert osw.op_space_round_params(study, 8)["generator"] == 5
    generators = [osw.op_space_round_params(study, r)["generator"] for r in range(9, 16)]
    assert generators == [6, 6, 5, 7, 7, 8, 8]
    generators = [osw.op_space_round_params(study, r)["generator"] for r in range(18, 54)]
    expected = [6, 8, 6, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 13, 14, 14, 9, 15, 15, 15, 15]
    expected += [16, 16, 17, 17, 18, 18, 19, 19, 20, 20, 10, 10, 11, 20]
    assert generators == expected
    assert osw.op_space_sampling_params(study)["generator"] == 1


def test_sampled_widths_are_mostly_aligned_as_networks_use_them() -> None:
    """Widths follow the grains networks use (multiples of 8-64), within their ranges."""
    us = np.random.default_rng(1).random(4000)
    widths = np.array([opspace_draw.width(u, 8, 2048) for u in us])
    assert widths.min() >= 8
    assert widths.max() <= 2048
    share8 = np.mean(widths % 8 == 0)
    # Grain 1 (weight 0.15) leaves a width unaligned unless it falls on a multiple of 8.
    assert 0.8 < share8 < 0.95
    assert np.mean(widths % 32 == 0) > 0.4
    # Log-uniform: about as many widths below 128 as above (the geometric middle).
    assert 0.4 < np.mean(widths < 128) < 0.6
    # Dense convolutions with both widths aligned to 16 (or RGB input): most of them.
    table = opspace.sample({"conv": 200}, seed=0)
    attrs = [json.loads(s)["attrs"] for s in table["spec"]]
    dense = [a for a in attrs if a["groups"] == 1]
    aligned = [
        a for a in dense
        if (a["in_channels"] % 16 == 0 or a["in_channels"] == 3) and a["out_channels"] % 16 == 0
    ]  # fmt: skip
    assert len(aligned) > 0.5 * len(dense)


# -- where the power windows go ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("step_gpu_s", "repeats"),
    [(2e-6, 256), (10e-6, 100), (0.3e-3, 4), (1e-3, 1), (5e-3, 1), (0.0, 1)],
)
def test_a_power_window_graph_holds_a_millisecond_of_kernels(step_gpu_s, repeats):
    # 1 ms / 10 us = 100 steps; 1 ms / 0.3 ms = 3.33, so 4; 2 us would need 500: capped.
    assert om.GRAPH_REPLAY_GPU_S == 1e-3
    assert om.GRAPH_MAX_REPEATS == 256
    assert om.graph_repeats(step_gpu_s) == repeats


@pytest.mark.parametrize(
    ("long_step_s", "expected"),
    [(math.inf, (om.WARMUP_STEPS, om.TRACE_STEPS, om.HOST_REPEATS)), (0.0, om.LONG_REPEATS)],
)
def test_a_long_step_is_warmed_traced_and_timed_fewer_times(monkeypatch, long_step_s, expected):
    """Steps counted where they run: a short step keeps 3 warm-up steps, 3 traced ones
    and 3 host bursts; one at least ``LONG_STEP_S`` long 3, 2 and 3."""
    assert (om.WARMUP_STEPS, om.TRACE_STEPS, om.HOST_REPEATS) == (3, 3, 3)
    assert om.LONG_REPEATS == (3, 2, 3)
    assert om.repeats(om.LONG_STEP_S) == om.LONG_REPEATS
    assert om.repeats(om.LONG_STEP_S * 0.99) == (3, 3, 3)
    monkeypatch.setattr(om, "LONG_STEP_S", long_step_s)
    count = {"steps": 0, "traced": None, "bursts": None}
    prepare, profile_, host_times = harness.prepare_op, om.tracing._profile, om.tracing._host_times

    def counted_prepare(*a, **k):
        workload = prepare(*a, **k)
        step = workload.step

        def counted_step():
            count["steps"] += 1
            step()

        workload.step = counted_step
        return workload

    def counted_profile(workload, device, annotator, steps):
        count["traced"] = steps
        return profile_(workload, device, annotator, steps)

    def counted_host_times(workload, device, burst, repeats):
        count["bursts"] = repeats
        return host_times(workload, device, burst, repeats)

    monkeypatch.setattr(harness, "prepare_op", counted_prepare)
    monkeypatch.setattr(om.tracing, "_profile", counted_profile)
    monkeypatch.setattr(om.tracing, "_host_times", counted_host_times)
    params = {"type": "function", "batch": 1, "heads": 1, "rows": 4, "cols": 16}
    row = om.measure_one(opspace.build("softmax", params), harness.HarnessOptions(device="cpu"))
    assert row["status"] == "ok"
    warmup, traced, bursts = expected
    assert count["traced"] == traced
    assert count["bursts"] == bursts
    # Inference: workload.step() runs the warm-up, the traced steps and the host bursts,
    # of 8 steps each here (a CPU step launches no kernel: tracing.host_burst_steps).
    assert count["steps"] == warmup + traced + 8 * bursts


@pytest.mark.parametrize(("n", "k"), [(640, 6), (64, 6), (5, 6), (7, 0)])
def test_the_power_samples_are_spread_evenly_over_each_family(tmp_path, n, k):
    from opcost.opspace_workflow import run_op_space_samples

    out = tmp_path / "samples.parquet"
    params = {"samples": {"softmax": n}, "power_samples": k, "seed": 0, "generator": 2}
    run_op_space_samples(params, str(out))
    marked = pd.read_parquet(out)["power"].to_numpy().nonzero()[0]
    assert len(marked) == min(n, k)
    if len(marked) > 1:  # evenly: the gaps between marks differ by one at most
        gaps = np.diff(marked)
        assert gaps.max() - gaps.min() <= 1
        assert marked[-1] == n - 1


def test_a_measured_convolutions_busy_time_never_exceeds_its_summed_kernel_time():
    """The union of a step's kernel intervals is at most their summed durations, and
    equal where they do not overlap: so in the H100 re-measurement of 240 sampled
    convolutions (tests/data/opspace_busy, 2026-11-26) every row's busy time lies in
    (0, sum] (to 0.1 %: each is a median over the traced steps, taken apart), dense
    convolutions keep the GPU busy for their whole sum nearly always, and grouped ones,
    whose kernels cuDNN runs on several streams, often do not."""
    table = pd.read_parquet(REPO / "tests" / "data" / "opspace_busy" / "opspace_busy.parquet")
    ok = table[(table["status"] == "ok") & (table["gpu_time_s"] > 0)]
    assert len(ok) == len(table) == 960
    share = ok["gpu_busy_time_s"] / ok["gpu_time_s"]
    assert (share > 0).all()
    assert (share <= 1.001).all()
    grouped = ok["groups"] > 1
    assert (share[~grouped] < 0.9).mean() < 0.02
    assert (share[grouped] < 0.9).mean() > 0.1


@pytest.mark.parametrize("csv", ["opspace_path_check_h100.csv", "opspace_path_check_notf32.csv"])
def test_the_op_spaces_measuring_path_gives_the_studies_kernel_times(csv):
    """Ops of the network studies measured the op space's way on another H100 host
    (tests/data/opspace_path_check, TF32 on and off): their kernel times are the
    committed ones within 1 % (median) per op type, so the op models learn the same
    quantity the networks' ops are scored against."""
    import pandas as pd

    path = Path(__file__).parent / "data" / "opspace_path_check" / csv
    d = pd.read_csv(path)
    ratio = (d["os"] / d["study"]).groupby(d["f"]).median()
    assert len(ratio) == 6
    assert (ratio - 1).abs().max() < 0.03
    assert abs((d["os"] / d["study"]).median() - 1) < 0.01


def test_two_h200_boards_agree_on_the_time_from_a_cuda_graph():
    """Round 51 and chunk 1 of round 52 measured again on another H200 board
    (tests/data/opspace_graph_repeat, 2026-11-29): a call's time replayed from a graph
    repeats as its kernel time does, and so does the graph share the op models learn,
    for the grouped convolutions whose per-group kernels run at once from a graph."""
    repeat = REPO / "tests" / "data" / "opspace_graph_repeat"
    chunks = ("r51-0", "r51-1", "r52-1")
    first = pd.concat([pd.read_parquet(DATA / "h200" / f"{c}.parquet") for c in chunks])
    again = pd.concat([pd.read_parquet(repeat / f"h200_{c}_repeat.parquet") for c in chunks])
    both = first.merge(again, on=["op_id", "mode"], suffixes=("", "_again"))
    assert len(both) == len(first) == len(again) == 698
    assert (both["gpu_uuid"] != both["gpu_uuid_again"]).all()
    assert (both["status"] == "ok").all()
    assert (both["status_again"] == "ok").all()
    graph = both["graph_time_s_again"] / both["graph_time_s"]
    kernel = both["gpu_time_s_again"] / both["gpu_time_s"]
    assert (graph - 1).abs().median() < 0.01
    assert (graph - 1).abs().le(0.05).mean() > 0.9
    assert (kernel - 1).abs().median() < 0.01
    again_cols = {c: c.removesuffix("_again") for c in both if c.endswith("_again")}
    second = both[list(again_cols)].rename(columns=again_cols)
    multi = shares.kernels_per_pass(both) > shares.GRAPH_MIN_KERNELS
    assert multi.sum() >= 300
    share, share_again = shares.graph_share(both)[multi], shares.graph_share(second)[multi]
    assert (share < 0.8).mean() > 0.25  # many such calls do run faster from a graph
    assert np.median(np.abs(share_again / share - 1)) < 0.02


def test_two_h100_boards_agree_on_kernel_time_but_not_on_power():
    """Round 17 measured again on another H100 board (tests/data/opspace_power_repeat,
    2026-11-27): every configuration and mode again, its kernels' time within 5 % nearly
    always, its window's mean power a median 9 % higher on the second board, as its idle
    power is; the floor under any busy-power model learnt from several boards."""
    first = pd.read_parquet(DATA / "h100" / "r17-0.parquet")
    again = pd.read_parquet(
        REPO / "tests" / "data" / "opspace_power_repeat" / "h100_r17_repeat.parquet"
    )
    both = first.merge(again, on=["op_id", "mode"], suffixes=("", "_again"))
    assert len(both) == len(first) == len(again) == 120
    assert (both["gpu_uuid"] != both["gpu_uuid_again"]).all()
    time = both["gpu_time_s_again"] / both["gpu_time_s"]
    power = both["power_w_again"] / both["power_w"]
    idle = both["idle_power_w_again"] / both["idle_power_w"]
    assert (time - 1).abs().median() < 0.02
    assert (time - 1).abs().le(0.05).mean() > 0.9
    assert 1.05 < power.median() < 1.15
    assert (power > 1).mean() > 0.85
    assert 1.05 < idle.median() < 1.15


#: Generator 21's families and the op types each draws.
_GENERATOR_21 = {
    "linear": {"torch.nn.functional.linear"},
    "activation": {"torch.nn.functional.relu", "torch.sigmoid"},
    "pool": {
        "torch.nn.functional.max_pool2d",
        "torch.nn.functional.avg_pool2d",
        "torch.nn.functional.adaptive_avg_pool2d",
    },
    "softmax": {"torch.nn.functional.softmax"},
    "elementwise": {"torch.nn.functional.normalize", "torch.Tensor.add", "torch.Tensor.mul"},
    "copy": {"torch.nn.functional.pad", "torch.roll", "torch.Tensor.reshape"},
}


def _signature(spec):
    """How a call is made, whatever its sizes: its type, which inputs are parameters, and
    the keyword arguments it names; for the ops of an attention block's query, which
    inputs are strided views."""
    query = spec["type"] in ("torch.nn.functional.normalize", "torch.Tensor.mul")
    return (
        spec["type"],
        spec["kind"],
        tuple(t["param"] for t in spec["inputs"]),
        tuple("stride" in t for t in spec["inputs"]) if query else (),
        tuple(sorted(spec["kwargs"])),
    )


def test_generator_21_samples_the_calls_networks_make_as_functions_and_round_trips():
    table = opspace.sample({f: 80 for f in _GENERATOR_21}, seed=0, generator=21)
    for family, types in _GENERATOR_21.items():
        assert set(table.loc[table["family"] == family, "type"]) == types, family
        fam = opspace.FAMILIES[family]
        for u in opspace.points(family, 6, seed=5):
            params, spec = opspace.fit(family, fam.params(u, 21), 21)
            call = fam.call(params)
            found = [s for s in extract_ops(_InANetwork(call), (1,)) if s["type"] == spec["type"]]
            assert [specs.op_id(s) for s in found] == [specs.op_id(spec)], family
    # Every reshape copies: none could view its strided input.
    from opcost.model.roofline import view_strides

    for spec in map(json.loads, table.loc[table["type"] == "torch.Tensor.reshape", "spec"]):
        (x,), (out,) = spec["inputs"], spec["outputs"]
        assert view_strides(x["shape"], x["stride"], out["shape"]) is None
    # The smallest of each family rebuild from their specs and run on the CPU, both modes.
    table["numel"] = [_numel(json.loads(s)) for s in table["spec"]]
    for spec in table.sort_values("numel").groupby("type").head(1)["spec"].map(json.loads):
        for training in (False, True):
            op = specs.rebuild(spec, inplace_ok=not training)
            with torch.set_grad_enabled(training):
                out = op(specs.random_inputs(spec, requires_grad=training))
            assert list(out.shape) == spec["outputs"][0]["shape"], spec["type"]
            if training:
                out.sum().backward()


def test_generator_21_calls_are_made_as_torchvision_s_networks_make_them():
    """Each call generator 21 draws has the signature (:func:`_signature`) of one that a
    torchvision network makes: Swin's windowed attention, DenseNet's functional ReLU
    and pooling, Inception's functional max and average pooling."""

    class InceptionPools(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Identity()

        def forward(self, x):
            x = self.layer(x)
            x = torch.nn.functional.max_pool2d(x, kernel_size=3, stride=2)
            return torch.nn.functional.avg_pool2d(x, kernel_size=3, stride=1, padding=1)

    from opcost.extract import extract_model_input
    from opcost.names import ModelInput

    seen = {
        _signature(json.loads(s))
        for name in ("swin_t", "swin_v2_t", "densenet121")
        for s in extract_model_input(ModelInput(name, (2, 3, 64, 64)))["spec"]
    }
    seen |= {_signature(s) for s in extract_ops(InceptionPools(), (1, 8, 17, 17))}
    table = opspace.sample({f: 60 for f in _GENERATOR_21}, seed=1, generator=21)
    drawn = {_signature(json.loads(s)) for s in table["spec"]}
    assert drawn - seen == set()


def test_generator_22_samples_a_table_gathered_by_indices_spread_over_its_rows():
    table = opspace.sample({"copy": 80}, seed=0, generator=22)
    assert set(table["type"]) == {"torch.Tensor.__getitem__"}
    gathers = [json.loads(s) for s in table["spec"]]
    rows = [g["inputs"][0]["shape"][0] for g in gathers]
    # Relative position tables of windows of 7, 8, 12 and 16, and others.
    assert {169, 225, 529, 961} <= set(rows)
    assert {g["inputs"][0]["param"] for g in gathers} == {True, False}
    _assert_round_trips(22, 4, "copy", opspace.points("copy", 4, seed=5))
    # Measured, the indices spread over the table's rows, and the backward accumulates.
    small = min(gathers, key=_numel)
    table_, index = specs.random_inputs(small, requires_grad=True)
    rows = small["inputs"][0]["shape"][0]
    assert int(index.min()) >= 0
    assert int(index.max()) < rows
    assert index.unique().numel() > 2  # not the 0s and 1s of other integer inputs
    out = specs.rebuild(small, inplace_ok=False)([table_, index])
    out.sum().backward()
    counts = torch.bincount(index, minlength=table_.shape[0]).float()
    assert torch.equal(table_.grad[:, 0], counts)


def _index_pattern(spec):
    """How a view indexes its input, whatever its sizes: the type, the index with each
    integer as ``i``, the keyword arguments, and whether the input is a strided view."""
    index = json.dumps(spec["args"][1:])
    for n in sorted({int(v) for v in __import__("re").findall(r"-?\d+", index)}, reverse=True):
        index = index.replace(str(n), "i")
    return spec["type"], index, tuple(sorted(spec["kwargs"])), "stride" in spec["inputs"][0]


def test_generator_23_samples_views_of_part_of_a_tensor_as_networks_take_them():
    """Generator 23's views take a part of a tensor as Swin (q, k, v; patch merging's
    quarters; V2's crop of its padded windows), ViT (the class token), ShuffleNet V2 and
    MaxViT (``chunk``) do; each round-trips through extraction; in training the backward
    pass writes the whole input's gradient, which the roofline counts (X + 2 O; a split:
    X + O), and in inference a view moves nothing."""
    from opcost.extract import extract_model_input
    from opcost.model import roofline as rl
    from opcost.names import ModelInput

    table = opspace.sample({"copy": 120}, seed=0, generator=23)
    drawn = [json.loads(s) for s in table["spec"]]
    seen = {
        _index_pattern(json.loads(s))
        for name, shape in (
            ("swin_t", (2, 3, 64, 64)),
            ("swin_v2_t", (2, 3, 64, 64)),
            ("vit_b_16", (1, 3, 224, 224)),
            ("shufflenet_v2_x0_5", (2, 3, 64, 64)),
            ("maxvit_t", (1, 3, 224, 224)),
        )
        for s, t in extract_model_input(ModelInput(name, shape))[["spec", "type"]].itertuples(
            index=False
        )
        if t.endswith(("__getitem__", "chunk"))
    }
    patterns = {_index_pattern(s) for s in drawn}
    assert patterns <= seen
    assert len(patterns) == 6  # q, k or v; a token; a quarter; a crop; two chunks
    _assert_round_trips(23, 6, "copy", opspace.points("copy", 6, seed=5))
    for spec in drawn:
        whole = 4 * math.prod(spec["inputs"][0]["shape"])
        parts = sum(4 * math.prod(o["shape"]) for o in spec["outputs"])
        split = spec["type"].endswith("chunk")
        if split:
            assert parts == whole
        else:
            assert parts < whole
        assert rl.op_work(spec, "training").bytes == whole + (1 if split else 2) * parts
        assert rl.op_work(spec, "inference").bytes == 0
    # The smallest of each kind rebuilds and runs both modes on the CPU, and its backward
    # pass gives the whole input a gradient: the part's where taken, zeros elsewhere.
    for spec in sorted(drawn, key=_numel)[:30]:
        x = specs.random_inputs(spec, requires_grad=True)[0]
        out = specs.rebuild(spec, inplace_ok=False)([x])
        parts = list(out) if isinstance(out, tuple) else [out]
        for k, part in enumerate(parts):
            part.backward(torch.full_like(part, k + 1.0), retain_graph=True)
        assert x.grad.shape == x.shape
        assert float(x.grad.sum()) == sum((k + 1.0) * p.numel() for k, p in enumerate(parts))


def test_a_function_call_is_recorded_as_extraction_sees_it():
    """``F.pad(x, pad)`` without its defaults: torch hands the recorder ``mode`` and
    ``value`` by name, and the op space records the spec a network's call has."""
    x = torch.empty(2, 3, 4, 4, device="meta")
    call = opspace_draw.function_call(torch.nn.functional.pad, x, (1, 1))
    spec = opspace.record(call)
    assert spec["kwargs"] == {"mode": "constant", "value": None}
    (found,) = [s for s in extract_ops(_InANetwork(call), (1,)) if s["type"] == spec["type"]]
    assert specs.canonical_json(found) == specs.canonical_json(spec)


def _signed_pattern(spec):
    """How a call indexes, whatever its sizes: its index and value with each integer as
    ``i`` or ``-i``."""
    index = json.dumps(spec["args"][1:])
    return re.sub(r"-?\d+", lambda m: "-i" if m.group().startswith("-") else "i", index)


def test_generator_24_samples_writes_into_part_of_a_tensor_as_networks_make_them():
    """Generator 24's writes ``x[index] = value``: the index patterns of Swin's
    shifted-window masks are among them; each round-trips through extraction; its output is
    the part written, which the roofline counts with the value read; rebuilt on the CPU it
    writes the value there, and in training a tensor value gets the part's gradient."""
    from opcost.extract import extract_model_input
    from opcost.model import roofline as rl
    from opcost.names import ModelInput

    table = opspace.sample({"copy": 160}, seed=0, generator=24)
    drawn = [json.loads(s) for s in table["spec"]]
    assert {s["type"] for s in drawn} == {"torch.Tensor.__setitem__"}
    swin = extract_model_input(ModelInput("swin_t", (1, 3, 224, 224)))
    masks = {
        _signed_pattern(json.loads(s))
        for s, t in swin[["spec", "type"]].itertuples(index=False)
        if t.endswith("__setitem__")
    }
    assert len(masks) == 9  # three bands a side
    assert masks <= {_signed_pattern(s) for s in drawn}
    kinds = Counter(len(s["inputs"]) for s in drawn)  # 1: a scalar value; 2: a tensor's
    assert kinds[1] > 40
    assert kinds[2] > 40
    _assert_round_trips(24, 8, "copy", opspace.points("copy", 8, seed=5))
    for spec in drawn:
        target, *value = spec["inputs"]
        part = 4 * math.prod(spec["outputs"][0]["shape"])
        assert 0 < part < 4 * math.prod(target["shape"])
        read = sum(4 * math.prod(v["shape"]) for v in value)
        assert rl.op_work(spec, "inference").bytes == part + read
        assert rl.op_work(spec, "training").bytes == part + read + (part + read if value else 0)
    for spec in sorted(drawn, key=_numel)[:30]:
        inputs = specs.random_inputs(spec, requires_grad=True)
        out = specs.rebuild(spec, inplace_ok=False)(inputs)
        assert out.shape == tuple(spec["inputs"][0]["shape"])
        if len(inputs) == 2:
            out.backward(torch.ones_like(out))
            assert float(inputs[1].grad.sum()) == inputs[1].numel()
        else:
            assert not out.requires_grad


def test_generator_25_samples_depthwise_convolutions_on_a_stage_s_map():
    """Generator 25's convolutions are depthwise, as MobileNet, EfficientNet and ConvNeXt
    build theirs: a group a channel, the width kept and aligned to 8, no wider input than
    2**21 elements an image unless 16 channels, a kernel of 3, 5 or 7 (3 or 1 where the map
    is narrower), on a network's stage map; half of them channels-last and half with a
    bias; each round-trips through extraction."""
    table = opspace.sample({"conv": 300}, seed=0, generator=25)
    drawn = [json.loads(s) for s in table["spec"]]
    assert len(drawn) > 290
    stage_maps = {size >> h for size in opspace_stages.INPUT_SIZES[0] for h in range(8)}
    last = bias = 0
    for c in drawn:
        a, (x,) = c["attrs"], c["inputs"]
        b, ch, h, w = x["shape"]
        assert a["groups"] == a["in_channels"] == a["out_channels"] == ch
        assert ch >= 16
        assert ch % 8 == 0
        assert ch == 16 or ch * h * w <= 2**21
        assert h == w
        assert h in stage_maps
        assert b & (b - 1) == 0  # a power-of-two batch
        k = a["kernel_size"][0]
        assert k in (3, 5, 7) or (k == 1 and h < 3)
        assert k <= h or k == 1
        assert a["padding"][0] == k // 2
        last += x.get("stride") == [ch * h * w, 1, w * ch, ch]
        bias += a["bias"]
    assert 0.4 < last / len(drawn) < 0.6
    assert 0.4 < bias / len(drawn) < 0.6
    assert {3, 5, 7} <= {c["attrs"]["kernel_size"][0] for c in drawn}
    # Other families map at 25 as at 24.
    assert opspace.sample({"copy": 20}, seed=0, generator=25)["spec"].tolist() == (
        opspace.sample({"copy": 20}, seed=0, generator=24)["spec"].tolist()
    )
    _assert_round_trips(generator=25, n=2)
