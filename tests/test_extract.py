"""Operation extraction, checked against counts worked out by hand from the architectures."""

import json
import subprocess
import sys
from collections import Counter

import pandas as pd
import pytest
import torch
import torchvision

from opcost import spec as specs
from opcost.extract import (
    ExtractionError,
    extract_model_input,
    extract_ops,
    unique_ops,
)
from opcost.names import ModelInput
from opcost.networks import build_model

CONV = "torch.nn.modules.conv.Conv2d"
BN = "torch.nn.modules.batchnorm.BatchNorm2d"
RELU = "torch.nn.modules.activation.ReLU"
ADD = "torch.Tensor.add_"  # `out += identity` resolves to the in-place add


def _ops(model, shape, **kw):
    table = extract_model_input(ModelInput(model, shape), **kw)
    rows = []
    for _, r in table.iterrows():
        spec = json.loads(r["spec"])
        rows.append((spec, int(r["count"])))
    return table, rows


def _count(rows, type_name, shape=None, **attrs):
    total = 0
    for spec, count in rows:
        if spec["type"] != type_name:
            continue
        if shape is not None and spec["inputs"][0]["shape"] != list(shape):
            continue
        if any(spec.get("attrs", {}).get(k) != v for k, v in attrs.items()):
            continue
        total += count
    return total


@pytest.fixture(scope="module")
def resnet18():
    return _ops("resnet18", (1, 3, 224, 224))


def test_resnet18_layers_by_hand(resnet18):
    """ResNet-18 at 224x224: stem, 4 stages of 2 BasicBlocks, head (He et al. 2016)."""
    table, rows = resnet18
    # Stem: conv 7x7/2 -> 112x112, BN, ReLU, max-pool 3x3/2 -> 56x56.
    assert _count(rows, CONV, (1, 3, 224, 224), kernel_size=[7, 7], stride=[2, 2]) == 1
    assert _count(rows, BN, (1, 64, 112, 112)) == 1
    assert _count(rows, RELU, (1, 64, 112, 112)) == 1
    assert _count(rows, "torch.nn.modules.pooling.MaxPool2d", (1, 64, 112, 112)) == 1
    # Stage 1: two blocks of two 3x3 convs at 64x56x56, no downsampling.
    assert _count(rows, CONV, (1, 64, 56, 56), kernel_size=[3, 3], stride=[1, 1]) == 4
    assert _count(rows, BN, (1, 64, 56, 56)) == 4
    assert _count(rows, RELU, (1, 64, 56, 56)) == 4  # the block's ReLU runs twice
    # Stages 2-4: first block downsamples (3x3/2 conv + 1x1/2 shortcut conv with its BN).
    for c_in, c, hw in ((64, 128, 28), (128, 256, 14), (256, 512, 7)):
        prev = (1, c_in, hw * 2, hw * 2)
        here = (1, c, hw, hw)
        assert _count(rows, CONV, prev, kernel_size=[3, 3], stride=[2, 2]) == 1
        assert _count(rows, CONV, prev, kernel_size=[1, 1], stride=[2, 2]) == 1
        assert _count(rows, CONV, here, kernel_size=[3, 3], stride=[1, 1]) == 3
        assert _count(rows, BN, here) == 5
        assert _count(rows, RELU, here) == 4
    # Head.
    assert _count(rows, "torch.nn.modules.pooling.AdaptiveAvgPool2d", (1, 512, 7, 7)) == 1
    assert _count(rows, "torch.nn.modules.linear.Linear", (1, 512)) == 1
    # Distinct ops: 4 stem + 4 stage-1 + 3 x 6 later stages + pool, flatten, fc.
    assert len(table) == 4 + 4 + 18 + 3
    # Calls: 4 + 14 + 3 x 16 + 3.
    assert int(table["count"].sum()) == 69


def test_resnet18_residual_additions_are_functional_ops(resnet18):
    _, rows = resnet18
    for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        assert _count(rows, ADD, (1, c, hw, hw)) == 2
    assert sum(count for spec, count in rows if spec["kind"] == "function") == 8 + 1
    assert _count(rows, "torch.flatten", (1, 512, 1, 1)) == 1


