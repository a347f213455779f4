"""Roofline work (FLOPs, DRAM bytes) of ops against hand calculations, and peak rates."""

import copy
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from opcost.model.op_spec import FAMILIES, OpSpec, family_of
from opcost.model.roofline import (
    Peaks,
    RooflineError,
    Work,
    op_work,
    roofline_time_s,
    roofline_times_s,
    view_strides,
)

ROOT = Path(__file__).resolve().parents[1]
UNIQUE = sorted(ROOT.glob("data/hopper*/ops/unique.parquet"))
OP_SPACE = ROOT / "data/op-space"
PEAKS = Peaks(matmul_flops_per_s=400e12, memory_bytes_per_s=3e12)

# Real specs, copied from data/hopper-large/ops/unique.parquet (test_specs_are_real).
CONV3X3 = (
    '{"args":[{"__tensor__":0}],"attrs":{"bias":true,"dilation":[1,1],"groups":1,'
    '"in_channels":16,"kernel_size":[3,3],"out_channels":64,"output_padding":[0,0],'
    '"padding":[1,1],"padding_mode":"zeros","stride":[1,1],"transposed":false},'
    '"inputs":[{"dtype":"float32","param":false,"shape":[64,16,55,55]}],"kind":"module",'
    '"kwargs":{},"outputs":[{"dtype":"float32","shape":[64,64,55,55]}],'
    '"type":"torch.nn.modules.conv.Conv2d"}'
)
DEPTHWISE = (
    '{"args":[{"__tensor__":0}],"attrs":{"bias":true,"dilation":[1,1],"groups":192,'
    '"in_channels":192,"kernel_size":[7,7],"out_channels":192,"output_padding":[0,0],'
    '"padding":[3,3],"padding_mode":"zeros","stride":[1,1],"transposed":false},'
    '"inputs":[{"dtype":"float32","param":false,"shape":[64,192,28,28],'
    '"stride":[150528,1,5376,192]}],"kind":"module","kwargs":{},'
    '"outputs":[{"dtype":"float32","shape":[64,192,28,28]}],'
    '"type":"torch.nn.modules.conv.Conv2d"}'
)
LINEAR3D = (
    '{"args":[{"__tensor__":0}],"attrs":{"bias":true,"in_features":768,"out_features":3072},'
    '"inputs":[{"dtype":"float32","param":false,"shape":[64,197,768]}],"kind":"module",'
    '"kwargs":{},"outputs":[{"dtype":"float32","shape":[64,197,3072]}],'
    '"type":"torch.nn.modules.linear.Linear"}'
)
MHA = (
    '{"args":[{"__tensor__":0},{"__tensor__":0},{"__tensor__":0}],"attrs":{"add_bias_kv":false,'
    '"add_zero_attn":false,"batch_first":true,"bias":true,"bias_k":null,"bias_v":null,'
    '"dropout":0.0,"embed_dim":768,"head_dim":64,"kdim":768,"num_heads":12,"vdim":768},'
    '"inputs":[{"dtype":"float32","param":false,"shape":[64,197,768]}],"kind":"module",'
    '"kwargs":{"need_weights":false},"outputs":[{"dtype":"float32","shape":[64,197,768]}],'
    '"type":"torch.nn.modules.activation.MultiheadAttention"}'
)
BATCHNORM = (
    '{"args":[{"__tensor__":0}],"attrs":{"affine":true,"eps":1e-05,"momentum":0.1,'
    '"num_features":512,"track_running_stats":true},"inputs":[{"dtype":"float32",'
    '"param":false,"shape":[64,512,7,7]}],"kind":"module","kwargs":{},'
    '"outputs":[{"dtype":"float32","shape":[64,512,7,7]}],'
    '"type":"torch.nn.modules.batchnorm.BatchNorm2d"}'
)
RELU = (
    '{"args":[{"__tensor__":0}],"attrs":{"inplace":true},"inputs":[{"dtype":"float32",'
    '"param":false,"shape":[64,400,7,7]}],"kind":"module","kwargs":{},'
    '"outputs":[{"dtype":"float32","shape":[64,400,7,7]}],'
    '"type":"torch.nn.modules.activation.ReLU"}'
)
VIEW = (
    '{"args":[{"__tensor__":0},64,192,7,7],"inputs":[{"dtype":"float32","param":false,'
    '"shape":[64,96,2,7,7]}],"kind":"function","kwargs":{},"outputs":[{"dtype":"float32",'
    '"shape":[64,192,7,7]}],"type":"torch.Tensor.view"}'
)
CONTIGUOUS = (
    '{"args":[{"__tensor__":0}],"inputs":[{"dtype":"float32","param":false,'
    '"shape":[64,24,2,28,28],"stride":[37632,784,18816,28,1]}],"kind":"function",'
    '"kwargs":{},"outputs":[{"dtype":"float32","shape":[64,24,2,28,28]}],'
    '"type":"torch.Tensor.contiguous"}'
)
STOCHASTIC_DEPTH = (
    '{"args":[{"__tensor__":0}],"attrs":{"mode":"row","p":0.017647058823529415},'
    '"inputs":[{"dtype":"float32","param":false,"shape":[64,192,28,28],'
    '"stride":[150528,1,5376,192]}],"kind":"module","kwargs":{},'
    '"outputs":[{"dtype":"float32","shape":[64,192,28,28]}],'
    '"type":"torchvision.ops.stochastic_depth.StochasticDepth"}'
)
DROPOUT = (
    '{"args":[{"__tensor__":0}],"attrs":{"inplace":false,"p":0.5},"inputs":[{"dtype":'
    '"float32","param":false,"shape":[64,4096]}],"kind":"module","kwargs":{},'
    '"outputs":[{"dtype":"float32","shape":[64,4096]}],'
    '"type":"torch.nn.modules.dropout.Dropout"}'
)
REAL = [CONV3X3, DEPTHWISE, LINEAR3D, MHA, BATCHNORM, RELU, VIEW, CONTIGUOUS]
REAL += [STOCHASTIC_DEPTH, DROPOUT]


