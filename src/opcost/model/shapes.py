"""Shape features of an op: the matrix product it amounts to and how its sizes align.

The op models' trees learn an op's GPU time and busy power from these besides its roofline
time (:mod:`opcost.model.roofline`): a GPU's kernels are tiled by the sizes of the matrix
product an op amounts to and load in aligned vectors, which the raw dimensions give only
as products. From the op's spec (:mod:`opcost.spec` format) alone; no torch::

    dict(zip(SHAPE_FEATURES, shape_features(spec_json)))
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from functools import lru_cache

import numpy as np

from opcost.model.op_spec import (
    OpSpec,
    conv_flops_params,
    family_of,
    int_list,
    linear_flops_params,
    numel,
)

#: :func:`shape_features`' names, in order.
SHAPE_FEATURES: tuple[str, ...] = (
    "log_gemm_batch",
    "log_gemm_m",
    "log_gemm_n",
    "log_gemm_k",
    "log_groups",
    "depthwise",
    "log_in_numel",
    "log_out_numel",
    "log_last_dim",
    "align_n",
    "align_k",
    "fast_path",
)
#: The largest power of two an alignment feature counts (:func:`alignment`).
ALIGN_CAP = 64


def _gemm(op: OpSpec, family: str) -> tuple[int, int, int, int, int, bool] | None:
    """The matrix product an op amounts to: ``(batch, m, n, k, groups, depthwise)``, or
    None."""
    if family == "conv":
        flops, _ = conv_flops_params(op)
        x, out = op.shape(0), op.out_shape()
        if op.kind == "module":
            groups, cin, cout = (
                int(op.attrs.get(k, 1)) for k in ("groups", "in_channels", "out_channels")
            )
        else:
            w = op.tensor_arg(1, "weight") or {"shape": [1, 1]}
            groups = int(op.arg(6, "groups", 1))
            cin, cout = int(w["shape"][1]) * groups, int(w["shape"][0])
        n_sp = max(len(out) - 2, 1)
        m = (x[0] if len(x) == n_sp + 2 else 1) * numel(out[-n_sp:])
        n = max(cout // groups, 1)
        k = max(int(round(flops / (2.0 * m * n * groups))), 1)
        return 1, m, n, k, groups, groups > 1 and groups == cin
    if family == "linear":
        out = op.out_shape()
        n = int(out[-1])
        k = int(round(linear_flops_params(op)[0] / (2.0 * numel(out))))
        return 1, numel(out) // max(n, 1), n, max(k, 1), 1, False
    if family == "matmul" and len(op.inputs) >= 2:
        out = op.out_shape()
        a = op.shape(0)
        m, n = (int(out[-2]), int(out[-1])) if len(out) >= 2 else (1, int(out[-1]) if out else 1)
        return numel(out[:-2]) if len(out) > 2 else 1, m, n, int(a[-1]), 1, False
    if family == "attention":
        q = op.shape(0)
        if op.kind == "module":  # (N, L, E), batch first
            heads = int(op.attrs.get("num_heads", 1))
            key = op.shape(1) if len(op.inputs) > 1 else q
            return int(q[0]) * heads, int(q[-2]), int(key[-2]), int(q[-1]) // heads, 1, False
        key = op.shape(1) if len(op.inputs) > 1 else q  # (N, H, L, d)
        return numel(q[:-2]), int(q[-2]), int(key[-2]), int(q[-1]), 1, False
    if family in ("norm", "softmax") and op.inputs:
        x = op.shape(0)
        total = numel(x)
        if op.name.startswith(("batchnorm", "batch_norm", "instancenorm", "instance_norm")):
            rows = int(x[1]) * (int(x[0]) if op.name.startswith("instance") else 1)
        elif op.name in ("groupnorm", "group_norm"):
            groups = op.attrs.get("num_groups", op.arg(1, "num_groups", 1))
            rows = int(x[0]) * int(groups)
        elif op.name == "layernorm2d":  # over the channels of each pixel
            rows = total // int(x[1])
        elif op.name in ("layernorm", "layer_norm", "rmsnorm", "rms_norm"):
            shape = op.attrs.get("normalized_shape", op.arg(1, "normalized_shape", [x[-1]]))
            rows = total // numel(int_list(shape, 1))
        else:  # softmax over one dimension (the last, as networks call it)
            rows = total // int(x[-1])
        rows = max(rows, 1)
        return 1, rows, 1, max(total // rows, 1), 1, False
    return None


def shape_features(spec: str) -> tuple[float, ...]:
    """Shape features of an op (canonical spec JSON), as :data:`SHAPE_FEATURES` names them:
    the logs of the matrix product it amounts to (convolutions as implicit GEMMs: ``m`` the
    output pixels, ``n`` the output channels and ``k`` the input channels times the kernel,
    per group; linear layers, matrix products and attention likewise; normalisations and
    softmax as ``m`` independent rows each reduced over ``k`` elements; -1 for other ops),
    whether it is depthwise, and the logs of its input and output elements
    and of its first input's last dimension; whether the call may take a module's fused
    inference path (:func:`fast_path`). The trees learn from these the sizes a GPU's
    kernels are tiled by, which the raw dimensions give only as products."""
    return _shape_features(spec)


def shape_matrix(specs: Iterable[str]) -> np.ndarray:
    """:func:`shape_features` of each spec, one row each and a column per
    :data:`SHAPE_FEATURES` name (``(0, len(SHAPE_FEATURES))`` for no specs)."""
    rows = [shape_features(s) for s in specs]
    return np.array(rows, dtype=float).reshape(len(rows), len(SHAPE_FEATURES))


@lru_cache(maxsize=65536)
def _shape_features(spec: str) -> tuple[float, ...]:
    na = -1.0
    try:
        op = OpSpec(json.loads(spec), None)
        gemm = _gemm(op, family_of(op.type))
    except (KeyError, ValueError, TypeError, IndexError, ZeroDivisionError):
        return (na,) * len(SHAPE_FEATURES)
    if gemm is None:
        gemm_part = (na,) * 5 + (0.0,)
        align_part = (na, na)
    else:
        *sizes, depthwise = gemm
        gemm_part = (*(math.log(max(v, 1)) for v in sizes), float(depthwise))
        _, _, n, k, groups, _ = gemm
        if family_of(op.type) == "conv":  # k holds the kernel's taps too: channels align
            if op.kind == "module":
                k = int(op.attrs.get("in_channels", 1)) // max(groups, 1)
            else:
                k = int((op.tensor_arg(1, "weight") or {"shape": [1, 1]})["shape"][1])
        align_part = (float(alignment(n)), float(alignment(k)))
    last = op.shape(0)[-1] if op.inputs and op.shape(0) else 1
    return (
        *gemm_part,
        math.log(max(op.in_numel, 1)),
        math.log(max(op.out_numel, 1)),
        math.log(max(int(last), 1)),
        *align_part,
        float(fast_path(op)),
    )


_MHA = "torch.nn.modules.activation.MultiheadAttention"


def fast_path(op: OpSpec) -> bool:
    """Whether an ``nn.MultiheadAttention`` call meets the conditions under which PyTorch
    runs it, in inference, as one fused op (``torch._native_multi_head_attention``: the
    projections and attention in 3-6 kernels instead of 7-11): self-attention (query, key
    and value one tensor), batch first, an even number of heads, the key's and value's
    widths the embedding's, no added key/value bias or zero attention, no mask, and no
    attention weights asked for. Of the op space's attention modules measured in
    inference (rounds 1-47, the four GPU configurations), 391 of the 397 that meet them
    ran 3-6 kernels, 425 of the 454 others 7-11. False for every other op."""
    if op.type != _MHA or op.kind != "module":
        return False
    a = op.attrs
    first = op.arg(0, "query")
    same = all(op.arg(i, name) == first for i, name in ((1, "key"), (2, "value")))
    masks = any(op.arg(i, m) is not None for i, m in ((4, "key_padding_mask"), (6, "attn_mask")))
    return bool(
        same
        and isinstance(first, dict)
        and a.get("batch_first")
        and int(a.get("num_heads", 1)) % 2 == 0
        and a.get("kdim") == a.get("vdim") == a.get("embed_dim")
        and a.get("bias_k") is None
        and not a.get("add_zero_attn")
        and not masks
        and op.arg(3, "need_weights", True) is False
    )


def grouped_conv(spec: str) -> bool:
    """Whether op ``spec`` (:mod:`opcost.spec` format) is a grouped convolution: more than
    one group, fewer groups than input channels (not depthwise, whose kernels are
    predicted as surely as a dense convolution's)."""
    try:
        family = family_of(json.loads(spec)["type"])
    except (ValueError, KeyError, TypeError):
        return False
    if family != "conv":
        return False
    f = dict(zip(SHAPE_FEATURES, shape_features(spec), strict=True))
    return f["log_groups"] > 0 and not f["depthwise"]


def alignment(size: int) -> int:
    """``log2`` of the largest power of two, up to ``ALIGN_CAP``, that divides ``size``:
    GPU kernels load and tile in aligned vectors (a TF32 tensor-core tile takes 8
    channels), so a product whose channels are a multiple of 8 or 64 can run other,
    faster kernels than one of the next odd size (0 for an odd size)."""
    size, bits = max(int(size), 1), 0
    while size % 2 == 0 and (1 << bits) < ALIGN_CAP:
        size //= 2
        bits += 1
    return bits