def test_functional_ops_can_be_switched_off():
    table, rows = _ops("resnet18", (1, 3, 224, 224), functional_ops=False)
    assert all(spec["kind"] == "module" for spec, _ in rows)
    assert int(table["count"].sum()) == 69 - 9


def test_attention_is_one_operation_per_block():
    """vit_b_16: 12 encoder blocks, each one MultiheadAttention over 197 tokens of 768."""
    _, rows = _ops("vit_b_16", (2, 3, 224, 224))
    mha = [(s, c) for s, c in rows if s["type"].endswith("MultiheadAttention")]
    assert sum(c for _, c in mha) == 12
    assert mha[0][0]["inputs"][0]["shape"] == [2, 197, 768]
    assert mha[0][0]["attrs"]["num_heads"] == 12
    assert mha[0][0]["kwargs"]["need_weights"] is False
    # out_proj is a child of the attention, not an op of its own: the only Linear layers
    # are the 2 per MLP block and the head.
    assert _count(rows, "torch.nn.modules.linear.Linear") == 12 * 2 + 1


class _OwnAttention(torch.nn.Module):
    """A network's own composite of no op family: it computes with its children's weights
    without calling them, as torchvision's ShiftedWindowAttention does."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = torch.nn.functional.linear(x, self.qkv.weight, self.qkv.bias).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        return torch.nn.functional.linear(a @ v, self.proj.weight, self.proj.bias)


def test_a_composite_of_no_op_family_is_the_calls_it_makes():
    net = torch.nn.Sequential(torch.nn.LayerNorm(16), _OwnAttention())
    types = [s["type"] for s in extract_ops(net, (2, 5, 16))]
    assert types == [
        "torch.nn.modules.normalization.LayerNorm",
        "torch.nn.functional.linear",
        "torch.Tensor.chunk",
        "torch.Tensor.transpose",
        "torch.Tensor.matmul",
        "torch.softmax",
        "torch.Tensor.matmul",
        "torch.nn.functional.linear",
    ]


def test_swin_attention_is_its_products():
    """swin_t: 2 + 2 + 6 + 2 = 12 blocks, each a ShiftedWindowAttention whose forward runs
    F.linear for its qkv and proj weights, two matrix products and a softmax."""
    _, rows = _ops("swin_t", (1, 3, 224, 224))
    assert _count(rows, "torchvision.models.swin_transformer.ShiftedWindowAttention") == 0
    assert _count(rows, "torch.nn.functional.linear") == 12 * 2
    assert _count(rows, "torch.nn.functional.softmax") + _count(rows, "torch.Tensor.softmax") == 12
    matmuls = sum(_count(rows, t) for t in ("torch.Tensor.matmul", "torch.matmul"))
    assert matmuls == 12 * 2
    # the MLPs' Linear modules (2 a block), the 3 patch mergings' reductions and the head
    assert _count(rows, "torch.nn.modules.linear.Linear") == 12 * 2 + 3 + 1


class _Attend(torch.nn.Module):
    """Attention over x: self-attention (query, key and value the same tensor), or a
    projected query."""

    def __init__(self, self_attention: bool):
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)
        self.proj = torch.nn.Linear(16, 16)
        self.self_attention = self_attention

    def forward(self, x):
        q = x if self.self_attention else self.proj(x)
        return self.mha(q, x, x, need_weights=False)[0]


def test_one_tensor_passed_several_times_stays_one_input():
    """MultiheadAttention(x, x, x) runs PyTorch's fused self-attention in inference (it
    checks query is key is value); three inputs would measure the general path instead."""
    (mha,) = [s for s in extract_ops(_Attend(True), (2, 5, 16)) if "Multihead" in s["type"]]
    assert mha["args"] == [{"__tensor__": 0}] * 3
    assert [i["shape"] for i in mha["inputs"]] == [[2, 5, 16]]
    (mha,) = [s for s in extract_ops(_Attend(False), (2, 5, 16)) if "Multihead" in s["type"]]
    assert mha["args"] == [{"__tensor__": 0}, {"__tensor__": 1}, {"__tensor__": 1}]
    assert len(mha["inputs"]) == 2
    # vit_b_16's attention is self-attention in all 12 blocks.
    _, rows = _ops("vit_b_16", (2, 3, 224, 224))
    ((spec, count),) = [(s, c) for s, c in rows if s["type"].endswith("MultiheadAttention")]
    assert (spec["args"], len(spec["inputs"]), count) == ([{"__tensor__": 0}] * 3, 1, 12)


@pytest.mark.parametrize("model", ["convnext_tiny", "vit_b_16", "shufflenet_v2_x0_5"])
def test_meta_extraction_records_the_strides_a_real_forward_pass_sees(model):
    """On meta a convolution's output is contiguous whatever its input; on CPU and CUDA it
    keeps a channels-last input's format. The recorder corrects that, so every spec, its
    strides included, is what a real forward pass on the CPU records."""
    meta = extract_ops(build_model(model), (2, 3, 224, 224))
    cpu = extract_ops(build_model(model), (2, 3, 224, 224), device="cpu")
    assert meta == cpu
    assert any("stride" in i for s in cpu for i in s["inputs"])


def test_convnext_runs_channels_last_after_its_stem():
    """convnext_tiny, by hand: each block and each downsampling layer permutes to
    channels-last for its LayerNorm and back, so every Conv2d but the stem's (18 depthwise
    convolutions, 3 downsampling) sees a channels-last input, and each block's LayerNorm a
    contiguous one. LayerNorm2d sees what comes before it: contiguous after the stem conv
    and in the classifier (1x1 pixels: both formats at once), channels-last before each of
    the 3 downsampling convolutions."""
    _, rows = _ops("convnext_tiny", (2, 3, 224, 224))

    def calls(type_name, channels_last):
        n = 0
        for spec, count in rows:
            if spec["type"] != type_name:
                continue
            x = spec["inputs"][0]
            shape = torch.Size(x["shape"])
            if channels_last:
                wanted = torch.empty(shape, memory_format=torch.channels_last).stride()
                n += count * (x.get("stride") == list(wanted))
            else:
                n += count * ("stride" not in x)
        return n

    assert (calls(CONV, True), calls(CONV, False)) == (18 + 3, 1)
    assert calls("torch.nn.modules.normalization.LayerNorm", False) == 18
    norm2d = "torchvision.models.convnext.LayerNorm2d"
    assert (calls(norm2d, False), calls(norm2d, True)) == (2, 3)


@pytest.mark.parametrize("model_input", ["vgg11_8x3x224x224", "squeezenet1_1_8x3x224x224"])
def test_ops_with_contiguous_inputs_keep_the_op_ids_they_were_measured_under(model_input):
    """Specs name the strides only of non-contiguous inputs, so a network whose ops all
    take contiguous tensors keeps the op_ids of the committed study (extracted with the
    code before strides were recorded): its measurements stay valid."""
    committed = pd.read_parquet(f"data/hopper/ops/{model_input}.parquet")
    model, shape = model_input.rsplit("_", 1)
    fresh = extract_model_input(ModelInput(model, tuple(int(n) for n in shape.split("x"))))
    assert sorted(fresh["op_id"]) == sorted(committed["op_id"])


def test_user_model_from_import_path():
    table, rows = _ops("toymodels.nets:tiny_mlp", (8, 16))
    types = Counter()
    for spec, count in rows:
        types[spec["type"]] += count
    assert types["torch.nn.modules.linear.Linear"] == 2
    assert types["toymodels.nets.Scale"] == 1
    assert types["torch.tanh"] == 1
    assert types["torch.Tensor.add"] == 1
    scale = next(s for s, _ in rows if s["type"] == "toymodels.nets.Scale")
    assert scale["attrs"]["factor"] == 0.5
    assert table["model_input"].unique().tolist() == ["toymodels.nets.tiny_mlp_8x16"]


@pytest.mark.parametrize(
    ("model", "shape", "message"),
    [
        ("resnet_eighteen", (1, 3, 64, 64), "resnet_eighteen_1x3x64x64"),
        ("toymodels.nets:nope", (1, 16), "toymodels.nets.nope_1x16"),
        ("toymodels.nets:not_a_module", (1, 16), "not a torch.nn.Module"),
        ("resnet18", (1, 3, 0, 64), "resnet18_1x3x0x64"),
        ("resnet18", (1, 5, 64, 64), "resnet18_1x5x64x64"),
    ],
)
def test_bad_model_input_names_the_set(model, shape, message):
    with pytest.raises(ExtractionError, match=message):
        extract_model_input(ModelInput(model, shape))


def test_op_id_is_stable_across_processes(resnet18):
    table, _ = resnet18
    spec_text = table["spec"].iloc[0]
    code = (
        "import json,sys; from opcost.spec import op_id; print(op_id(json.loads(sys.stdin.read())))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], input=spec_text, capture_output=True, text=True, check=True
    )
    assert other.stdout.strip() == table["op_id"].iloc[0]


def test_op_id_golden_value():
    """A spec's id must not change between versions: users' raw logs are named by it."""
    spec = {
        "kind": "module",
        "type": "torch.nn.modules.activation.ReLU",
        "attrs": {"inplace": False},
        "args": [{"__tensor__": 0}],
        "kwargs": {},
        "inputs": [{"shape": [1, 8], "dtype": "float32", "param": False}],
        "outputs": [{"shape": [1, 8], "dtype": "float32"}],
    }
    text = (
        '{"args":[{"__tensor__":0}],"attrs":{"inplace":false},"inputs":[{"dtype":"float32",'
        '"param":false,"shape":[1,8]}],"kind":"module","kwargs":{},"outputs":[{"dtype":'
        '"float32","shape":[1,8]}],"type":"torch.nn.modules.activation.ReLU"}'
    )
    assert specs.canonical_json(spec) == text
    import hashlib

    assert specs.op_id(spec) == hashlib.sha256(text.encode()).hexdigest()[:16]


def _run_rebuilt(spec, device):
    op = specs.rebuild(spec, device=device)
    if op.module is not None:
        op.module.eval()
    inputs = specs.random_inputs(spec, device=device)
    with torch.no_grad():
        out = op(inputs)
    if spec["type"] == "torch.Tensor.__setitem__":  # the part of the target it wrote
        args = specs.decode_value(spec["args"], inputs, torch.device(device))
        out = specs.call_output(torch.Tensor.__setitem__, args, None)
    return specs.output_specs(out)


class _Buffers(torch.nn.Module):
    """Writes into part of a tensor, ``x[index] = value``, as networks make them: the
    bands of a mask built from the input's shape (Swin's shifted windows'), and the
    input written after a class token into a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        mask = x.new_zeros((8, 8))
        mask[0:-4, -4:-2] = 3
        tokens = x.new_zeros((x.shape[0], x.shape[1] + 1, 4))
        tokens[:, 1:] = x
        return tokens.sum() + mask.sum()