def spec_of(text: str) -> dict:
    return json.loads(text)


def unique_specs() -> list[str]:
    return [s for path in UNIQUE for s in pd.read_parquet(path, columns=["spec"])["spec"]]


def test_specs_are_real() -> None:
    real = {json.dumps(json.loads(s), sort_keys=True) for s in unique_specs()}
    for text in REAL:
        assert json.dumps(json.loads(text), sort_keys=True) in real


def test_conv3x3_by_hand() -> None:
    work = op_work(spec_of(CONV3X3), "inference")
    # Output 64 x 64 x 55 x 55 = 12,390,400 elements, each 16 x 3 x 3 = 144 multiply-adds.
    assert work.flops == 2 * 12_390_400 * 144 == 3_568_435_200
    # Input 64*16*55*55 = 3,097,600; output 12,390,400; weight 64*16*9 = 9,216; bias 64.
    assert work.bytes == 4 * (3_097_600 + 12_390_400 + 9_216 + 64) == 61_989_120
    # Memory-bound at 400 TFLOP/s and 3 TB/s: 61,989,120 B / 3e12 B/s = 20.66304 us.
    assert roofline_time_s(work, PEAKS) == pytest.approx(20.66304e-6, rel=1e-12)
    training = op_work(spec_of(CONV3X3), "training")
    assert training == Work(3 * 3_568_435_200, 3 * 61_989_120)


def test_depthwise_conv_by_hand() -> None:
    work = op_work(spec_of(DEPTHWISE), "inference")
    # groups = channels: each of 64*192*28*28 = 9,633,792 outputs sees 1 channel x 7 x 7.
    assert work.flops == 2 * 9_633_792 * 49 == 944_111_616
    # Input and output 9,633,792 each (the input's channels-last strides change nothing),
    # weight 192 x 1 x 7 x 7 = 9,408, bias 192.
    assert work.bytes == 4 * (2 * 9_633_792 + 9_408 + 192)
    assert roofline_time_s(work, PEAKS) == pytest.approx(4 * 19_277_184 / 3e12)


def test_linear_on_tokens_by_hand() -> None:
    work = op_work(spec_of(LINEAR3D), "inference")
    # 64 x 197 = 12,608 tokens, 768 -> 3072: 12,608 * 3072 outputs, 768 multiply-adds each.
    assert work.flops == 2 * 12_608 * 3072 * 768 == 59_492_007_936
    # Input 12,608*768 = 9,682,944; output 12,608*3072 = 38,731,776;
    # weight 768*3072 = 2,359,296; bias 3,072.
    assert work.bytes == 4 * (9_682_944 + 38_731_776 + 2_359_296 + 3_072)
    # Compute-bound: 59,492,007,936 / 400e12 = 148.73 us (bytes: 67.7 us).
    assert roofline_time_s(work, PEAKS) == pytest.approx(148.73001984e-6)


def test_bmm_by_hand() -> None:
    spec = {
        "kind": "function",
        "type": "torch.bmm",
        "args": [{"__tensor__": 0}, {"__tensor__": 1}],
        "kwargs": {},
        "inputs": [
            {"shape": [8, 128, 64], "dtype": "float32", "param": False},
            {"shape": [8, 64, 256], "dtype": "float32", "param": False},
        ],
        "outputs": [{"shape": [8, 128, 256], "dtype": "float32"}],
    }
    work = op_work(spec, "inference")
    assert work.flops == 2 * 8 * 128 * 256 * 64 == 33_554_432
    assert work.bytes == 4 * (8 * 128 * 64 + 8 * 64 * 256 + 8 * 128 * 256) == 1_835_008
    # In half precision every tensor is 2 bytes wide.
    assert op_work(spec, "inference", dtype="float16").bytes == 1_835_008 / 2
    assert op_work(spec, "training") == Work(3 * 33_554_432, 3 * 1_835_008)


def test_multihead_attention_by_hand() -> None:
    work = op_work(spec_of(MHA), "inference")
    n, length, e = 64, 197, 768  # self-attention: source length = target length
    projections = 2 * n * length * 3 * e * e
    scores = 2 * n * length * length * e  # QK^T over 12 heads of 64
    weighted = 2 * n * length * length * e  # AV
    out = 2 * n * length * e * e
    assert work.flops == projections + scores + weighted + out
    assert work.flops == 2 * 64 * 197 * 768 * (4 * 768 + 2 * 197)
    tokens = 64 * 197 * 768  # 9,682,944
    params = 4 * 768 * 768 + 4 * 768  # in_proj (3E x E, 3E) and out_proj (E x E, E)
    # Input once (passed three times), output, parameters, q/k/v and the context, each
    # written and read once.
    assert work.bytes == 4 * (tokens + tokens + params + 2 * 3 * tokens + 2 * tokens)
    assert work.bytes == 4 * 99_191_808


