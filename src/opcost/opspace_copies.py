"""The op space's copies (family ``copy``): how a point of the unit cube becomes one copy, and
its call on the ``meta`` device, as networks make it (docs/op-space.md, "What is
sampled"): a ``contiguous()`` of a permuted or shuffled tensor (generators 1-20), a
shifted-window block's copies (21), a table gathered by indices (22), a view of part of a
tensor, whose backward pass writes the whole tensor's gradient (23), and a write into part
of a tensor, ``x[index] = value`` (24)."""

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
    nchw,
    pick,
    power_of_two,
    round_to,
    tensor_shape,
    width,
)
from opcost.opspace_draw import function_call as _f
from opcost.opspace_draw import meta_tensor as _t
from opcost.opspace_stages import HALVINGS, PATCH_HALVINGS, block_width, stage_map


def _copy(u: Sequence[float], generator: int = 1) -> dict[str, Any]:
    """``contiguous()`` of shufflenet's channel shuffle or of an NCHW-to-NHWC permute, on a
    tensor of :func:`~opcost.opspace_draw.tensor_shape`; from generator 21 on,
    :func:`_window_copy`; from generator 22 on, :func:`_gather`; from generator 23 on,
    :func:`_part_view`; from generator 24 on, :func:`_set_part`."""
    if generator >= 24:
        return _set_part(u)
    if generator >= 23:
        return _part_view(u)
    if generator >= 22:
        return _gather(u)
    if generator >= 21:
        return _window_copy(u)
    p = tensor_shape(u)
    p["layout"] = "nchw"
    p["view"] = pick(u[5], ["shuffle", "permute"])
    return p


#: Generator 21's copies of a shifted-window block, and how often each.
WINDOW_COPIES = (("pad", "roll", "partition", "merge", "heads"), (0.2, 0.25, 0.2, 0.2, 0.15))


def _window_copy(u: Sequence[float]) -> dict[str, Any]:
    """A copy a shifted-window block (Swin's) makes of a stage's channels-last map
    ``(batch, map, map, width)``: ``F.pad`` to a multiple of the window, ``torch.roll``
    by half a window over the map's two dimensions, the ``reshape`` that gathers its
    windows ``(batch x windows, window², width)`` and the one that merges them back, or the
    ``reshape`` that joins the heads of ``(batch x windows, heads, window², width /
    heads)`` transposed (:data:`WINDOW_COPIES`); a stage's map of 4x4 patches
    (:data:`opcost.opspace_stages.PATCH_HALVINGS`), a window of 7 or 8, a width of
    :func:`opcost.opspace_stages.block_width` (32-2048), a power-of-two batch (1-256)."""
    window = pick(u[4], [7, 8], [0.6, 0.4])
    side = max(stage_map(u[3], PATCH_HALVINGS), 1)
    kind = pick(u[1], *WINDOW_COPIES)
    if kind in ("partition", "merge") and side <= window:  # one window: a view, no copy
        side = 2 * window
    return {
        "type": kind,
        "batch": power_of_two(u[0], 1, 256),
        "spatial": side,
        "channels": max(block_width(u[2]), 32),
        "window": min(window, side),
        "shift": 1 if beyond(u[4]) < 0.5 else -1,
        "heads": pick(u[5], *TRANSFORMER_HEADS),
    }


#: Generator 22's windows of a relative position table: ``(2w - 1)²`` rows gathered by
#: ``w⁴`` indices (Swin's 7 and 8, MaxViT's 7; 16 for larger windows), and how often each.
GATHER_WINDOWS = ((7, 8, 12, 16), (0.4, 0.3, 0.15, 0.15))


def _gather(u: Sequence[float]) -> dict[str, Any]:
    """A table gathered by a tensor of indices, ``table[index]``: a relative position
    bias table of a window of :data:`GATHER_WINDOWS` (``(2w - 1)²`` rows, ``w⁴`` indices)
    with one column per head (:data:`TRANSFORMER_HEADS`) seven times in ten (Swin's and
    MaxViT's; a parameter, or half the time a computed table, Swin V2's), else rows and
    indices of 16-65,536 and columns of 1-1,024 (an embedding's); the indices are drawn
    over the table's rows when measured (:func:`opcost.spec.random_inputs`)."""
    w = pick(u[0], *GATHER_WINDOWS)
    bias = u[1] < 0.7
    return {
        "type": "gather",
        "rows": (2 * w - 1) ** 2 if bias else log_int(u[2], 16, 65536),
        "indices": w**4 if bias else log_int(u[3], 16, 65536),
        "columns": pick(u[4], *TRANSFORMER_HEADS) if bias else width(u[4], 1, 1024),
        "param": beyond(u[1]) < 0.5 or not bias,
    }


def _gather_call(p: dict[str, Any]) -> Call:
    table = _t(p["rows"], p["columns"])
    if p["param"]:
        table = torch.nn.Parameter(table)
    index = torch.empty(p["indices"], dtype=torch.long, device="meta")
    return _f(torch.Tensor.__getitem__, table, index)