def test_a_write_into_part_of_a_tensor_is_an_op_that_writes_the_part():
    """``x[index] = value`` returns nothing, but runs a kernel: it is recorded with the
    part of ``x`` it writes as its output, and rebuilt it writes the value there."""
    found = extract_ops(_Buffers(), (2, 3, 4))
    sets = [s for s in found if s["type"] == "torch.Tensor.__setitem__"]
    assert len(sets) == 2
    mask, tokens = sets
    assert mask["inputs"] == [{"shape": [8, 8], "dtype": "float32", "param": False}]
    assert mask["args"][1:] == [
        {"__tuple__": [{"__slice__": [0, -4, None]}, {"__slice__": [-4, -2, None]}]},
        3,
    ]
    assert mask["outputs"] == [{"shape": [4, 2], "dtype": "float32"}]  # rows 0-3, cols 4-5
    assert [i["shape"] for i in tokens["inputs"]] == [[2, 4, 4], [2, 3, 4]]
    assert tokens["args"][2] == {"__tensor__": 1}
    assert tokens["outputs"] == [{"shape": [2, 3, 4], "dtype": "float32"}]
    for spec in sets:
        assert _run_rebuilt(spec, "cpu") == spec["outputs"]
    target = torch.zeros(8, 8)
    written = specs.rebuild(mask)([target])
    assert written is target
    assert float(target.sum()) == 3 * 4 * 2
    assert float(target[0:4, 4:6].min()) == 3