def test_batchnorm_by_hand() -> None:
    n = 64 * 512 * 7 * 7  # 1,605,632 elements
    work = op_work(spec_of(BATCHNORM), "inference")
    assert work.flops == 5 * n == 8_028_160
    assert work.bytes == 4 * (n + n + 2 * 512) == 12_849_152  # x, y, weight and bias
    training = op_work(spec_of(BATCHNORM), "training")
    # Backward: read dy and x, write dx, read the weight and write its gradient.
    assert training.bytes == 12_849_152 + 4 * (n + n + n + 2 * 1024) == 32_124_928
    assert training.flops == 2 * 8_028_160


def test_broadcast_add_by_hand() -> None:
    spec = {
        "kind": "function",
        "type": "torch.Tensor.add",
        "args": [{"__tensor__": 0}, {"__tensor__": 1}],
        "kwargs": {},
        "inputs": [
            {"shape": [64, 192, 28, 28], "dtype": "float32", "param": False},
            {"shape": [192, 1, 1], "dtype": "float32", "param": False},
        ],
        "outputs": [{"shape": [64, 192, 28, 28], "dtype": "float32"}],
    }
    big = 64 * 192 * 28 * 28  # 9,633,792
    work = op_work(spec, "inference")
    assert work.flops == big
    # The broadcast operand is read once, at its own size.
    assert work.bytes == 4 * (big + 192 + big) == 77_071_104
    training = op_work(spec, "training")
    # Backward: read dy, write both input gradients.
    assert training.bytes == 77_071_104 + 4 * (big + big + 192)
    inplace = dict(spec, type="torch.Tensor.__iadd__")
    assert op_work(inplace, "inference") == work


def test_views_are_free() -> None:
    assert op_work(spec_of(VIEW), "inference") == Work(0.0, 0.0)
    assert op_work(spec_of(VIEW), "training") == Work(0.0, 0.0)
    strided = spec_of(VIEW)
    strided["inputs"][0]["stride"] = [18816, 49, 9408, 7, 1]
    assert op_work(strided, "inference") == Work(0.0, 0.0)


def test_a_view_of_part_of_its_input_writes_the_whole_gradient_in_training() -> None:
    """``qkv[1]`` of a (3, 4, 5) tensor: free in inference; in training its backward pass
    writes zeros over the whole input (240 B) and copies the part's gradient in (80 B read,
    80 written). ``chunk`` into two: the whole gradient written, both halves read. A view
    of the whole (``x[None]``) and an integer tensor's part stay free."""
    select = {
        "kind": "function",
        "type": "torch.Tensor.__getitem__",
        "args": [{"__tensor__": 0}, 1],
        "kwargs": {},
        "inputs": [{"shape": [3, 4, 5], "dtype": "float32", "param": False}],
        "outputs": [{"shape": [4, 5], "dtype": "float32"}],
    }
    assert op_work(select, "inference") == Work(0.0, 0.0)
    assert op_work(select, "training") == Work(0.0, 240 + 2 * 80)
    chunk = dict(
        select,
        type="torch.Tensor.chunk",
        args=[{"__tensor__": 0}, 2],
        kwargs={"dim": 1},
        outputs=[{"shape": [3, 2, 5], "dtype": "float32"}] * 2,
    )
    assert op_work(chunk, "training") == Work(0.0, 240 + 240)
    whole = dict(select, args=[{"__tensor__": 0}, None])
    whole["outputs"] = [{"shape": [1, 3, 4, 5], "dtype": "float32"}]
    assert op_work(whole, "training") == Work(0.0, 0.0)
    ints = copy.deepcopy(select)
    ints["inputs"][0]["dtype"] = "int64"
    assert op_work(ints, "training") == Work(0.0, 0.0)


def test_a_write_into_part_of_a_tensor_moves_the_part_and_its_value() -> None:
    """``mask[0:4, 4:6] = 3`` of an (8, 8) float32 mask: the (4, 2) part written, 32 B, and
    no backward pass. ``buf[:, 1:] = x`` of a (2, 4, 4) buffer with x (2, 3, 4): x read
    and the part written (96 + 96 B); in training x's gradient too, the output
    gradient's part read and x's gradient written (96 + 96 B)."""
    mask = {
        "kind": "function",
        "type": "torch.Tensor.__setitem__",
        "args": [
            {"__tensor__": 0},
            {"__tuple__": [{"__slice__": [0, -4, None]}, {"__slice__": [-4, -2, None]}]},
            3,
        ],
        "kwargs": {},
        "inputs": [{"shape": [8, 8], "dtype": "float32", "param": False}],
        "outputs": [{"shape": [4, 2], "dtype": "float32"}],
    }
    assert family_of(mask["type"]) == "copy"
    assert op_work(mask, "inference") == Work(0.0, 32.0)
    assert op_work(mask, "training") == Work(0.0, 32.0)
    buffer = dict(
        mask,
        args=[
            {"__tensor__": 0},
            {"__tuple__": [{"__slice__": [None, None, None]}, {"__slice__": [1, None, None]}]},
            {"__tensor__": 1},
        ],
        inputs=[
            {"shape": [2, 4, 4], "dtype": "float32", "param": False},
            {"shape": [2, 3, 4], "dtype": "float32", "param": False},
        ],
        outputs=[{"shape": [2, 3, 4], "dtype": "float32"}],
    )
    assert op_work(buffer, "inference") == Work(0.0, 96.0 + 96.0)
    assert op_work(buffer, "training") == Work(0.0, 4 * 96.0)


