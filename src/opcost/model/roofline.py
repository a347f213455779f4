"""Roofline work of an op: its FLOPs and DRAM bytes, and the time they take at peak rates.

Each op's GPU time is modelled as ``roofline_time_s / efficiency`` with the efficiency in
(0, 1]; this module gives the roofline time, from the op's spec (:mod:`opcost.spec`
format) alone. It imports no torch (``opcost predict`` imports it)::

    work = op_work(spec, "training")            # Work(flops=..., bytes=...)
    t_s = roofline_time_s(work, Peaks.from_dict(measure_peaks()))

**Families.** :func:`family_of` maps an op type (qualified name) to one of
:data:`FAMILIES`: an exact table first, then the last name component, lower-cased, with
in-place and dunder spellings reduced (``__iadd__`` and ``add_`` -> ``add``), then prefixes
(``conv``, ``maxpool``, ``batchnorm``, ...); ``"other"`` for anything unknown.

**Bytes** are the tensors that must cross DRAM at least once: the tensor inputs (each
once, also when broadcast or passed several times), the outputs and the module's
parameters (buffers such as BatchNorm's running statistics, at most 4 elements per
channel, are left out), at their dtypes' widths (``dtype`` replaces every floating
dtype, as the measuring harness casts floating inputs and parameters). Extra tensors
that PyTorch's GPU kernels always write and read: the int64 indices of max pooling
(written in the forward pass, read in the backward pass), the query/key/value and context
intermediates of ``nn.MultiheadAttention`` (written by one kernel, read by the next), the
bool mask of an active dropout.

**FLOPs** count a multiply-add as 2 and leave bias additions out (as
``torch.utils.flop_counter`` does): direct convolution ``2 * N * C_out * prod(out
spatial) * C_in / groups * prod(kernel)`` (transposed: input spatial and the channels
swapped), ``2 * M * N * K`` for matrix products (``2 * out_numel * K``; einsum: 2 times the
product of every index size), attention ``Q, K, V projections + QK^T + AV + output
projection`` (``nn.MultiheadAttention``) or ``QK^T + AV`` (SDPA). Memory-bound ops count a
small constant per element: activation 1 per output element, norm 5 per input element,
softmax 5 per element, elementwise 1 per output element (reductions ``mean``/``sum``: 1
per input element), pooling ``prod(kernel)`` per output element (adaptive: 1 per input
element), active dropout 2 per element, cat/copy/view 0.

**Training** is one step of the measuring harness: the forward pass, then the backward
pass w.r.t. every floating input (the harness makes them all require grad) and the
module's parameters. With F, X, W, O the forward FLOPs, floating-input bytes, parameter
bytes and output bytes (O: floating outputs) and ``S`` the saved tensors the backward
pass reads:

=================================  ==============  ======================================
family                             training FLOPs  training bytes
=================================  ==============  ======================================
conv, linear, matmul, attention    3 F             3 x forward bytes (two backward
                                                   products, each reading its operands
                                                   and writing its result)
norm, activation, pool,            2 F             forward bytes + O + X + 2 W + S
elementwise, softmax, dropout,                     (read the output gradients, write the
cat, copy, other                                   input gradients, read the parameters
                                                   and write their gradients, read S)
view                               0               0 (a view's gradient is a view)
=================================  ==============  ======================================

``S``: activation X (its input or output), norm X, max pooling its int64 indices,
softmax O, elementwise ``mul``/``div`` X (each operand's gradient needs the other),
dropout its mask; 0 for the rest. Dropout in training also writes its mask in the
forward pass.

**Identities.** View ops (``view``, ``permute``, ``expand``, slicing, ...) launch no
kernel: ``Work(0, 0)``, also for a strided input. Indexing with a tensor (``x[idx]``)
gathers: the index is read and the output written. ``contiguous`` of a contiguous input,
``to`` without a change of dtype or layout, dropout and ``StochasticDepth`` in inference
(or with ``p == 0``) return their input: ``Work(0, 0)``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from opcost.errors import OpcostError
from opcost.names import MODES

FAMILIES: tuple[str, ...] = (
    "conv",
    "linear",
    "matmul",
    "attention",
    "norm",
    "activation",
    "pool",
    "elementwise",
    "softmax",
    "dropout",
    "cat",
    "copy",
    "view",
    "other",
)
#: Families whose work is dominated by matrix products (training: 3x forward).
COMPUTE_FAMILIES = frozenset({"conv", "linear", "matmul", "attention"})

_NN = "torch.nn.modules."
_EXACT: dict[str, str] = {
    **{f"{_NN}conv.{c}": "conv" for c in ("Conv1d", "Conv2d", "Conv3d")},
    **{f"{_NN}conv.ConvTranspose{d}d": "conv" for d in (1, 2, 3)},
    "torch.conv2d": "conv",
    "torch.nn.functional.conv2d": "conv",
    f"{_NN}linear.Linear": "linear",
    "torch.nn.functional.linear": "linear",
    "torch.addmm": "linear",
    f"{_NN}activation.MultiheadAttention": "attention",
    "torch.nn.functional.scaled_dot_product_attention": "attention",
    **{f"{_NN}batchnorm.BatchNorm{d}d": "norm" for d in (1, 2, 3)},
    **{f"{_NN}instancenorm.InstanceNorm{d}d": "norm" for d in (1, 2, 3)},
    f"{_NN}normalization.LayerNorm": "norm",
    f"{_NN}normalization.GroupNorm": "norm",
    "torchvision.models.convnext.LayerNorm2d": "norm",
    "torchvision.ops.stochastic_depth.StochasticDepth": "elementwise",
    "torchvision.ops.misc.Permute": "view",
    f"{_NN}flatten.Flatten": "view",
    f"{_NN}linear.Identity": "view",
}
#: By the last name component (lower-case, in-place and dunder spellings reduced).
_BY_NAME: dict[str, str] = {
    **dict.fromkeys(("conv1d", "conv2d", "conv3d", "conv_transpose1d"), "conv"),
    **dict.fromkeys(("conv_transpose2d", "conv_transpose3d", "convolution"), "conv"),
    **dict.fromkeys(("linear", "addmm"), "linear"),
    **dict.fromkeys(("matmul", "mm", "bmm", "einsum", "baddbmm", "rmatmul"), "matmul"),
    **dict.fromkeys(("multiheadattention", "scaled_dot_product_attention"), "attention"),
    **dict.fromkeys(("layernorm", "groupnorm", "layernorm2d", "rmsnorm"), "norm"),
    **dict.fromkeys(("batch_norm", "layer_norm", "group_norm", "instance_norm"), "norm"),
    **dict.fromkeys(("rms_norm",), "norm"),
    **dict.fromkeys(
        (
            "relu",
            "relu6",
            "gelu",
            "silu",
            "hardswish",
            "hardsigmoid",
            "sigmoid",
            "tanh",
            "leakyrelu",
            "leaky_relu",
            "mish",
            "elu",
            "hardtanh",
            "softplus",
        ),
        "activation",
    ),
    **dict.fromkeys(("add", "mul", "sub", "div", "truediv", "mean", "sum"), "elementwise"),
    **dict.fromkeys(("stochasticdepth", "stochastic_depth", "neg", "pow"), "elementwise"),
    **dict.fromkeys(("softmax", "log_softmax", "logsoftmax"), "softmax"),
    **dict.fromkeys(("dropout", "dropout1d", "dropout2d", "dropout3d"), "dropout"),
    **dict.fromkeys(("alpha_dropout", "alphadropout", "feature_alpha_dropout"), "dropout"),
    **dict.fromkeys(("cat", "stack", "concat", "concatenate"), "cat"),
    **dict.fromkeys(("contiguous", "clone", "to", "copy"), "copy"),
    **dict.fromkeys(
        (
            "view",
            "reshape",
            "flatten",
            "permute",
            "transpose",
            "expand",
            "chunk",
            "split",
            "getitem",
            "unsqueeze",
            "squeeze",
            "identity",
            "narrow",
            "select",
            "t",
            "unflatten",
            "view_as",
            "expand_as",
            "unbind",
        ),
        "view",
    ),
}
#: Then by prefix of the reduced last component (module classes and their variants).
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("convtranspose", "conv"),
    ("conv", "conv"),
    ("batchnorm", "norm"),
    ("instancenorm", "norm"),
    ("maxpool", "pool"),
    ("avgpool", "pool"),
    ("adaptiveavgpool", "pool"),
    ("adaptivemaxpool", "pool"),
    ("max_pool", "pool"),
    ("avg_pool", "pool"),
    ("adaptive_avg_pool", "pool"),
    ("adaptive_max_pool", "pool"),
    ("dropout", "dropout"),
    ("softmax", "softmax"),
)

#: Bytes per element by dtype name.
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complex128": 16,
    "complex64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
_INDEX_BYTES = 8  # int64 indices of max pooling


class RooflineError(OpcostError, ValueError):
    """An op's work cannot be counted from its spec; the message names the op and field."""


