"""The op space's families other than convolutions (:mod:`opcost.opspace_conv`): how a
point of the unit cube becomes one configuration of each, and its call on the ``meta``
device, as networks make it (docs/op-space.md, "What is sampled")."""

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
from opcost.opspace_stages import PATCH_HALVINGS, block_width, stage_map


def _linear(u: Sequence[float], generator: int = 1) -> dict[str, Any]:
    """A linear layer on ``(batch, fin)`` or ``(batch, tokens, fin)``, widths of 8-8192
    drawn apart; from generator 19 on, :func:`_block_linear`; from generator 21 on, the same
    layer called as ``F.linear(x, weight, bias)`` (Swin's attention, with its bias)."""
    if generator >= 21:
        return {**_block_linear(u), "functional": True, "bias": True}
    if generator >= 19:
        return _block_linear(u)
    return {
        "batch": log_int(u[0], 1, 256),
        "tokens": pick(u[1], [0, 1], [0.5, 0.5]) and log_int(u[2], 4, 1024),
        "fin": width(u[3], 8, 8192),
        "fout": width(u[4], 8, 8192),
        "bias": u[5] < 0.8,
    }


#: Generator 19's layers of a transformer block or a classifier, output width over the
#: block's width (``None``: a classifier's classes), and how often each: the fused q, k, v
#: projection (3), the attention's output projection (1), the MLP's expansion (4; 2 and 3
#: less often) and its contraction (1/4, 1/2, 1/3), the classifier head.
BLOCK_LINEAR_RATIOS = (
    (3, 1, 4, 2, 3, 1 / 4, 1 / 2, 1 / 3, None),
    (0.17, 0.17, 0.17, 0.03, 0.03, 0.17, 0.03, 0.03, 0.2),
)
#: Generator 19's classifier heads: ImageNet's 1,000 classes half the time, else a width.
HEAD_CLASSES = 1000


def _block_linear(u: Sequence[float]) -> dict[str, Any]:
    """A linear layer of a transformer block or a classifier head (:data:`BLOCK_LINEAR_RATIOS`):
    a block's width of :func:`opcost.opspace_stages.block_width` (32-2048 channels), its
    output that times the ratio (rounded to 8), on ``(batch, tokens, width)`` with the
    tokens of an attention block (:data:`ATTENTION_TOKENS`; ViT's, Swin's windows) or
    on ``(batch, map, map, width)``, a stage's channels-last map (ConvNeXt's and Swin's
    MLPs, :data:`opcost.opspace_stages.PATCH_HALVINGS`), half each; a head on ``(batch,
    width)`` to 1,000 classes (half the time) or a width of 8-8192; a power-of-two batch
    (1-256), a bias nine times in ten. The other versions draw both widths apart on 2-D and
    3-D inputs: of rounds 1-45's 517 linear layers on the H200 (TF32 on), 94 have both
    widths multiples of 64, 12 of the 48 above 5 GFLOP, and none lies on a map
    (docs/op-space.md, round 46)."""
    d = max(block_width(u[3]), 32)
    ratio = pick(u[4], *BLOCK_LINEAR_RATIOS)
    head = ratio is None
    if head:
        fout = HEAD_CLASSES if beyond(u[4]) < 0.5 else width(beyond(u[4]), 8, 8192)
    elif ratio >= 1:  # the block's width in
        fout = round_to(round(d * ratio), 8)
    else:  # a contraction: the block's width out, the expansion in
        d, fout = round_to(round(d / ratio), 8), d
    on_map = not head and u[1] < 0.5
    return {
        "batch": power_of_two(u[0], 1, 256),
        "tokens": 0 if head or on_map else pick(u[2], *ATTENTION_TOKENS),
        "spatial": stage_map(u[2], PATCH_HALVINGS) if on_map else 0,
        "fin": d,
        "fout": fout,
        "bias": u[5] < 0.9,
    }


def _linear_call(p: dict[str, Any]) -> Call:
    lin = torch.nn.Linear(p["fin"], p["fout"], bias=p["bias"], device="meta")
    if p.get("spatial"):  # a stage's map, channels last
        shape = (p["batch"], p["spatial"], p["spatial"], p["fin"])
    elif p["tokens"]:
        shape = (p["batch"], p["tokens"], p["fin"])
    else:
        shape = (p["batch"], p["fin"])
    if p.get("functional"):
        return _f(torch.nn.functional.linear, _t(*shape), lin.weight, lin.bias)
    return _m(lin, _t(*shape))


def _matmul(u: Sequence[float], generator: int = 1) -> dict[str, Any]:
    """A matrix product: ``torch.matmul``, ``torch.bmm`` or ``a @ b`` of two contiguous
    operands, 4-2048 wide; from generator 17 on, :func:`_attention_product`."""
    if generator >= 17:
        return _attention_product(u)
    return {
        "type": pick(u[0], ["matmul", "bmm", "operator"]),
        "batch": log_int(u[1], 1, 256),
        "heads": pick(u[2], [0, 1], [0.5, 0.5]) and log_int(u[3], 2, 16),
        "m": width(u[4], 4, 2048),
        "k": width(u[5], 8, 2048),
        "n": width(u[6], 4, 2048),
    }