def test_view_strides_are_pytorchs_for_permuted_and_sliced_tensors() -> None:
    """Where no view of a tensor gives a new shape, ``view`` fails and ``reshape`` copies:
    checked against torch on the meta device, tensors permuted and sliced at random."""
    import random

    torch = pytest.importorskip("torch")
    rng = random.Random(0)
    copies = 0
    for _ in range(400):
        shape = [rng.choice([1, 2, 3, 4, 6]) for _ in range(rng.randint(1, 5))]
        x = torch.empty(shape, device="meta").permute(rng.sample(range(len(shape)), len(shape)))
        d = rng.randrange(x.dim())
        if rng.random() < 0.3 and x.shape[d] > 1:
            x = x.narrow(d, 0, x.shape[d] - 1)
        new, rest = [], x.numel()
        while rest > 1 and len(new) < 3:
            new.append(rng.choice([f for f in range(1, rest + 1) if rest % f == 0]))
            rest //= new[-1]
        new.append(rest)
        got = view_strides(list(x.shape), list(x.stride()), new)
        try:
            strides = list(x.view(new).stride())
        except RuntimeError:
            assert got is None, (list(x.shape), list(x.stride()), new)
            copies += 1
            continue
        assert got is not None, (list(x.shape), list(x.stride()), new)
        # A dimension of size 1 may take any stride; the others are PyTorch's.
        kept = [n > 1 for n in new]
        assert [g for g, k in zip(got, kept, strict=True) if k] == [
            s for s, k in zip(strides, kept, strict=True) if k
        ]
    assert 50 < copies < 350  # both outcomes were drawn


def test_a_reshape_that_cannot_view_its_input_copies_it() -> None:
    # swin_v2_t's windows merged back into a map (a permuted tensor, as extracted): no view
    # of it has the map's shape, so reshape reads and writes it once; its backward reshapes
    # the contiguous gradient, a view. Contiguous (no strides recorded), it is a view.
    x = {"dtype": "float32", "param": False, "shape": [8, 7, 8, 7, 8, 96]}
    x["stride"] = [301056, 43008, 768, 6144, 96, 1]
    spec = {
        "kind": "function",
        "type": "torch.Tensor.reshape",
        "args": [{"__tensor__": 0}, 8, 56, 56, 96],
        "kwargs": {},
        "inputs": [x],
        "outputs": [{"dtype": "float32", "shape": [8, 56, 56, 96]}],
    }
    n = 8 * 56 * 56 * 96
    assert op_work(spec, "inference") == Work(0.0, 2 * 4 * n)
    assert op_work(spec, "training") == Work(0.0, 2 * 4 * n)
    flatten = dict(spec, type="torch.flatten", args=[{"__tensor__": 0}, 1])
    flatten["outputs"] = [{"dtype": "float32", "shape": [8, 7 * 8 * 7 * 8 * 96]}]
    assert op_work(flatten, "inference") == Work(0.0, 2 * 4 * n)
    contiguous = copy.deepcopy(spec)
    del contiguous["inputs"][0]["stride"]
    assert op_work(contiguous, "inference") == Work(0.0, 0.0)
    # Merging only the trailing, contiguous dimensions of the same tensor is a view.
    tail = dict(spec, outputs=[{"dtype": "float32", "shape": [8, 7, 8, 7, 768]}])
    assert op_work(tail, "inference") == Work(0.0, 0.0)


def test_gather_is_not_free() -> None:
    spec = {
        "kind": "function",
        "type": "torch.Tensor.__getitem__",
        "args": [{"__tensor__": 0}, {"__tensor__": 1}],
        "kwargs": {},
        "inputs": [
            {"shape": [1000, 64], "dtype": "float32", "param": False},
            {"shape": [10], "dtype": "int64", "param": False},
        ],
        "outputs": [{"shape": [10, 64], "dtype": "float32"}],
    }
    # Index read (10 x 8 B), 640 elements gathered (read) and written.
    assert op_work(spec, "inference") == Work(0.0, 80 + 2 * 4 * 640)


def test_copy_of_strided_input_reads_and_writes() -> None:
    n = 64 * 24 * 2 * 28 * 28
    assert op_work(spec_of(CONTIGUOUS), "inference") == Work(0.0, 4 * 2 * n)
    contiguous = spec_of(CONTIGUOUS)
    del contiguous["inputs"][0]["stride"]
    assert op_work(contiguous, "inference") == Work(0.0, 0.0)


def test_identities_in_inference_only() -> None:
    for text in (STOCHASTIC_DEPTH, DROPOUT):
        assert op_work(spec_of(text), "inference") == Work(0.0, 0.0)
        assert op_work(spec_of(text), "training").bytes > 0
    n = 64 * 4096
    # Training dropout: forward x, y and the bool mask; backward dy, mask and dx.
    assert op_work(spec_of(DROPOUT), "training") == Work(4 * n, 4 * n * 4 + 2 * n)


