"""The op space's families other than convolutions (:mod:`opcost.opspace_conv`): how a
point of the unit cube becomes one configuration of each, and its call on the ``meta``
device, as networks make it (docs/op-space.md, "What is sampled"). The matrix products'
families (linear, matmul, attention) are in :mod:`opcost.opspace_products`, copies in
:mod:`opcost.opspace_copies`; :data:`FAMILY_MAKERS` names them all."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from opcost.opspace_copies import _copy, _copy_call
from opcost.opspace_draw import (
    ATTENTION_TOKENS,
    HEAD_DIMS,
    TRANSFORMER_HEADS,
    Call,
    beyond,
    log_int,
    nchw,
    pick,
    power_of_two,
    round_to,
    tensor_shape,
    width,
)
from opcost.opspace_draw import function_call as _f
from opcost.opspace_draw import meta_tensor as _t
from opcost.opspace_draw import module_call as _m
from opcost.opspace_products import (
    _attention,
    _attention_call,
    _linear,
    _linear_call,
    _matmul,
    _matmul_call,
)
from opcost.opspace_stages import PATCH_HALVINGS, stage_map


def _tensor(p: dict[str, Any]) -> torch.Tensor:
    if p["layout"] == "tokens":
        return _t(p["batch"], p["tokens"], p["channels"])
    if p["layout"] == "nhwc":  # a map with its channels last, as a LayerNorm takes it
        n, c, h, w = nchw(p)
        return _t(n, c, h, w).permute(0, 2, 3, 1) if p["permuted"] else _t(n, h, w, c)
    return _t(*nchw(p), channels_last=p["channels_last"])


def _norm(u: Sequence[float], generator: int = 1) -> dict[str, Any]:
    """A norm: BatchNorm2d, LayerNorm (tokens), LayerNorm2d (ConvNeXt's) or GroupNorm of 32
    groups, a quarter each, on any tensor of :func:`tensor_shape`; from generator 13 on,
    :func:`_staged_norm`; from 14 on, with LayerNorm on a stage's map too."""
    if generator >= 13:
        return _staged_norm(u, generator)
    p = tensor_shape(u)
    p["type"] = pick(u[5], ["batchnorm", "layernorm", "layernorm2d", "groupnorm"])
    p["layout"] = "tokens" if p["type"] == "layernorm" else "nchw"
    p["spatial"] = max(p["spatial"], 2) if p["type"] == "batchnorm" else p["spatial"]
    if p["type"] == "groupnorm":
        p["channels"] = round_to(p["channels"], 32)
    return p


def _staged_norm(u: Sequence[float], generator: int = 13) -> dict[str, Any]:
    """The norm of a network's stage: BatchNorm2d six times in ten, on the map of a
    network's stage (:func:`opcost.opspace_stages.stage_map`); else LayerNorm on the
    tokens of a stage (its map over 4 squared, a class token half the time: ViT's 197 and
    50, Swin's 3,136 and 784) or ConvNeXt's LayerNorm2d on a stage's map; widths of
    8-2048 as networks align them, a power-of-two batch (1-256). A BatchNorm2d in
    training with few channels on a large map runs far below the memory bandwidth of
    those with many (cuDNN reduces each channel's statistics apart): networks' early
    layers, rare among generator 1's norms (docs/op-space.md, round 30).

    Generator 14 draws BatchNorm2d 45 times in a hundred, LayerNorm on tokens 15, and 30
    LayerNorm on a stage's map with its channels last (``[N, H, W, C]``: Swin's and
    ConvNeXt's blocks), a third of them a permuted view of an NCHW map (Swin's first);
    LayerNorm2d 10. Those 4-D LayerNorms' kernels are the tokens', rows of ``C``, but a
    tree keyed on four dimensions sees none of them among generator 13's norms. Its
    LayerNorms take the maps of a network of 4x4 patches (:data:`PATCH_HALVINGS`: 56,
    28, 14 and 7 of a 224 input; their tokens 3,136 to 49, a class token half the time:
    ViT's 197 and 50), where generator 13's map over 4 is mostly 7 or less."""
    if generator < 14:
        kind = pick(u[5], ["batchnorm", "layernorm", "layernorm2d"], [0.6, 0.25, 0.15])
        side = stage_map(u[3])
        tokens = max((side // 4) ** 2, 1) + (beyond(u[1]) < 0.5)
    else:
        kinds = ["batchnorm", "layernorm", "layernorm2d", "layernorm_map"]
        kind = pick(u[5], kinds, [0.45, 0.15, 0.1, 0.3])
        patches = stage_map(u[3], PATCH_HALVINGS)
        side = patches if kind.startswith("layernorm") else stage_map(u[3])
        tokens = patches**2 + (beyond(u[1]) < 0.5)
    layout = {"layernorm": "tokens", "layernorm_map": "nhwc"}.get(kind, "nchw")
    p = {
        "batch": power_of_two(u[0], 1, 256),
        "layout": layout,
        "channels": width(u[2], 8, 2048),
        "spatial": max(side, 2),
        "tokens": tokens,
        "channels_last": u[4] < 0.25,
        "type": "layernorm" if kind == "layernorm_map" else kind,
    }
    if layout == "nhwc":
        p["permuted"] = u[4] < 1 / 3
    return p


def _norm_call(p: dict[str, Any]) -> Call:
    from torchvision.models.convnext import LayerNorm2d

    c = p["channels"]
    module = {
        "batchnorm": lambda: torch.nn.BatchNorm2d(c, device="meta"),
        "layernorm": lambda: torch.nn.LayerNorm(c, device="meta"),
        "layernorm2d": lambda: LayerNorm2d(c, device="meta"),
        "groupnorm": lambda: torch.nn.GroupNorm(32, c, device="meta"),
    }[p["type"]]()
    return _m(module, _tensor(p))


_ACTIVATIONS = ("ReLU", "ReLU6", "GELU", "SiLU", "Hardswish", "Hardsigmoid", "Sigmoid", "Tanh")
_INPLACE = frozenset({"ReLU", "ReLU6", "SiLU", "Hardswish", "Hardsigmoid"})


#: Generator 21's activations called as functions: Inception's and DenseNet's
#: ``F.relu(x, inplace=True)`` (or not), and ``torch.sigmoid`` (Swin V2's).
FUNCTIONAL_ACTIVATIONS = (("relu", "sigmoid"), (0.7, 0.3))


def _activation(u: Sequence[float], generator: int = 1) -> dict[str, Any]:
    """An activation module of :data:`_ACTIVATIONS` on a tensor of :func:`tensor_shape`,
    in place (where it can be) six times in ten; from generator 21 on, one called as a
    function (:data:`FUNCTIONAL_ACTIVATIONS`)."""
    p = tensor_shape(u)
    if generator >= 21:
        p["type"] = "F." + pick(u[5], *FUNCTIONAL_ACTIVATIONS)
        p["inplace"] = p["type"] == "F.relu" and u[6] < 0.6
        return p
    p["type"] = pick(u[5], _ACTIVATIONS)
    p["inplace"] = p["type"] in _INPLACE and u[6] < 0.6
    return p


def _activation_call(p: dict[str, Any]) -> Call:
    x, kind = _tensor(p), p["type"]
    if kind == "F.sigmoid":
        return _f(torch.sigmoid, x)
    if kind == "F.relu":  # its torch-function dispatch names ``inplace``, as networks record it
        return _f(torch.nn.functional.relu, x, inplace=bool(p["inplace"]))
    cls = getattr(torch.nn, kind)
    return _m(cls(inplace=True) if p["inplace"] else cls(), x)


def _pool(u: Sequence[float], generator: int = 1) -> dict[str, Any]:
    """A pooling module on an NCHW map of 2-224: max (kernel 2 or 3, stride 2), average or
    adaptive average (to 1x1 or 7x7); from generator 21 on, one called as a function as
    Inception and DenseNet call it: ``F.max_pool2d(x, 3, stride=2)``,
    ``F.avg_pool2d(x, 3, stride=1, padding=1)``, ``F.adaptive_avg_pool2d(x, (1, 1))``."""
    p = tensor_shape(u)
    p["layout"] = "nchw"
    p["spatial"] = max(2, log_int(u[3], 2, 224))
    if generator >= 21:
        kinds = ["F.max_pool2d", "F.avg_pool2d", "F.adaptive_avg_pool2d"]
        p["type"] = pick(u[5], kinds, [0.35, 0.35, 0.3])
        p["spatial"] = max(3, p["spatial"])
        return p
    p["type"] = pick(u[5], ["max", "avg", "adaptive"], [0.45, 0.2, 0.35])
    p["kernel"] = pick(u[6], [2, 3])
    p["output"] = pick(u[6], [1, 7], [0.8, 0.2])
    return p


def _pool_call(p: dict[str, Any]) -> Call:
    f = torch.nn.functional
    if p["type"] == "F.max_pool2d":
        # The keywords F.max_pool2d's dispatch passes on, as a network's call records them.
        kw = {"padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False}
        return _f(f.max_pool2d, _tensor(p), 3, stride=2, **kw)
    if p["type"] == "F.avg_pool2d":
        return _f(f.avg_pool2d, _tensor(p), kernel_size=3, stride=1, padding=1)
    if p["type"] == "F.adaptive_avg_pool2d":
        return _f(f.adaptive_avg_pool2d, _tensor(p), (1, 1))
    k = min(p["kernel"], p["spatial"])
    module = {
        "max": lambda: torch.nn.MaxPool2d(k, stride=2, padding=k // 2 if k == 3 else 0),
        "avg": lambda: torch.nn.AvgPool2d(k, stride=2),
        "adaptive": lambda: torch.nn.AdaptiveAvgPool2d(p["output"]),
    }[p["type"]]()
    return _m(module, _tensor(p))


def _elementwise(u: Sequence[float], generator: int = 1) -> dict[str, Any]:
    """An elementwise op on a tensor of :func:`tensor_shape`: ``add``, ``add_``, ``mul``,
    a squeeze-and-excitation scale, a spatial ``mean`` or ``StochasticDepth``; from
    generator 21 on, :func:`_window_elementwise`."""
    if generator >= 21:
        return _window_elementwise(u)
    p = tensor_shape(u)
    p["type"] = pick(u[5], ["add", "add_", "mul", "scale", "mean", "stochastic_depth"])
    if p["type"] in ("scale", "mean"):
        p["layout"] = "nchw"
    return p


#: Generator 21's elementwise ops of an attention block, and how often each.
WINDOW_ELEMENTWISE = (("normalize", "bias", "logit_scale", "q_scale"), (0.35, 0.25, 0.15, 0.25))


def _window_elementwise(u: Sequence[float]) -> dict[str, Any]:
    """An elementwise op of an attention block on ``(windows, heads, tokens, ...)``:
    ``F.normalize(q, dim=-1)`` of a query that is a view of a fused q, k, v projection
    (Swin V2's cosine attention), the scores plus a relative position bias of ``(1,
    heads, tokens, tokens)``, the scores times a per-head logit scale ``(heads, 1, 1)``, or
    a query view times a scalar (:data:`WINDOW_ELEMENTWISE`); :data:`ATTENTION_TOKENS`,
    :data:`TRANSFORMER_HEADS` heads of :data:`HEAD_DIMS`, a batch of windows of 1-2,048
    (a power of two)."""
    return {
        "type": pick(u[1], *WINDOW_ELEMENTWISE),
        "batch": power_of_two(u[0], 1, 2048),
        "heads": pick(u[2], *TRANSFORMER_HEADS),
        "tokens": pick(u[3], *ATTENTION_TOKENS),
        "head_dim": pick(u[4], *HEAD_DIMS),
    }


def _query_view(b: int, n: int, h: int, d: int) -> torch.Tensor:
    """The query of ``(b, n, 3, h, d)``'s fused projection, as ``(b, h, n, d)``: a view."""
    return _t(b, n, 3, h, d).permute(2, 0, 3, 1, 4)[0]


def _elementwise_call(p: dict[str, Any]) -> Call:
    from torchvision.ops import StochasticDepth

    kind = p["type"]
    if kind in WINDOW_ELEMENTWISE[0]:
        b, h, n, d = p["batch"], p["heads"], p["tokens"], p["head_dim"]
        if kind == "normalize":
            q = _query_view(b, n, h, d)
            return _f(torch.nn.functional.normalize, q, p=2.0, dim=-1, eps=1e-12, out=None)
        if kind == "q_scale":
            return _f(torch.Tensor.mul, _query_view(b, n, h, d), d**-0.5)
        if kind == "bias":
            return _f(torch.Tensor.add, _t(b, h, n, n), _t(1, h, n, n))
        return _f(torch.Tensor.mul, _t(b, h, n, n), _t(h, 1, 1))
    x = _tensor(p)
    if kind in ("add", "add_", "mul"):
        fn = {"add": torch.Tensor.add, "add_": torch.Tensor.add_, "mul": torch.Tensor.mul}[kind]
        return _f(fn, x, _tensor(p))
    if kind == "scale":  # squeeze-and-excitation: (N, C, 1, 1) times (N, C, H, W)
        return _f(torch.Tensor.mul, x, _t(p["batch"], p["channels"], 1, 1))
    if kind == "mean":
        return _f(torch.Tensor.mean, x, [2, 3], keepdim=True)
    return _m(StochasticDepth(0.1, "row"), x)


def _softmax(u: Sequence[float], generator: int = 1) -> dict[str, Any]:
    """A softmax over the last dimension (``torch.softmax`` or ``nn.Softmax``) of
    ``(batch, heads, rows, columns)``, each log-uniform; from generator 21 on,
    :func:`_window_softmax`."""
    if generator >= 21:
        return _window_softmax(u)
    return {
        "type": pick(u[0], ["function", "module"]),
        "batch": log_int(u[1], 1, 256),
        "heads": log_int(u[2], 1, 16),
        "rows": log_int(u[3], 1, 1024),
        "cols": log_int(u[4], 16, 1024),
    }


def _window_softmax(u: Sequence[float]) -> dict[str, Any]:
    """An attention block's softmax called as ``F.softmax(scores, dim=-1)`` (Swin's,
    MaxViT's): scores of :data:`ATTENTION_TOKENS` squared for :data:`TRANSFORMER_HEADS`
    heads, a power-of-two batch (1-256), of 1-64 windows (half the time, as a shifted
    window's 5-D view) or of one."""
    tokens = pick(u[3], *ATTENTION_TOKENS)
    return {
        "type": "functional",
        "batch": power_of_two(u[1], 1, 256),
        "groups": power_of_two(u[4], 1, 64) if beyond(u[4]) < 0.5 else 0,
        "heads": pick(u[2], *TRANSFORMER_HEADS),
        "rows": tokens,
        "cols": tokens,
    }


def _softmax_call(p: dict[str, Any]) -> Call:
    lead = (p["batch"], p["groups"]) if p.get("groups") else (p["batch"],)
    x = _t(*lead, p["heads"], p["rows"], p["cols"])
    if p["type"] == "functional":
        return _f(torch.nn.functional.softmax, x, dim=-1, _stacklevel=3, dtype=None)
    if p["type"] == "module":
        return _m(torch.nn.Softmax(dim=-1), x)
    return _f(torch.softmax, x, -1)


def _dropout(u: Sequence[float]) -> dict[str, Any]:
    p = tensor_shape(u)
    p["p"] = pick(u[5], [0.1, 0.2, 0.5])
    return p


def _dropout_call(p: dict[str, Any]) -> Call:
    return _m(torch.nn.Dropout(p["p"]), _tensor(p))


def _cat(u: Sequence[float]) -> dict[str, Any]:
    p = tensor_shape(u)
    p["layout"] = "nchw"
    p["parts"] = pick(u[5], [2, 3, 4], [0.6, 0.2, 0.2])
    return p


def _cat_call(p: dict[str, Any]) -> Call:
    parts = tuple(_tensor(p) for _ in range(p["parts"]))
    return _f(torch.cat, parts, dim=1)


def _view(u: Sequence[float]) -> dict[str, Any]:
    p = tensor_shape(u)
    p["layout"] = "nchw"
    p["type"] = pick(u[5], ["flatten", "Flatten", "view", "permute", "transpose"])
    p["channels_last"] = p["channels_last"] and p["type"] in ("permute", "transpose")
    return p


def _view_call(p: dict[str, Any]) -> Call:
    x = _tensor(p)
    kind = p["type"]
    if kind == "flatten":
        return _f(torch.flatten, x, 1)
    if kind == "Flatten":
        return _m(torch.nn.Flatten(), x)
    if kind == "view":
        return _f(torch.Tensor.view, x, p["batch"], -1)
    if kind == "permute":
        return _f(torch.Tensor.permute, x, 0, 2, 3, 1)
    return _f(torch.transpose, x, 1, 2)


#: The families here whose map from the unit cube depends on the generator version.
VERSIONED_FAMILIES = frozenset(
    ("linear", "norm", "matmul", "attention")
    + ("activation", "pool", "elementwise", "softmax", "copy")  # generators 21-23's
)

#: Each family's dimensions in the unit cube, its map from a point to parameters and its
#: call, in the order :data:`opcost.opspace.FAMILIES` lists them after convolutions.
FAMILY_MAKERS: dict[str, tuple[int, Callable[..., dict[str, Any]], Callable[..., Call]]] = {
    "linear": (6, _linear, _linear_call),
    "matmul": (7, _matmul, _matmul_call),
    "attention": (5, _attention, _attention_call),
    "norm": (6, _norm, _norm_call),
    "activation": (7, _activation, _activation_call),
    "pool": (7, _pool, _pool_call),
    "elementwise": (6, _elementwise, _elementwise_call),
    "softmax": (5, _softmax, _softmax_call),
    "dropout": (6, _dropout, _dropout_call),
    "cat": (6, _cat, _cat_call),
    "copy": (6, _copy, _copy_call),
    "view": (6, _view, _view_call),
}