class _MaskedWrite(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        x[x > 0] = 0.0
        return x


def test_a_write_through_a_boolean_mask_on_meta_is_left_out_not_failed():
    """``x[x > 0] = 0``: on ``meta`` the part's shape depends on data nobody has, so no
    spec is kept for the write; extraction goes on."""
    types = [s["type"] for s in extract_ops(_MaskedWrite(), (2, 4))]
    assert types == ["torch.nn.modules.linear.Linear", "torch.Tensor.gt"]


def test_a_rebuilt_write_into_part_of_a_tensor_trains_its_value():
    """In a training step the harness makes every floating input need a gradient; the
    rebuilt write goes into a fresh detached view of the target, so that autograd allows
    it, and the value's gradient is the output gradient's part."""
    (_, tokens) = [
        s for s in extract_ops(_Buffers(), (2, 3, 4)) if s["type"].endswith("__setitem__")
    ]
    target, value = specs.random_inputs(tokens, requires_grad=True)
    out = specs.rebuild(tokens, inplace_ok=False)([target, value])
    grad = torch.arange(out.numel(), dtype=torch.float32).reshape(out.shape)
    out.backward(grad)
    assert torch.equal(value.grad, grad[:, 1:])
    assert target.grad is None
    assert torch.equal(out[:, 1:], value.detach())


def test_swin_builds_its_shifted_windows_masks_band_by_band():
    """swin_t at 224: the shifted blocks of stages 1-3 (1 + 1 + 3) build their attention
    mask in nine writes each, ``mask[h0:h1, w0:w1] = count``; stage 4's map is one window,
    unshifted."""
    table = extract_model_input(ModelInput("swin_t", (1, 3, 224, 224)))
    sets = table[table["type"] == "torch.Tensor.__setitem__"]
    assert int(sets["count"].sum()) == 5 * 9
    maps = {json.loads(s)["inputs"][0]["shape"][0] for s in sets["spec"]}
    assert maps == {56, 28, 14}


@pytest.mark.parametrize(
    "model", ["resnet18", "vit_b_16", "convnext_tiny", "toymodels.nets:tiny_mlp"]
)
def test_rebuilt_ops_run_on_cpu_with_the_recorded_output_shape(model):
    shape = (8, 16) if ":" in model else (1, 3, 224, 224)
    _, rows = _ops(model, shape)
    for spec, _ in rows:
        assert _run_rebuilt(spec, "cpu") == spec["outputs"], spec["type"]


def test_unique_ops_merges_networks():
    a = extract_model_input(ModelInput("resnet18", (1, 3, 64, 64)))
    b = extract_model_input(ModelInput("resnet34", (1, 3, 64, 64)))
    u = unique_ops([a, b])
    assert set(u["op_id"]) == set(a["op_id"]) | set(b["op_id"])
    assert u["op_id"].is_unique
    # ResNet-34 has the same layer shapes as ResNet-18, only more blocks.
    assert set(b["op_id"]) == set(a["op_id"])
    assert (u["networks"] == "resnet18_1x3x64x64,resnet34_1x3x64x64").all()


CLASSIFIERS = sorted(torchvision.models.list_models(module=torchvision.models))


@pytest.mark.slow
@pytest.mark.parametrize("model", CLASSIFIERS)
def test_every_torchvision_classifier_extracts_and_rebuilds(model):
    """Extraction at (2,3,224,224); every op rebuilt from its spec alone gives its shapes."""
    table, rows = _ops(model, (2, 3, 224, 224))
    assert len(table) > 0
    for spec, _ in rows:
        assert _run_rebuilt(spec, "meta") == spec["outputs"], spec["type"]


# --- issue 19: a wrong input shape fails on the meta device ------------------------------

_PEAK_RSS = """
import resource, sys
from opcost.extract import ExtractionError, extract_model_input
from opcost.names import ModelInput

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    extract_model_input(ModelInput("resnet18", (2048, 4, 224, 224)))
except ExtractionError as e:
    print(e, file=sys.stderr)
else:
    sys.exit("extraction did not fail")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_wrong_channel_count_fails_on_meta_without_building_the_input():
    """resnet18 takes 3 channels: at (2048, 4, 224, 224) the forward pass fails on the meta
    device, and must not be retried on the CPU, where the input alone is
    2048 * 4 * 224 * 224 * 4 bytes = 1,644 MB."""
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "model-input set resnet18_2048x4x224x224: forward pass failed" in proc.stderr
    growth_mb = int(proc.stdout.strip()) / 1024  # ru_maxrss is in KiB on Linux
    assert growth_mb < 200, f"peak RSS grew by {growth_mb:.0f} MB while extracting"