def test_training_multipliers() -> None:
    for text in (CONV3X3, DEPTHWISE, LINEAR3D, MHA):
        inference, training = (
            op_work(spec_of(text), "inference"),
            op_work(spec_of(text), "training"),
        )
        assert training.flops == 3 * inference.flops
        assert training.bytes == 3 * inference.bytes
    n = 64 * 400 * 7 * 7
    relu_inf, relu_train = op_work(spec_of(RELU), "inference"), op_work(spec_of(RELU), "training")
    assert relu_inf == Work(n, 4 * 2 * n)
    # Backward: read dy and the saved input, write dx.
    assert relu_train == Work(2 * n, 4 * 5 * n)


def test_roofline_times_vectorised() -> None:
    texts = [CONV3X3, LINEAR3D, VIEW, BATCHNORM]
    modes = ["inference", "training", "training", "inference"]
    times = roofline_times_s(texts * 2, modes * 2, PEAKS)
    expected = [
        roofline_time_s(op_work(spec_of(t), m), PEAKS) for t, m in zip(texts, modes, strict=True)
    ]
    assert list(times) == expected * 2
    assert times[2] == 0.0
    half = roofline_times_s(texts, modes, PEAKS, dtypes=["float16"] * 4)
    assert half[3] == pytest.approx(times[3] / 2)


def test_peaks_round_trip_and_refusal() -> None:
    assert Peaks.from_dict(PEAKS.to_dict()) == PEAKS
    assert Peaks.from_dict({**PEAKS.to_dict(), "device_name": "x"}) == PEAKS
    with pytest.raises(RooflineError, match="memory_bytes_per_s"):
        Peaks.from_dict({"matmul_flops_per_s": 1.0})
    with pytest.raises(RooflineError, match="positive"):
        Peaks.from_dict({"matmul_flops_per_s": 1.0, "memory_bytes_per_s": 0.0})


def _layer_norm(kind: str, shape: list[int], normalized: list[int]) -> dict:
    spec = {
        "args": [{"__tensor__": 0}],
        "attrs": {"normalized_shape": normalized, "elementwise_affine": True, "eps": 1e-5},
        "inputs": [{"dtype": "float32", "param": False, "shape": shape}],
        "kind": "module",
        "kwargs": {},
        "outputs": [{"dtype": "float32", "shape": shape}],
        "type": kind,
    }
    if kind == "torch.nn.functional.layer_norm":  # layer_norm(x, normalized_shape)
        spec.update(kind="function", attrs={}, args=[{"__tensor__": 0}, normalized])
    return spec


@pytest.mark.parametrize(
    ("kind", "shape", "normalized", "rows"),
    [
        # Swin's first stage: 8 x 56 x 56 tokens of 96 channels, a row each.
        ("torch.nn.modules.normalization.LayerNorm", [8, 56, 56, 96], [96], 8 * 56 * 56),
        # Normalised over the last two dimensions: 2 x 3 rows of 4 x 5.
        ("torch.nn.modules.normalization.LayerNorm", [2, 3, 4, 5], [4, 5], 6),
        ("torch.nn.functional.layer_norm", [4, 197, 768], [768], 4 * 197),
        # ConvNeXt's LayerNorm2d normalises the channels of an NCHW map: a row a pixel.
        ("torchvision.models.convnext.LayerNorm2d", [2, 64, 7, 7], [64], 2 * 7 * 7),
    ],
)
def test_a_layer_norm_counts_its_rows_once_a_pass(kind, shape, normalized, rows) -> None:
    spec = _layer_norm(kind, shape, normalized)
    assert op_work(spec, "inference").rows == rows
    assert op_work(spec, "training").rows == 2 * rows  # the forward and the backward pass


def test_other_norms_and_families_count_no_rows() -> None:
    assert op_work(spec_of(BATCHNORM), "training").rows == 0
    assert op_work(spec_of(LINEAR3D), "inference").rows == 0


def test_a_layer_norms_rows_bound_its_roofline_time_where_the_row_rate_is_known() -> None:
    """8 x 3136 rows of 96 float32: 9.63 MB read and 9.63 MB written take 6.4 us at
    3 TB/s, 25,088 rows at 1e9 rows/s take 25.1 us."""
    spec = _layer_norm("torch.nn.modules.normalization.LayerNorm", [8, 3136, 96], [96])
    text = json.dumps(spec)
    nbytes = 2 * 8 * 3136 * 96 * 4 + 2 * 96 * 4  # input, output, weight and bias
    bytes_s = nbytes / 3e12
    rows = Peaks(400e12, 3e12, rows_per_s=1e9)
    assert roofline_time_s(op_work(spec, "inference"), PEAKS) == pytest.approx(bytes_s)
    assert roofline_time_s(op_work(spec, "inference"), rows) == pytest.approx(25088 / 1e9)
    times = roofline_times_s([text, text], ["inference", "training"], rows)
    assert times == pytest.approx([25088 / 1e9, 2 * 25088 / 1e9])
    assert roofline_times_s([text], ["inference"], PEAKS)[0] == pytest.approx(bytes_s)


def test_a_row_rate_round_trips_and_an_unknown_one_is_left_out() -> None:
    rows = Peaks(400e12, 3e12, rows_per_s=7e8)
    assert Peaks.from_dict(rows.to_dict()) == rows
    assert "rows_per_s" not in PEAKS.to_dict()
    assert Peaks.from_dict(PEAKS.to_dict()).rows_per_s == math.inf


def test_bad_spec_and_mode_are_named() -> None:
    with pytest.raises(RooflineError, match="unknown mode"):
        op_work(spec_of(CONV3X3), "train")
    broken = spec_of(CONV3X3)
    del broken["attrs"]["in_channels"]
    with pytest.raises(RooflineError, match="Conv2d.*in_channels"):
        op_work(broken, "inference")