def _reduced_name(op_type: str) -> str:
    """Last name component, lower-case, in-place and dunder spellings reduced."""
    last = op_type.rsplit(".", 1)[-1].lower()
    if last.startswith("__") and last.endswith("__"):
        last = last[2:-2]
        if last[:1] in ("i", "r") and last[1:] in _BY_NAME:  # __iadd__, __radd__ -> add
            last = last[1:]
    elif last.endswith("_") and last[:-1] in _BY_NAME:  # relu_, add_, copy_
        last = last[:-1]
    return last


def family_of(op_type: str) -> str:
    """The family (one of :data:`FAMILIES`) of an op type such as ``torch.Tensor.add_``."""
    if op_type in _EXACT:
        return _EXACT[op_type]
    name = _reduced_name(op_type)
    if name in _BY_NAME:
        return _BY_NAME[name]
    for prefix, family in _PREFIXES:
        if name.startswith(prefix):
            return family
    return "other"


# -- work -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    """The work of one step of an op: FLOPs (multiply-add = 2) and DRAM bytes."""

    flops: float
    bytes: float


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


class _Op:
    """A spec's tensors and settings, with byte sizes at the measured dtype."""

    def __init__(self, spec: dict[str, Any], dtype: str | None) -> None:
        self.spec = spec
        self.type: str = spec["type"]
        self.name = _reduced_name(self.type)
        self.kind: str = spec["kind"]
        self.attrs: dict[str, Any] = spec.get("attrs") or {}
        self.inputs: list[dict[str, Any]] = list(spec.get("inputs", []))
        self.outputs: list[dict[str, Any]] = list(spec.get("outputs", []))
        self.dtype = dtype
        floats = [t["dtype"] for t in self.inputs + self.outputs if _is_float(t["dtype"])]
        self.param_dtype = dtype or (floats[0] if floats else "float32")

    def width(self, t: dict[str, Any]) -> int:
        name = t["dtype"]
        if self.dtype is not None and _is_float(name):
            name = self.dtype
        try:
            return DTYPE_BYTES[name]
        except KeyError:
            raise RooflineError(
                f"{self.type}: unknown dtype {name!r}; expected one of {sorted(DTYPE_BYTES)}"
            ) from None

    def nbytes(self, t: dict[str, Any]) -> float:
        return float(_numel(t["shape"]) * self.width(t))

    @property
    def in_bytes(self) -> float:
        return sum(self.nbytes(t) for t in self.inputs)

    @property
    def float_in_bytes(self) -> float:
        return sum(self.nbytes(t) for t in self.inputs if _is_float(t["dtype"]))

    @property
    def out_bytes(self) -> float:
        return sum(self.nbytes(t) for t in self.outputs)

    @property
    def float_out_bytes(self) -> float:
        return sum(self.nbytes(t) for t in self.outputs if _is_float(t["dtype"]))

    @property
    def in_numel(self) -> int:
        return sum(_numel(t["shape"]) for t in self.inputs)

    @property
    def out_numel(self) -> int:
        return sum(_numel(t["shape"]) for t in self.outputs)

    def shape(self, i: int) -> list[int]:
        return [int(d) for d in self.inputs[i]["shape"]]

    def out_shape(self, i: int = 0) -> list[int]:
        return [int(d) for d in self.outputs[i]["shape"]]

    def arg(self, position: int, name: str, default: Any = None) -> Any:
        """A call argument by position or keyword."""
        args, kwargs = self.spec.get("args", []), self.spec.get("kwargs", {})
        if name in kwargs:
            return kwargs[name]
        if position < len(args):
            return args[position]
        return default

    def tensor_arg(self, position: int, name: str) -> dict[str, Any] | None:
        """The input spec of a tensor argument, or None."""
        value = self.arg(position, name)
        if isinstance(value, dict) and "__tensor__" in value:
            return self.inputs[int(value["__tensor__"])]
        return None

    def param_bytes(self, n_params: float) -> float:
        return float(n_params) * DTYPE_BYTES.get(self.param_dtype, 4)


