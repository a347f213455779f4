"""An op's spec read for its sizes: its family, its tensors and the products it computes.

Reads the spec format of :mod:`opcost.spec` (no torch, as ``opcost predict`` needs): the
roofline work (:mod:`opcost.model.roofline`) and the op models' shape features
(:mod:`opcost.model.shapes`) read an op through :class:`OpSpec` and count a convolution's
or linear layer's product the same way (:func:`conv_flops_params`,
:func:`linear_flops_params`)::

    op = OpSpec(json.loads(spec_json), "float32")
    family_of(op.type), op.shape(0), op.out_shape()

**Families.** :func:`family_of` maps an op type (qualified name) to one of
:data:`FAMILIES`: an exact table first, then the last name component, lower-cased, with
in-place and dunder spellings reduced (``__iadd__`` and ``add_`` -> ``add``), then prefixes
(``conv``, ``maxpool``, ``batchnorm``, ...); ``"other"`` for anything unknown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from opcost.errors import OpcostError


class SpecError(OpcostError, ValueError):
    """An op's spec names something its sizes cannot be read from (an unknown dtype); the
    message names the op."""


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
    **dict.fromkeys(
        ("stochasticdepth", "stochastic_depth", "neg", "pow", "masked_fill", "normalize"),
        "elementwise",
    ),
    **dict.fromkeys(("softmax", "log_softmax", "logsoftmax"), "softmax"),
    **dict.fromkeys(("dropout", "dropout1d", "dropout2d", "dropout3d"), "dropout"),
    **dict.fromkeys(("alpha_dropout", "alphadropout", "feature_alpha_dropout"), "dropout"),
    **dict.fromkeys(("cat", "stack", "concat", "concatenate"), "cat"),
    **dict.fromkeys(("contiguous", "clone", "to", "copy", "pad", "roll", "setitem"), "copy"),
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
            "swapaxes",
            "swapdims",
            "movedim",
            "moveaxis",
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


def reduced_name(op_type: str) -> str:
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
    name = reduced_name(op_type)
    if name in _BY_NAME:
        return _BY_NAME[name]
    for prefix, family in _PREFIXES:
        if name.startswith(prefix):
            return family
    return "other"


def numel(shape: Sequence[int]) -> int:
    """The elements of a tensor of ``shape``."""
    return math.prod(int(d) for d in shape)


def is_float(dtype: str) -> bool:
    """Whether a dtype name is a floating (or complex) one."""
    return dtype.startswith(("float", "bfloat", "complex"))


class OpSpec:
    """A spec's tensors and settings, with byte sizes at the measured dtype."""

    def __init__(self, spec: dict[str, Any], dtype: str | None) -> None:
        self.spec = spec
        self.type: str = spec["type"]
        self.name = reduced_name(self.type)
        self.kind: str = spec["kind"]
        self.attrs: dict[str, Any] = spec.get("attrs") or {}
        self.inputs: list[dict[str, Any]] = list(spec.get("inputs", []))
        self.outputs: list[dict[str, Any]] = list(spec.get("outputs", []))
        self.dtype = dtype
        floats = [t["dtype"] for t in self.inputs + self.outputs if is_float(t["dtype"])]
        self.param_dtype = dtype or (floats[0] if floats else "float32")

    def width(self, t: dict[str, Any]) -> int:
        name = t["dtype"]
        if self.dtype is not None and is_float(name):
            name = self.dtype
        try:
            return DTYPE_BYTES[name]
        except KeyError:
            raise SpecError(
                f"{self.type}: unknown dtype {name!r}; expected one of {sorted(DTYPE_BYTES)}"
            ) from None

    def nbytes(self, t: dict[str, Any]) -> float:
        return float(numel(t["shape"]) * self.width(t))

    @property
    def in_bytes(self) -> float:
        return sum(self.nbytes(t) for t in self.inputs)

    @property
    def float_in_bytes(self) -> float:
        return sum(self.nbytes(t) for t in self.inputs if is_float(t["dtype"]))

    @property
    def out_bytes(self) -> float:
        return sum(self.nbytes(t) for t in self.outputs)

    @property
    def float_out_bytes(self) -> float:
        return sum(self.nbytes(t) for t in self.outputs if is_float(t["dtype"]))

    @property
    def in_numel(self) -> int:
        return sum(numel(t["shape"]) for t in self.inputs)

    @property
    def out_numel(self) -> int:
        return sum(numel(t["shape"]) for t in self.outputs)

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


def spatial_dims(op: OpSpec, default: int) -> int:
    """The spatial dimensions an op's name states (``conv2d``, ``MaxPool3d``), else
    ``default``."""
    match = re.search(r"(\d)d$", op.name)
    return int(match.group(1)) if match else default


def int_list(value: Any, n: int) -> list[int]:
    """A size argument as a list: a spec's tuple or list as it is, one int ``n`` times."""
    if isinstance(value, dict) and "__tuple__" in value:
        value = value["__tuple__"]
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)] * n


def conv_flops_params(op: OpSpec) -> tuple[float, float]:
    """Forward FLOPs and parameter elements of a convolution (module or function)."""
    x, out = op.shape(0), op.out_shape()
    if op.kind == "module":
        a = op.attrs
        groups = int(a.get("groups", 1))
        ks = a["kernel_size"]
        n_sp = len(ks) if isinstance(ks, list) else spatial_dims(op, len(x) - 2)
        kernel = numel(int_list(ks, n_sp))
        cin, cout = int(a["in_channels"]), int(a["out_channels"])
        transposed = bool(a.get("transposed")) or "transpose" in op.name
        params = cin * cout // groups * kernel + (cout if a.get("bias") else 0)
    else:  # conv2d(input, weight, bias, stride, padding, dilation, groups)
        w = op.tensor_arg(1, "weight")
        if w is None:
            raise KeyError("weight")
        ws = [int(d) for d in w["shape"]]
        groups = int(op.arg(6, "groups", 1))
        n_sp, kernel = len(ws) - 2, numel(ws[2:])
        transposed = "transpose" in op.name
        if transposed:  # weight (C_in, C_out / groups, *k)
            cin, cout = ws[0], ws[1] * groups
        else:  # weight (C_out, C_in / groups, *k)
            cin, cout = ws[1] * groups, ws[0]
        params = 0  # the weight is an input
    batch = x[0] if len(x) == n_sp + 2 else 1
    if transposed:
        flops = 2.0 * batch * cin * numel(x[-n_sp:]) * (cout // groups) * kernel
    else:
        flops = 2.0 * batch * cout * numel(out[-n_sp:]) * (cin // groups) * kernel
    return flops, float(params)


def linear_flops_params(op: OpSpec) -> tuple[float, float]:
    """Forward FLOPs and parameter elements of a linear layer (module, ``linear`` or
    ``addmm``)."""
    if op.kind == "module":
        fin, fout = int(op.attrs["in_features"]), int(op.attrs["out_features"])
        params = fin * fout + (fout if op.attrs.get("bias") else 0)
        return 2.0 * numel(op.out_shape()) * fin, float(params)
    if op.name == "addmm":  # addmm(input, mat1, mat2)
        k = op.tensor_arg(1, "mat1")
    else:  # linear(input, weight, bias)
        k = op.tensor_arg(1, "weight")
    if k is None:
        raise KeyError("weight")
    return 2.0 * numel(op.out_shape()) * int(k["shape"][-1]), 0.0