EXPECTED_FAMILIES = {
    "torch.nn.modules.conv.Conv1d": "conv",
    "torch.nn.modules.conv.Conv3d": "conv",
    "torch.nn.modules.conv.ConvTranspose2d": "conv",
    "torch.conv2d": "conv",
    "torch.nn.functional.conv2d": "conv",
    "torch.nn.modules.linear.Linear": "linear",
    "torch.nn.functional.linear": "linear",
    "torch.addmm": "linear",
    "torch.matmul": "matmul",
    "torch.bmm": "matmul",
    "torch.mm": "matmul",
    "torch.Tensor.__matmul__": "matmul",
    "torch.einsum": "matmul",
    "torch.baddbmm": "matmul",
    "torch.nn.modules.activation.MultiheadAttention": "attention",
    "torch.nn.functional.scaled_dot_product_attention": "attention",
    "torch.nn.modules.batchnorm.BatchNorm1d": "norm",
    "torch.nn.modules.normalization.GroupNorm": "norm",
    "torchvision.models.convnext.LayerNorm2d": "norm",
    "torch.nn.modules.instancenorm.InstanceNorm2d": "norm",
    "torch.nn.modules.activation.Hardswish": "activation",
    "torch.nn.modules.activation.Mish": "activation",
    "torch.relu": "activation",
    "torch.relu_": "activation",
    "torch.sigmoid": "activation",
    "torch.nn.functional.gelu": "activation",
    "torch.nn.functional.leaky_relu": "activation",
    "torch.Tensor.sigmoid_": "activation",
    "torch.nn.modules.pooling.MaxPool2d": "pool",
    "torch.nn.modules.pooling.AdaptiveAvgPool2d": "pool",
    "torch.nn.modules.pooling.AdaptiveMaxPool1d": "pool",
    "torch.nn.functional.max_pool2d": "pool",
    "torch.Tensor.__iadd__": "elementwise",
    "torch.Tensor.__imul__": "elementwise",
    "torch.Tensor.__truediv__": "elementwise",
    "torch.Tensor.mul_": "elementwise",
    "torch.add": "elementwise",
    "torchvision.ops.stochastic_depth.StochasticDepth": "elementwise",
    "torch.mean": "elementwise",
    "torch.sum": "elementwise",
    "torch.nn.modules.activation.Softmax": "softmax",
    "torch.Tensor.softmax": "softmax",
    "torch.nn.functional.log_softmax": "softmax",
    "torch.nn.modules.dropout.Dropout2d": "dropout",
    "torch.nn.functional.dropout": "dropout",
    "torch.stack": "cat",
    "torch.concat": "cat",
    "torch.Tensor.clone": "copy",
    "torch.Tensor.to": "copy",
    "torch.Tensor.copy_": "copy",
    "torch.Tensor.__getitem__": "view",
    "torch.Tensor.unsqueeze": "view",
    "torch.nn.modules.linear.Identity": "view",
    "torch.nn.modules.flatten.Flatten": "view",
    "torchvision.ops.misc.Permute": "view",
    "torch.permute": "view",
    "torch.swapaxes": "view",
    "torch.Tensor.movedim": "view",
    "torch.nn.functional.pad": "copy",
    "torch.roll": "copy",
    "torch.Tensor.masked_fill": "elementwise",
    "some.module.Unheard": "other",
}


@pytest.mark.parametrize(("op_type", "family"), EXPECTED_FAMILIES.items())
def test_family_of_named_types(op_type: str, family: str) -> None:
    assert family_of(op_type) == family


def test_family_of_every_recorded_type() -> None:
    types = {json.loads(s)["type"] for s in unique_specs()}
    assert len(types) > 25
    unknown = {t for t in types if family_of(t) == "other"}
    assert not unknown
    assert {family_of(t) for t in types} <= set(FAMILIES)


def test_every_recorded_spec_has_work() -> None:
    """Every real spec counts; training never costs less than inference; only views and
    identities are free."""
    for text in unique_specs():
        spec = json.loads(text)
        inference, training = op_work(spec, "inference"), op_work(spec, "training")
        assert training.flops >= inference.flops >= 0
        assert training.bytes >= inference.bytes >= 0
        free = family_of(spec["type"]) in {"view", "copy", "dropout", "elementwise"}
        assert free or inference.bytes > 0, spec["type"]


# -- against torch's flop counter ------------------------------------------------------

COUNTER_SPECS = [CONV3X3, DEPTHWISE, LINEAR3D]


def _conv_specs_from_data() -> list[str]:
    """A 7x7 stride-2 stem, a grouped stride-2 conv and a 1x1 stride-2 conv."""
    chosen = {}
    for text in unique_specs():
        spec = json.loads(text)
        a = spec.get("attrs", {})
        if not spec["type"].endswith("Conv2d"):
            continue
        key = None
        if a["kernel_size"] == [7, 7] and a["stride"] == [2, 2] and a["in_channels"] == 3:
            key = "stem"
        elif 1 < a["groups"] < a["in_channels"] and a["stride"] == [2, 2]:
            key = "grouped"
        elif a["kernel_size"] == [1, 1] and a["stride"] == [2, 2]:
            key = "pointwise"
        if key:
            chosen.setdefault(key, text)
    assert set(chosen) == {"stem", "grouped", "pointwise"}
    return list(chosen.values())