def _attention_product(u: Sequence[float]) -> dict[str, Any]:
    """A matrix product of an attention block written out: the scores ``q k^T`` or the
    values ``a v`` (half each), by ``torch.einsum`` over 5-D operands (batch, window
    groups, heads; MaxViT's) or by ``torch.matmul`` over 4-D ones (Swin's), its ``q``,
    ``k`` and ``v`` views of one fused projection (four in five) as networks split it, of
    :data:`ATTENTION_TOKENS` tokens and :data:`HEAD_DIMS`, 1-16 heads, 1-64 window groups
    (half the time), a power-of-two batch. The other generators draw contiguous operands
    of ``matmul`` and ``bmm`` only: MaxViT's einsums of views ran a copy before the product,
    and were predicted at 0.41-0.62 of their traced GPU time in inference
    (docs/op-space.md, round 42)."""
    return {
        "type": pick(u[0], ["einsum", "matmul"]),
        "product": pick(beyond(u[0]), ["scores", "values"]),
        "batch": power_of_two(u[1], 1, 256),
        "fused": u[2] < 0.8,
        "heads": log_int(u[3], 1, 16),
        "tokens": pick(u[4], *ATTENTION_TOKENS),
        "head_dim": pick(u[5], *HEAD_DIMS),
        "groups": power_of_two(u[6], 1, 64) if beyond(u[6]) < 0.5 else 1,
    }


def _attention_product_call(p: dict[str, Any]) -> Call:
    b, g, h, n, d = p["batch"], p["groups"], p["heads"], p["tokens"], p["head_dim"]
    lead = (b, g, h) if p["type"] == "einsum" else (b * g, h)
    if p["fused"]:  # q, k, v: views of one (..., tokens, 3, heads, head) projection
        qkv = _t(*lead[:-1], n, 3, h, d).movedim(-3, 0).movedim(-2, -3)
        q, k, v = qkv[0], qkv[1], qkv[2]
    else:
        q, k, v = _t(*lead, n, d), _t(*lead, n, d), _t(*lead, n, d)
    scores = p["product"] == "scores"
    a, b_ = (q, k) if scores else (_t(*lead, n, n), v)
    if p["type"] == "einsum":
        eq = "bghid,bghjd->bghij" if scores else "bghij,bghjd->bghid"
        return _f(torch.einsum, eq, a, b_)
    return _f(torch.matmul, a, b_.transpose(-2, -1) if scores else b_)


def _matmul_call(p: dict[str, Any]) -> Call:
    if "product" in p:
        return _attention_product_call(p)
    lead = (p["batch"], p["heads"]) if p["heads"] and p["type"] != "bmm" else (p["batch"],)
    a, b = _t(*lead, p["m"], p["k"]), _t(*lead, p["k"], p["n"])
    # ``a @ b`` in a network is recorded as the torch function it dispatches to,
    # torch.Tensor.matmul (extraction never sees torch.Tensor.__matmul__).
    fn = {"matmul": torch.matmul, "bmm": torch.bmm, "operator": torch.Tensor.matmul}
    return _f(fn[p["type"]], a, b)


def _attention(u: Sequence[float], generator: int = 1) -> dict[str, Any]:
    """Attention: ``nn.MultiheadAttention`` (self-attention) or
    ``scaled_dot_product_attention``, 1-16 heads and 16-1,024 tokens log-uniform; from
    generator 20 on, :func:`_transformer_attention`."""
    if generator >= 20:
        return _transformer_attention(u)
    head_dim = pick(u[2], [32, 64, 128], [0.3, 0.5, 0.2])
    return {
        "type": pick(u[0], ["mha", "sdpa"], [0.6, 0.4]),
        "batch": log_int(u[1], 1, 256),
        "heads": log_int(u[3], 1, 16),
        "head_dim": head_dim,
        "tokens": log_int(u[4], 16, 1024),
    }


def _transformer_attention(u: Sequence[float]) -> dict[str, Any]:
    """A transformer block's attention: ``nn.MultiheadAttention`` seven times in ten (a
    self-attention as ViT calls it, which PyTorch runs fused in inference for an even
    number of heads), else ``scaled_dot_product_attention``; heads of :data:`HEAD_DIMS`,
    :data:`TRANSFORMER_HEADS` of them, an attention block's :data:`ATTENTION_TOKENS`
    (ViT's 50 and 197, windows of 49 and 64, maps of 196-1,024), a power-of-two batch
    (1-256). The other versions draw heads and tokens log-uniformly and the batch at any
    size: held out of the op models of rounds 1-47, attention was within a median 7-10 %,
    but vit_b_32's (12 heads of 64, 50 tokens, batch 64) ran about half
    the time its models predict (docs/op-space.md, round 48)."""
    return {
        "type": pick(u[0], ["mha", "sdpa"], [0.7, 0.3]),
        "batch": power_of_two(u[1], 1, 256),
        "heads": pick(u[3], *TRANSFORMER_HEADS),
        "head_dim": pick(u[2], *HEAD_DIMS),
        "tokens": pick(u[4], *ATTENTION_TOKENS),
    }


def _attention_call(p: dict[str, Any]) -> Call:
    b, h, d, n = p["batch"], p["heads"], p["head_dim"], p["tokens"]
    if p["type"] == "mha":
        mha = torch.nn.MultiheadAttention(h * d, h, batch_first=True, device="meta")
        x = _t(b, n, h * d)
        return _m(mha, x, x, x, need_weights=False)
    q, k, v = _t(b, h, n, d), _t(b, h, n, d), _t(b, h, n, d)
    return _f(torch.nn.functional.scaled_dot_product_attention, q, k, v)


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