def _window_copy_call(p: dict[str, Any]) -> Call:
    b, side, c, ws, kind = p["batch"], p["spatial"], p["channels"], p["window"], p["type"]
    padded = -(-side // ws) * ws
    if kind == "pad":
        pad = padded - side
        x = _t(b, side, side, c)
        return _f(torch.nn.functional.pad, x, (0, 0, 0, pad, 0, pad), mode="constant", value=None)
    if kind == "roll":
        s = p["shift"] * (ws // 2)
        return _f(torch.roll, _t(b, side, side, c), shifts=(s, s), dims=(1, 2))
    n = padded // ws
    if kind == "partition":
        x = _t(b, n, ws, n, ws, c).permute(0, 1, 3, 2, 4, 5)
        return _f(torch.Tensor.reshape, x, b * n * n, ws * ws, c)
    if kind == "merge":
        x = _t(b, n, n, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
        return _f(torch.Tensor.reshape, x, b, padded, padded, c)
    h = max(min(p["heads"], c // 8), 1)
    x = _t(b * n * n, h, ws * ws, c // h).transpose(1, 2)
    return _f(torch.Tensor.reshape, x, b * n * n, ws * ws, c // h * h)


def _copy_call(p: dict[str, Any]) -> Call:
    if p.get("type") in SET_PARTS[0]:
        return _set_part_call(p)
    if p.get("type") in PART_VIEWS[0]:
        return _part_view_call(p)
    if p.get("type") == "gather":
        return _gather_call(p)
    if p.get("type") in WINDOW_COPIES[0]:
        return _window_copy_call(p)
    n, c, h, w = nchw(p)
    if p["view"] == "shuffle":  # shufflenet's channel shuffle: the transposed groups
        c = round_to(c, 2)
        x = _t(n, 2, c // 2, h, w).transpose(1, 2)
    else:  # NCHW to channels-last order, as convnext's Permute leaves it
        x = _t(n, c, h, w).permute(0, 2, 3, 1)
    return _f(torch.Tensor.contiguous, x)


#: Generator 23's views of part of a tensor, and how often each: ``qkv[i]`` of Swin's
#: window attention, ViT's class token ``x[:, 0]``, Swin's patch merging
#: ``x[..., 0::2, 1::2, :]``, the crop of Swin V2's windows padded to 8 ``x[:, :H, :W, :]``,
#: and ``chunk`` (ShuffleNet V2's halves, MaxViT's q, k, v).
PART_VIEWS = (("select", "token", "strided", "crop", "chunk"), (0.3, 0.1, 0.2, 0.15, 0.25))
#: The maps Swin V2's windows of 8 pad (to 8, 16 and 32) and crop again.
CROPPED_MAPS = (7, 14, 28)


def _part_view(u: Sequence[float]) -> dict[str, Any]:
    """A view of part of a tensor (:data:`PART_VIEWS`), as transformers and ShuffleNet take
    one: no kernel in the forward pass, but in training a backward pass that writes the
    whole tensor's gradient, zeros where the part was not taken
    (:func:`opcost.model.roofline.op_work`). A stage's map of 4x4 patches
    (:data:`opcost.opspace_stages.PATCH_HALVINGS`) or a ShuffleNet stage's
    (:func:`opcost.opspace_stages.stage_map`), windows of 7 or 8, a width of
    :func:`opcost.opspace_stages.block_width` (32-2048; heads of :data:`HEAD_DIMS`), a
    power-of-two batch (1-256)."""
    kind = pick(u[1], *PART_VIEWS)
    heads = pick(u[5], *TRANSFORMER_HEADS)
    return {
        "type": kind,
        "batch": power_of_two(u[0], 1, 256),
        "channels": max(block_width(u[2]), 32),
        "index": pick(beyond(u[2]), [0, 1, 2]),
        "spatial": (
            pick(u[3], CROPPED_MAPS)
            if kind == "crop"
            else max(stage_map(u[3], HALVINGS if beyond(u[1]) < 0.5 else PATCH_HALVINGS), 1)
        ),
        "tokens": pick(u[3], *ATTENTION_TOKENS),
        "window": 8 if kind == "crop" else pick(u[4], [7, 8], [0.6, 0.4]),
        "heads": heads,
        "head_dim": pick(beyond(u[5]), *HEAD_DIMS),
        "shuffle": beyond(u[1]) < 0.5,
    }


def _part_view_call(p: dict[str, Any]) -> Call:
    b, side, c, ws, kind = p["batch"], p["spatial"], p["channels"], p["window"], p["type"]
    windows = (-(-side // ws)) ** 2
    if kind == "select":  # Swin: the linear layer's q, k, v reshaped and permuted
        h, d = p["heads"], p["head_dim"]
        qkv = _t(b * windows, ws * ws, 3, h, d).permute(2, 0, 3, 1, 4)
        return _f(torch.Tensor.__getitem__, qkv, p["index"])
    if kind == "token":  # ViT: the class token
        return _f(torch.Tensor.__getitem__, _t(b, p["tokens"], c), (slice(None), 0))
    if kind == "strided":  # Swin: patch merging's four quarters, each a strided view
        side += side % 2
        i, j = p["index"] % 2, p["index"] // 2 % 2
        x = _t(b, side, side, c)
        return _f(
            torch.Tensor.__getitem__, x, (..., slice(i, None, 2), slice(j, None, 2), slice(None))
        )
    if kind == "crop":  # Swin V2: the map padded to whole windows, cropped back
        padded = -(-side // ws) * ws
        x = _t(b, padded, padded, c)
        return _f(
            torch.Tensor.__getitem__,
            x,
            (slice(None), slice(None, side), slice(None, side), slice(None)),
        )
    if p["shuffle"]:  # ShuffleNet V2: a block's input halved by its channels
        x = _t(b, round_to(c, 2), side, side)
        return _f(torch.Tensor.chunk, x, 2, dim=1)
    return _f(torch.chunk, _t(b, windows, ws * ws, 3 * c), 3, dim=-1)  # MaxViT: q, k, v


#: Generator 24's writes into part of a tensor, ``x[index] = value``, and how often each:
#: the bands of a shifted-window attention mask (Swin's nine ``mask[h0:h1, w0:w1] =
#: count``), tokens of a sequence written into a buffer (``x[:, 1:] = patches``, a class
#: token ``x[:, 0] = token``), channels of a map written into a preallocated block
#: (``x[:, c0:c1] = features``) and a border of a map filled with a scalar.
SET_PARTS = (("mask", "tokens", "channels", "fill"), (0.35, 0.2, 0.25, 0.2))
#: The bands a shifted-window mask is cut into along each side: ``(start, stop)`` in
#: windows ``w`` and shifts ``s`` from the end, Swin's ``(0, -w), (-w, -s), (-s, None)``.
MASK_BANDS = ("head", "window", "shift")


def _set_part(u: Sequence[float]) -> dict[str, Any]:
    """A write into part of a tensor (:data:`SET_PARTS`), one kernel that writes the part
    and reads the value, and in training, for a tensor value, a backward pass that takes
    the part's gradient (:func:`opcost.model.roofline.op_work`): a mask of a stage's map
    of 4x4 patches (:data:`opcost.opspace_stages.PATCH_HALVINGS`) padded to windows of 7 or
    8, shifted by half a window; a sequence of :data:`ATTENTION_TOKENS` tokens; a map of a
    network's stage (:func:`opcost.opspace_stages.stage_map`); widths of
    :func:`opcost.opspace_stages.block_width` (32-2048); a power-of-two batch (1-256)."""
    kind = pick(u[1], *SET_PARTS)
    window = pick(u[4], [7, 8], [0.6, 0.4])
    return {
        "type": kind,
        "batch": power_of_two(u[0], 1, 256),
        "channels": max(block_width(u[2]), 32),
        "spatial": max(stage_map(u[3], PATCH_HALVINGS if kind == "mask" else HALVINGS), 1),
        "tokens": pick(u[3], *ATTENTION_TOKENS),
        "window": window,
        "bands": (pick(u[5], MASK_BANDS), pick(beyond(u[5]), MASK_BANDS)),
        "share": pick(beyond(u[2]), [1, 2, 4]),  # the part: a half, a quarter, ... or one
        "scalar": beyond(u[1]) < 0.5,
    }


def _band(band: str, window: int, shift: int) -> slice:
    return {
        "head": slice(0, -window),
        "window": slice(-window, -shift),
        "shift": slice(-shift, None),
    }[band]


def _set_part_call(p: dict[str, Any]) -> Call:
    b, side, c, kind = p["batch"], p["spatial"], p["channels"], p["type"]
    if kind == "mask":  # Swin: the attention mask of a shifted window, band by band
        ws = p["window"]
        padded = max(-(-side // ws) * ws, 2 * ws)
        index = tuple(_band(band, ws, ws // 2) for band in p["bands"])
        return _f(
            torch.Tensor.__setitem__, _t(padded, padded), index, MASK_BANDS.index(p["bands"][0])
        )
    if kind == "tokens":  # a sequence's tokens after the class token, or the class token
        tokens = p["tokens"]
        x = _t(b, tokens, c)
        if p["share"] == 1:
            return _f(torch.Tensor.__setitem__, x, (slice(None), 0), _t(b, c))
        return _f(torch.Tensor.__setitem__, x, (slice(None), slice(1, None)), _t(b, tokens - 1, c))
    if kind == "channels":  # a block's features written into its preallocated output
        part = max(c // (2 * p["share"]), 1)
        x = _t(b, c, side, side)
        value = 0.0 if p["scalar"] else _t(b, part, side, side)
        return _f(torch.Tensor.__setitem__, x, (slice(None), slice(c - part, c)), value)
    border = max(side // (4 * p["share"]), 1)  # a border of the map zeroed
    x = _t(b, c, side, side)
    return _f(torch.Tensor.__setitem__, x, (..., slice(side - border, None), slice(None)), 0.0)