def _small_batch(spec: dict, batch: int = 2) -> dict:
    spec = copy.deepcopy(spec)
    for t in spec["inputs"][:1] + spec["outputs"]:
        t["shape"][0] = batch
    return spec


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_flops_agree_with_torch_flop_counter(mode: str) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from opcost.spec import random_inputs, rebuild

    for text in COUNTER_SPECS + _conv_specs_from_data():
        spec = _small_batch(json.loads(text))
        if mode == "training" and spec["attrs"].get("groups", 1) > 1:
            # torch's conv_backward_flop ignores groups: it counts a grouped conv's weight
            # gradient `groups` times over (the training multiplier is tested by hand).
            continue
        op = rebuild(spec, device="cpu")
        inputs = random_inputs(spec, "cpu", requires_grad=mode == "training")
        counter = FlopCounterMode(display=False)
        with counter:
            out = op(inputs)
            if mode == "training":
                out.backward(torch.randn_like(out))
        measured = counter.get_total_flops()
        assert measured > 0
        assert math.isclose(op_work(spec, mode).flops, measured, rel_tol=0.01), spec["attrs"]


def test_measure_peaks_on_cpu() -> None:
    from opcost.peaks import measure_peaks

    peaks = measure_peaks("cpu", matmul_n=64, copy_bytes=2**20, repeats=2)
    assert set(peaks) == {
        "matmul_flops_per_s",
        "memory_bytes_per_s",
        "device_name",
        "tf32",
        "dtype",
        "matmul_n",
        "copy_bytes",
    }
    for key in ("matmul_flops_per_s", "memory_bytes_per_s"):
        assert math.isfinite(peaks[key])
        assert peaks[key] > 0
    assert (peaks["matmul_n"], peaks["copy_bytes"], peaks["dtype"]) == (64, 2**20, "float32")
    assert peaks["device_name"] == "cpu"
    assert Peaks.from_dict(peaks).matmul_flops_per_s == peaks["matmul_flops_per_s"]


def test_measure_peaks_restores_tf32_settings() -> None:
    torch = pytest.importorskip("torch")
    from opcost.peaks import measure_peaks

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        measure_peaks("cpu", tf32=True, matmul_n=32, copy_bytes=2**16, repeats=1)
        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cudnn.allow_tf32 is False
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _module(kind: str, inputs: list[list[int]], outputs: list[list[int]], **attrs) -> str:
    return json.dumps(
        {
            "args": [{"__tensor__": i} for i in range(len(inputs))],
            "attrs": attrs,
            "inputs": [{"dtype": "float32", "param": False, "shape": s} for s in inputs],
            "kind": "module",
            "kwargs": {},
            "outputs": [{"dtype": "float32", "shape": s} for s in outputs],
            "type": f"torch.nn.modules.{kind}",
        },
        sort_keys=True,
    )


@pytest.mark.parametrize(
    ("spec", "gemm", "align"),
    [
        # Grouped 3x3 convolution, 512 -> 128 channels in 8 groups on 13x13, batch 9:
        # m = 9*13*13 output pixels, n = 128/8, k = 512/8 * 9 per group.
        (
            _module("conv.Conv2d", [[9, 512, 13, 13]], [[9, 128, 13, 13]], in_channels=512,
                    out_channels=128, kernel_size=[3, 3], stride=[1, 1], padding=[1, 1],
                    dilation=[1, 1], groups=8, bias=True, transposed=False),
            (1, 1521, 16, 576, 8, 0.0),
            (4, 6),  # n = 16 = 2^4; the group's 64 input channels, not k = 64 * 9 taps
        ),
        # Depthwise 3x3, stride 2: 32 groups of one channel, 56 -> 28.
        (
            _module("conv.Conv2d", [[4, 32, 56, 56]], [[4, 32, 28, 28]], in_channels=32,
                    out_channels=32, kernel_size=[3, 3], stride=[2, 2], padding=[1, 1],
                    dilation=[1, 1], groups=32, bias=False, transposed=False),
            (1, 4 * 28 * 28, 1, 9, 32, 1.0),
            (0, 0),  # one channel a group
        ),
        # A patchify stem (convnext's, swin's): 4x4 kernel, stride 4, 3 -> 96 channels.
        (
            _module("conv.Conv2d", [[2, 3, 32, 32]], [[2, 96, 8, 8]], in_channels=3,
                    out_channels=96, kernel_size=[4, 4], stride=[4, 4], padding=[0, 0],
                    dilation=[1, 1], groups=1, bias=True, transposed=False),
            (1, 2 * 8 * 8, 96, 3 * 16, 1, 0.0),
            (5, 0),  # 96 = 32 * 3; 3 input channels, although k = 48 taps of them align
        ),
        # Linear 64 -> 40 on 3 x 7 tokens: m = 21 rows.
        (
            _module("linear.Linear", [[3, 7, 64]], [[3, 7, 40]], in_features=64,
                    out_features=40, bias=True),
            (1, 21, 40, 64, 1, 0.0),
            (3, 6),  # 40 = 8 * 5, 64 = 2^6
        ),
        # LayerNorm over 1064 features of 2 x 379 tokens: 758 rows of 1064.
        (
            _module("normalization.LayerNorm", [[2, 379, 1064]], [[2, 379, 1064]],
                    normalized_shape=[1064], elementwise_affine=True),
            (1, 758, 1, 1064, 1, 0.0),
            (0, 3),  # 1064 = 8 * 133
        ),
        # BatchNorm2d: 64 channels, each reduced over 13 * 3 * 3 values.
        (
            _module("batchnorm.BatchNorm2d", [[13, 64, 3, 3]], [[13, 64, 3, 3]],
                    num_features=64, affine=True, track_running_stats=True),
            (1, 64, 1, 117, 1, 0.0),
            (0, 0),  # 117 is odd
        ),
    ],
)  # fmt: skip
def test_shape_features_by_hand(spec: str, gemm: tuple, align: tuple) -> None:
    from opcost.model.shapes import SHAPE_FEATURES, shape_features

    got = dict(zip(SHAPE_FEATURES, shape_features(spec), strict=True))
    *sizes, depthwise = gemm
    names = ("log_gemm_batch", "log_gemm_m", "log_gemm_n", "log_gemm_k", "log_groups")
    for name, size in zip(names, sizes, strict=True):
        assert got[name] == pytest.approx(math.log(size)), name
    assert got["depthwise"] == depthwise
    x = json.loads(spec)["inputs"][0]["shape"]
    assert got["log_in_numel"] == pytest.approx(math.log(math.prod(x)))
    assert got["log_last_dim"] == pytest.approx(math.log(x[-1]))
    assert (got["align_n"], got["align_k"]) == align


