"""Linear layers, matrix products and attention of the op space: the families whose work
is a matrix product, each version of their map from a point of the unit cube to a
configuration, and its call on the ``meta`` device (docs/op-space.md, "What is sampled";
:data:`opcost.opspace_ops.FAMILY_MAKERS` names them with the other families)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from opcost.opspace_draw import (
    ATTENTION_TOKENS,
    HEAD_DIMS,
    TRANSFORMER_HEADS,
    Call,
    beyond,
    log_int,
    pick,
    power_of_two,
    round_to,
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