def _spatial_dims(op: _Op, default: int) -> int:
    match = re.search(r"(\d)d$", op.name)
    return int(match.group(1)) if match else default


def _tuple(value: Any, n: int) -> list[int]:
    if isinstance(value, dict) and "__tuple__" in value:
        value = value["__tuple__"]
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)] * n


def _conv(op: _Op) -> tuple[float, float]:
    """Forward FLOPs and parameter elements of a convolution (module or function)."""
    x, out = op.shape(0), op.out_shape()
    if op.kind == "module":
        a = op.attrs
        groups = int(a.get("groups", 1))
        ks = a["kernel_size"]
        n_sp = len(ks) if isinstance(ks, list) else _spatial_dims(op, len(x) - 2)
        kernel = _numel(_tuple(ks, n_sp))
        cin, cout = int(a["in_channels"]), int(a["out_channels"])
        transposed = bool(a.get("transposed")) or "transpose" in op.name
        params = cin * cout // groups * kernel + (cout if a.get("bias") else 0)
    else:  # conv2d(input, weight, bias, stride, padding, dilation, groups)
        w = op.tensor_arg(1, "weight")
        if w is None:
            raise KeyError("weight")
        ws = [int(d) for d in w["shape"]]
        groups = int(op.arg(6, "groups", 1))
        n_sp, kernel = len(ws) - 2, _numel(ws[2:])
        transposed = "transpose" in op.name
        if transposed:  # weight (C_in, C_out / groups, *k)
            cin, cout = ws[0], ws[1] * groups
        else:  # weight (C_out, C_in / groups, *k)
            cin, cout = ws[1] * groups, ws[0]
        params = 0  # the weight is an input
    batch = x[0] if len(x) == n_sp + 2 else 1
    if transposed:
        flops = 2.0 * batch * cin * _numel(x[-n_sp:]) * (cout // groups) * kernel
    else:
        flops = 2.0 * batch * cout * _numel(out[-n_sp:]) * (cin // groups) * kernel
    return flops, float(params)


def _linear(op: _Op) -> tuple[float, float]:
    if op.kind == "module":
        fin, fout = int(op.attrs["in_features"]), int(op.attrs["out_features"])
        params = fin * fout + (fout if op.attrs.get("bias") else 0)
        return 2.0 * _numel(op.out_shape()) * fin, float(params)
    if op.name == "addmm":  # addmm(input, mat1, mat2)
        k = op.tensor_arg(1, "mat1")
    else:  # linear(input, weight, bias)
        k = op.tensor_arg(1, "weight")
    if k is None:
        raise KeyError("weight")
    return 2.0 * _numel(op.out_shape()) * int(k["shape"][-1]), 0.0


def _einsum_flops(op: _Op) -> float:
    equation = op.arg(0, "equation")
    if not isinstance(equation, str):
        raise KeyError("equation")
    lhs = equation.replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    ellipsis: list[int] = []
    for term, t in zip(lhs, op.inputs, strict=False):
        shape = [int(d) for d in t["shape"]]
        if "..." in term:
            head, tail = term.split("...")
            n_ell = len(shape) - len(head) - len(tail)
            ell = shape[len(head) : len(head) + n_ell]
            ellipsis = [max(a, b) for a, b in zip(ellipsis[-n_ell:] or ell, ell, strict=False)]
            term = head + tail
            shape = shape[: len(head)] + shape[len(head) + n_ell :]
        for letter, size in zip(term, shape, strict=False):
            sizes[letter] = max(sizes.get(letter, 1), size)
    product = float(math.prod(sizes.values()) * _numel(ellipsis))
    return (2.0 if len(lhs) > 1 else 1.0) * product


def _matmul(op: _Op) -> float:
    if op.name == "einsum":
        return _einsum_flops(op)
    position = 1 if op.name in {"baddbmm", "addbmm"} else 0
    a = op.tensor_arg(position, "batch1" if position else "input")
    if a is None:
        a = op.inputs[position]
    k = int(a["shape"][-1]) if a["shape"] else 1
    return 2.0 * _numel(op.out_shape()) * k


def _mha(op: _Op) -> tuple[float, float, float]:
    """FLOPs, parameter elements and intermediate bytes of nn.MultiheadAttention."""
    a = op.attrs
    e = int(a["embed_dim"])
    kdim, vdim = int(a.get("kdim") or e), int(a.get("vdim") or e)
    q, k = op.tensor_arg(0, "query"), op.tensor_arg(1, "key")
    if q is None or k is None:
        raise KeyError("query/key")
    qs, ks = [int(d) for d in q["shape"]], [int(d) for d in k["shape"]]
    if len(qs) == 3:
        seq = 1 if a.get("batch_first") else 0
        n, length, src = qs[1 - seq], qs[seq], ks[seq]
    else:  # unbatched (L, E)
        n, length, src = 1, qs[0], ks[0]
    flops = 2.0 * n * (length * e * e + src * kdim * e + src * vdim * e)  # projections
    flops += 2.0 * n * length * src * e  # QK^T over all heads
    flops += 2.0 * n * length * src * e  # AV
    flops += 2.0 * n * length * e * e  # output projection
    bias = a.get("bias", True) is not False
    params = e * (e + kdim + vdim) + e * e + (4 * e if bias else 0)
    params += 2 * e if a.get("add_bias_kv") else 0
    width = DTYPE_BYTES.get(op.param_dtype, 4)
    # q, k, v written by the projections and read by attention; the context written by
    # attention and read by the output projection.
    inter = 2.0 * width * n * (length * e + 2 * src * e) + 2.0 * width * n * length * e
    return flops, float(params), inter


def _sdpa(op: _Op) -> float:
    q, k, v = (op.tensor_arg(i, n) for i, n in enumerate(("query", "key", "value")))
    if q is None or k is None or v is None:
        raise KeyError("query/key/value")
    qs = [int(d) for d in q["shape"]]
    s, ev = int(k["shape"][-2]), int(v["shape"][-1])
    batch, length, e = _numel(qs[:-2]), qs[-2], qs[-1]
    return 2.0 * batch * length * s * e + 2.0 * batch * length * s * ev


def _norm_params(op: _Op) -> float:
    a = op.attrs
    if op.kind != "module":
        return 0.0  # weights are inputs
    if "normalized_shape" in a:
        ns = a["normalized_shape"]
        size = _numel(ns) if isinstance(ns, list) else int(ns)
        if not a.get("elementwise_affine", True):
            return 0.0
        return float(size * (2 if a.get("bias", True) is not False else 1))
    channels = int(a.get("num_features") or a.get("num_channels") or 0)
    return float(2 * channels) if a.get("affine") else 0.0


def _pool_kernel(op: _Op) -> int:
    n_sp = _spatial_dims(op, max(1, len(op.shape(0)) - 2))
    value = op.attrs.get("kernel_size") if op.kind == "module" else op.arg(1, "kernel_size")
    if value is None:
        raise KeyError("kernel_size")
    return _numel(_tuple(value, n_sp))


def _active_dropout(op: _Op, training: bool) -> bool:
    if op.kind == "module":
        p = op.attrs.get("p", 0.5)
        return training and isinstance(p, int | float) and p > 0
    p = op.arg(1, "p", 0.5)
    active = op.arg(2, "training", True)
    return bool(active) and isinstance(p, int | float) and p > 0


def _has_index_tensor(op: _Op) -> bool:
    """``x[idx]`` with a tensor in the index: a gather, not a view."""
    return "__tensor__" in json.dumps(op.spec.get("args", [])[1:])


def _forward_and_backward(op: _Op, family: str, training: bool) -> Work:
    """Work of one step (see the module docstring)."""
    x, o = op.float_in_bytes, op.float_out_bytes
    io = op.in_bytes + op.out_bytes
    saved = 0.0
    n_params = 0.0
    extra = 0.0  # further forward bytes (intermediates, indices, masks)
    if family == "view":
        if op.name == "getitem" and _has_index_tensor(op):  # a gather: index read, output
            return Work(0.0, op.in_bytes - op.nbytes(op.inputs[0]) + 2.0 * op.out_bytes)
        return Work(0.0, 0.0)
    if family in COMPUTE_FAMILIES:
        if family == "conv":
            flops, n_params = _conv(op)
        elif family == "linear":
            flops, n_params = _linear(op)
        elif family == "matmul":
            flops = _matmul(op)
        elif op.name == "multiheadattention":
            flops, n_params, extra = _mha(op)
        else:
            flops = _sdpa(op)
        fwd_bytes = io + op.param_bytes(n_params) + extra
        return Work(3 * flops, 3 * fwd_bytes) if training else Work(flops, fwd_bytes)
    in_numel, out_numel = op.in_numel, op.out_numel
    if family == "norm":
        flops, n_params, saved = 5.0 * in_numel, _norm_params(op), x
    elif family == "activation":
        flops, saved = 1.0 * out_numel, x
    elif family == "softmax":
        flops, saved = 5.0 * in_numel, o
    elif family == "pool":
        if "adaptive" in op.name:
            flops = float(in_numel)
        else:
            flops = float(_numel(op.out_shape()) * _pool_kernel(op))
        if "max" in op.name:
            indices = _numel(op.out_shape()) * _INDEX_BYTES
            if len(op.outputs) == 1:  # written on the GPU even when not returned
                extra += indices
            saved = indices
    elif family == "elementwise":
        if op.name in {"stochasticdepth", "stochastic_depth"}:
            if op.kind == "module":
                active = training and bool(op.attrs.get("p"))
            else:  # stochastic_depth(input, p, mode, training=True)
                active = bool(op.arg(3, "training", True)) and bool(op.arg(1, "p"))
            if not active:
                return Work(0.0, 0.0)
        if op.name in {"mean", "sum"}:
            flops = float(in_numel)
        else:
            flops = float(_numel(op.out_shape())) if op.outputs else float(in_numel)
        if op.name in {"mul", "div", "truediv"}:
            saved = x
    elif family == "dropout":
        if not _active_dropout(op, training):
            return Work(0.0, 0.0)
        flops = 2.0 * in_numel
        mask = float(_numel(op.shape(0)))  # bool, 1 byte per element
        extra, saved = mask, mask
    elif family in {"cat", "copy"}:
        flops = 0.0
        if family == "copy" and _copy_is_identity(op):
            return Work(0.0, 0.0)
        if op.name == "copy":  # dst.copy_(src): src read, dst written
            io = sum(op.nbytes(t) for t in op.inputs[1:]) + op.out_bytes
    else:  # other
        flops = float(max(in_numel, out_numel))
    w = op.param_bytes(n_params)
    fwd = io + w + extra
    if not training:
        return Work(flops, fwd)
    return Work(2.0 * flops, fwd + o + x + 2.0 * w + saved)


def _copy_is_identity(op: _Op) -> bool:
    """``contiguous`` of a contiguous tensor, ``to`` changing neither dtype nor layout."""
    if not op.inputs or not op.outputs:
        return True
    src, dst = op.inputs[0], op.outputs[0]
    if op.name == "contiguous":
        fmt = json.dumps(op.spec.get("args", [])[1:]) + json.dumps(op.spec.get("kwargs", {}))
        return "stride" not in src and "channels_last" not in fmt
    if op.name == "to":
        call = json.dumps(op.spec.get("args", [])[1:]) + json.dumps(op.spec.get("kwargs", {}))
        same_dtype = src["dtype"] == dst["dtype"] or (
            op.dtype is not None and _is_float(src["dtype"]) and _is_float(dst["dtype"])
        )
        return same_dtype and "__memory_format__" not in call and '"copy": true' not in call
    return False


def op_work(spec: dict[str, Any], mode: str, dtype: str | None = None) -> Work:
    """FLOPs and DRAM bytes of one step of an op in ``mode`` (see the module docstring).

    Args:
        spec: the op's spec (:mod:`opcost.spec` format).
        mode: ``"inference"`` (forward) or ``"training"`` (forward and backward).
        dtype: the floating dtype the op runs in (the harness casts floating inputs and
            parameters to it); None: the spec's own dtypes.
    """
    if mode not in MODES:
        raise RooflineError(f"unknown mode {mode!r}; expected one of {list(MODES)}")
    op_type = spec.get("type", "?") if isinstance(spec, dict) else "?"
    try:
        op = _Op(spec, dtype)
        return _forward_and_backward(op, family_of(op.type), mode == "training")
    except RooflineError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise RooflineError(
            f"cannot count the work of {op_type}: its spec lacks or garbles {e}; "
            "extract it again (opcost.spec format)"
        ) from None


# -- peaks and times ------------------------------------------------------------------


@dataclass(frozen=True)
class Peaks:
    """A GPU's achievable rates: matrix-product FLOP/s and DRAM bytes/s."""

    matmul_flops_per_s: float
    memory_bytes_per_s: float

    def to_dict(self) -> dict[str, float]:
        return {
            "matmul_flops_per_s": self.matmul_flops_per_s,
            "memory_bytes_per_s": self.memory_bytes_per_s,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Peaks:
        """From :meth:`to_dict` or :func:`opcost.peaks.measure_peaks` (other keys ignored)."""
        values = {}
        for key in ("matmul_flops_per_s", "memory_bytes_per_s"):
            value = d.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise RooflineError(f"peaks: {key} missing or not a number; measure peaks again")
            if not (math.isfinite(value) and value > 0):
                raise RooflineError(f"peaks: {key} = {value!r} must be positive and finite")
            values[key] = float(value)
        return cls(**values)


def roofline_time_s(work: Work, peaks: Peaks) -> float:
    """The roofline time: ``max(flops / matmul rate, bytes / memory rate)``, seconds."""
    return max(work.flops / peaks.matmul_flops_per_s, work.bytes / peaks.memory_bytes_per_s)


@lru_cache(maxsize=65536)
def _cached_work(spec_json: str, mode: str, dtype: str | None) -> Work:
    return op_work(json.loads(spec_json), mode, dtype)


def roofline_times_s(
    specs: Sequence[str],
    modes: Sequence[str],
    peaks: Peaks,
    dtypes: Sequence[str | None] | None = None,
) -> np.ndarray:
    """Roofline times (s) of ops given as canonical spec JSON strings, one mode each
    (and optionally one floating dtype each); the work is cached per (spec, mode, dtype)."""
    if len(specs) != len(modes) or (dtypes is not None and len(dtypes) != len(specs)):
        raise RooflineError("roofline_times_s: specs, modes and dtypes differ in length")
    dts = dtypes if dtypes is not None else [None] * len(specs)
    works = [_cached_work(s, m, d) for s, m, d in zip(specs, modes, dts, strict=True)]
    flops = np.fromiter((w.flops for w in works), dtype=np.float64, count=len(works))
    nbytes = np.fromiter((w.bytes for w in works), dtype=np.float64, count=len(works))
    return np.maximum(flops / peaks.matmul_flops_per_s, nbytes / peaks.memory_bytes_per_s)


# -- shape features ---------------------------------------------------------------------