@pytest.mark.parametrize(("size", "bits"), [(1, 0), (7, 0), (6, 1), (96, 5), (64, 6), (4096, 6)])
def test_alignment_counts_the_powers_of_two_up_to_64(size: int, bits: int) -> None:
    from opcost.model.shapes import alignment

    assert alignment(size) == bits


def test_shape_features_of_other_ops_are_not_applicable() -> None:
    from opcost.model.shapes import shape_features

    relu = _module("activation.ReLU", [[2, 8, 4, 4]], [[2, 8, 4, 4]], inplace=False)
    f = shape_features(relu)
    assert f[:5] == (-1.0,) * 5
    assert f[6] == pytest.approx(math.log(256))
    assert f[-3:-1] == (-1.0, -1.0)
    assert f[-1] == 0.0  # no fused path


def _attention_module(heads: int, **change) -> OpSpec:
    """An ``nn.MultiheadAttention`` self-attention call as extraction records it (ViT's:
    query, key and value one tensor, batch first, no weights asked for), changed by
    ``change`` (``attrs`` entries, or the ``args`` or ``kwargs`` whole)."""
    spec = json.loads(
        _module("activation.MultiheadAttention", [[8, 50, 768]], [[8, 50, 768]],
                embed_dim=768, num_heads=heads, kdim=768, vdim=768, batch_first=True,
                bias=True, bias_k=None, bias_v=None, add_bias_kv=False, add_zero_attn=False,
                dropout=0.0, head_dim=768 // heads)
    )  # fmt: skip
    spec["args"] = [{"__tensor__": 0}] * 3
    spec["kwargs"] = {"need_weights": False}
    for key, value in change.items():
        spec[key] = {**spec[key], **value} if key == "attrs" else value
    return OpSpec(spec, None)


def test_the_fused_attention_path_is_told_from_the_module_call() -> None:
    from opcost.model.shapes import fast_path

    assert fast_path(_attention_module(12))
    assert not fast_path(_attention_module(3))  # an odd number of heads
    assert not fast_path(_attention_module(12, kwargs={"need_weights": True}))
    assert not fast_path(_attention_module(12, kwargs={}))  # weights by default
    two = [{"__tensor__": 0}, {"__tensor__": 1}, {"__tensor__": 1}]
    assert not fast_path(_attention_module(12, args=two))  # cross-attention
    assert not fast_path(_attention_module(12, attrs={"batch_first": False}))
    relu = json.loads(_module("activation.ReLU", [[2, 8, 4, 4]], [[2, 8, 4, 4]], inplace=False))
    assert not fast_path(OpSpec(relu, None))


def test_the_fused_attention_path_runs_fewer_kernels_in_the_committed_samples() -> None:
    """Measured: the attention modules the op space sampled ran 3-6 kernels in inference
    where PyTorch's conditions for its fused path hold, 7 or more elsewhere."""
    from opcost.model.shapes import fast_path

    tables = [pd.read_parquet(p) for p in sorted(OP_SPACE.glob("h*/*.parquet"))]
    rows = pd.concat(tables, ignore_index=True)
    mha = "torch.nn.modules.activation.MultiheadAttention"
    rows = rows[(rows["op_type"] == mha) & (rows["status"] == "ok")]
    inference = rows[rows["mode"] == "inference"]
    fused = np.array([fast_path(OpSpec(json.loads(s), None)) for s in inference["spec"]])
    kernels = inference["n_kernels"].to_numpy()
    assert fused.sum() > 300
    assert (~fused).sum() > 300
    assert np.mean(kernels[fused] <= 6) > 0.95
    assert np.mean(kernels[~fused] >= 7) > 0.9
    # In training no fused path runs: as many kernels either way (a median of 35 or more).
    training = rows[rows["mode"] == "training"]
    fused_t = np.array([fast_path(OpSpec(json.loads(s), None)) for s in training["spec"]])
    k = training["n_kernels"].to_numpy()
    assert np.median(k[fused_t]) >= 35
    assert np.median(k[~fused_t]) >= 35
