"""Convolutions of the op space: the versions of the map from a point to a convolution.

Every version (``op_space.generator``, :data:`opcost.opspace.GENERATORS`) a round was
measured with stays unchanged, so that a round's samples stay those measured:
:func:`params` maps a point of the 11-dimensional unit cube to a convolution's
parameters, :func:`call` makes it a ``torch.nn.Conv2d`` call on the ``meta`` device. The
versions that draw only grouped or depthwise convolutions are in
:mod:`opcost.opspace_grouped`; the maps and widths networks build, which the later
versions draw, in :mod:`opcost.opspace_stages`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from opcost.opspace_draw import (
    Call,
    beyond,
    bias_and_layout,
    kernel_within_map,
    log_int,
    meta_tensor,
    module_call,
    pick,
    power_of_two,
    round_to,
    width,
)
from opcost.opspace_grouped import (
    depthwise_on_stage,
    few_groups,
    grouped,
    grouped_by_count,
    narrow_groups,
)
from opcost.opspace_stages import INPUT_SIZES, aligned_width, block_width, stage_map


def params(u: Sequence[float], generator: int = 1) -> dict[str, Any]:
    """A convolution. Generator 1: maps 7-224, a grouped convolution's output width drawn apart
    from its input's. Generator 2 (:data:`opcost.opspace.GENERATORS`): maps 1-224 (the 1x1
    maps of squeeze-and-excitation blocks, the few-pixel maps of a small input's last
    stage), a kernel no wider than its map, and a grouped convolution that keeps its width
    per group as a depthwise one does (ResNeXt, RegNet: ``cout`` = ``cin`` or twice).
    Generator 3: as 2, with grouped convolutions 40 % of the samples instead of 15 % and
    widths per group of 24 and 48 too (RegNet's), dense ones 40 % and depthwise 20 %.
    Generator 4 (:func:`_dense_3x3`): dense 3x3 stride-1 convolutions only, on maps of 7-64;
    generator 5: the same with widths and batches powers of two. Generator 6
    (:func:`_dense_aligned`): dense convolutions of every kernel and stride with aligned
    widths and batches powers of two. Generator 7 (:func:`_dense_heavy`): the same at batch
    16-256 on maps of 7-112, bounded by :data:`opcost.opspace.HEAVY_BOUNDS`. Generator 8
    (:func:`opcost.opspace_grouped.grouped`): grouped and depthwise convolutions only.
    Generator 9 (:func:`_staged`): generator 6's dense convolutions (six in ten) and
    generator 8's grouped and depthwise ones, on the maps of a network's stages.
    Generator 10 (:func:`~opcost.opspace_grouped.grouped_by_count`): grouped convolutions
    drawn by their number of groups. Generator 11
    (:func:`~opcost.opspace_grouped.narrow_groups`): grouped convolutions of 4-16 channels
    a group. Generator 12 (:func:`_same_width_3x3`): a network stage's same-width 3x3
    convolution; versions 13 and 14 changed other families and keep it. Generator 15
    (:func:`~opcost.opspace_grouped.few_groups`): grouped convolutions of 2-8 groups.
    Generator 16 (:func:`_pointwise`): the 1x1 convolutions of a network's blocks; version
    17 changed matrix products and keeps it. Generator 18 (:func:`_stem`): a network's
    first layer, a patch embedding or an overlapping stem on an RGB image; versions 19-24
    changed other families and keep it. Generator 25
    (:func:`~opcost.opspace_grouped.depthwise_on_stage`): depthwise convolutions on a
    network's stages."""
    if generator >= min(_VERSIONS):  # the latest version at or before ``generator``
        return _VERSIONS[max(v for v in _VERSIONS if v <= generator)](u)
    # One in ten is a network's first layer, on RGB images.
    cin = 3 if u[1] < 0.1 else width((u[1] - 0.1) / 0.9, 8, 2048)
    cout = width(u[2], 8, 2048)
    kinds = [0.6, 0.25, 0.15] if generator < 3 else [0.4, 0.2, 0.4]
    kind = pick(u[6], ["dense", "depthwise", "grouped"], kinds)
    groups = 1
    if kind == "depthwise":
        cin = max(cin, 8)
        groups, cout = cin, cin * pick(u[10], [1, 1, 1, 2])
    elif kind == "grouped":
        widths = [4, 8, 16, 32, 64] if generator < 3 else [4, 8, 16, 24, 32, 48, 64]
        per_group = pick(u[10], widths)
        cin = round_to(max(cin, 2 * per_group), per_group)
        groups = cin // per_group
        if generator >= 2:
            cout = cin * pick(beyond(u[10]), [1, 1, 1, 2])
        else:
            cout = round_to(cout, groups)
    p = {
        "batch": log_int(u[0], 1, 256),
        "cin": cin,
        "cout": cout,
        "kernel": pick(u[3], [1, 3, 5, 7], [0.35, 0.4, 0.1, 0.15]),
        "stride": pick(u[4], [1, 2], [0.75, 0.25]),
        "dilation": pick(u[5], [1, 2], [0.9, 0.1]),
        "groups": groups,
        "spatial": log_int(u[7], 7 if generator < 2 else 1, 224),
        **bias_and_layout(u),
    }
    if generator >= 2:
        kernel_within_map(p)
    return p


#: Maps of generators 4 and 5's convolutions, drawn uniformly (not log-uniformly): which
#: algorithm cuDNN runs a dense 3x3 convolution with, TF32 off, changes from one map to
#: the next (experiments/conv_maps.py).
DENSE_3X3_MAPS = (7, 64)


def _dense_3x3(u: Sequence[float], *, powers_of_two: bool = False) -> dict[str, Any]:
    """A dense 3x3 stride-1 convolution (padding 1) of 64-1024 channels on a map of
    :data:`DENSE_3X3_MAPS`, drawn uniformly over its integers; as many output channels
    as input (half the samples), twice as many (a fifth) or a width drawn apart; with
    ``powers_of_two``, widths and batch (1-256) powers of two, as networks' are.
    With TF32 off, cuDNN's heuristics run some of these with fewer multiplications than
    the direct count (Winograd-like algorithms) and others directly, depending on the
    map, the widths and the batch; log-uniform maps of 1-224 put too few samples where
    convolutional networks' middle stages run for the models to learn which."""
    draw = power_of_two if powers_of_two else width
    cin = draw(u[1], 64, 1024)
    out = pick(u[10], ["same", "double", "apart"], [0.5, 0.2, 0.3])
    cout = {"same": cin, "double": 2 * cin, "apart": draw(u[2], 64, 1024)}[out]
    lo, hi = DENSE_3X3_MAPS
    return {
        "batch": power_of_two(u[0], 1, 256) if powers_of_two else log_int(u[0], 1, 256),
        "cin": cin,
        "cout": cout,
        "kernel": 3,
        "stride": 1,
        "dilation": 1,
        "groups": 1,
        "spatial": min(hi, lo + int(u[7] * (hi - lo + 1))),
        **bias_and_layout(u),
    }


def _aligned_widths(u: Sequence[float], shares: Sequence[float]) -> tuple[int, int]:
    """``(cin, cout)`` of generators 6 and 7: one in ten on RGB images, else an aligned
    width; as many output channels as input, twice as many or a width drawn apart, in
    ``shares``."""
    cin = 3 if u[1] < 0.1 else aligned_width((u[1] - 0.1) / 0.9)
    out = pick(u[10], ["same", "double", "apart"], shares)
    cout = {"same": max(cin, 16), "double": max(2 * cin, 16), "apart": aligned_width(u[2])}[out]
    return cin, min(cout, 2048)


def _dense_aligned(u: Sequence[float]) -> dict[str, Any]:
    """A dense convolution as networks build them: widths of 16-2048 channels, each a
    multiple of 32 or 64 (two in three) or a power of two, and as many output channels
    as input (a third), twice as many (a sixth) or a width drawn apart; one in ten on RGB
    images; kernel 1, 3, 5 or 7 (no wider than the map), stride 1 or 2, maps of 1-224
    (log-uniform), batch a power of two (1-256). On such widths cuDNN runs its aligned
    tensor-core and vectorised kernels, which the models trained on generators 1-3
    predicted 5-20 % too slow (the held-out dense convolutions whose widths are
    multiples of 32, median signed error by kernel; docs/op-space.md, round 9)."""
    cin, cout = _aligned_widths(u, [2 / 6, 1 / 6, 3 / 6])
    p = {
        "batch": power_of_two(u[0], 1, 256),
        "cin": cin,
        "cout": cout,
        "kernel": pick(u[3], [1, 3, 5, 7], [0.4, 0.4, 0.05, 0.15]),
        "stride": pick(u[4], [1, 2], [0.7, 0.3]),
        "dilation": 1,
        "groups": 1,
        "spatial": log_int(u[7], 1, 224),
        **bias_and_layout(u),
    }
    kernel_within_map(p)
    return p


def _dense_heavy(u: Sequence[float]) -> dict[str, Any]:
    """A dense convolution of a network at a large batch, where the GPU sets the pace:
    widths as generator 6's, batch a power of two of 16-256, maps of 7-112
    (log-uniform; an RGB input's 224), kernel 1, 3, 5 or 7, stride 1 or 2, bounded by
    :data:`opcost.opspace.HEAVY_BOUNDS` instead of the default bounds. The space-filling
    generators put few samples there (the batch, the map and the widths all large at once) and halve
    the batch of the heaviest: held out of the models of rounds 1-11, the aligned dense
    convolutions of 10 GFLOP or more at batch 16-256 were predicted a median 8-11 % too
    slow (H100, TF32 on, 5-fold by op id; docs/op-space.md, round 12)."""
    cin, cout = _aligned_widths(u, [0.4, 0.2, 0.4])
    return {
        "batch": power_of_two(u[0], 16, 256),
        "cin": cin,
        "cout": cout,
        "kernel": pick(u[3], [1, 3, 5, 7], [0.35, 0.45, 0.05, 0.15]),
        "stride": pick(u[4], [1, 2], [0.75, 0.25]),
        "dilation": 1,
        "groups": 1,
        "spatial": 224 if cin == 3 else log_int(u[7], 7, 112),
        **bias_and_layout(u),
    }


def call(p: dict[str, Any]) -> Call:
    """The ``torch.nn.Conv2d`` call of parameters ``p``, padded to keep its map (stride 1)
    as networks pad unless ``p`` names its ``padding``, on a ``meta`` input."""
    k, d = p["kernel"], p["dilation"]
    conv = torch.nn.Conv2d(
        p["cin"], p["cout"], k, stride=p["stride"], padding=p.get("padding", (k // 2) * d),
        dilation=d,
        groups=p["groups"], bias=p["bias"], device="meta",
    )  # fmt: skip
    x = meta_tensor(
        p["batch"], p["cin"], p["spatial"], p["spatial"], channels_last=p["channels_last"]
    )
    return module_call(conv, x)


def _staged(u: Sequence[float]) -> dict[str, Any]:
    """A convolution on the map of a network's stage (:func:`stage_map`): generator 6's
    dense convolution (six in ten, by coordinate 5) or generator 8's grouped or
    depthwise one, its map an input size halved per stage instead of any of 1-224.
    Networks halve a round input size stage by stage, and cuDNN's kernels tile such maps
    evenly: held out of the models of rounds 1-21 (H100, TF32 on), the dense
    convolutions on maps of 7, 14, 28, 56, 112 or 224 were predicted a median 8.3 % too
    slow against 2.4 % for the others (50 and 800 held-out dense convolutions;
    docs/op-space.md, round 22)."""
    p = _dense_aligned(u) if u[5] < 0.6 else grouped(u)
    p["spatial"] = stage_map(u[7])
    p["kernel"] = pick(u[3], [1, 3, 5, 7], [0.4, 0.45, 0.05, 0.1])
    p["dilation"] = 1
    kernel_within_map(p)
    return p


def _same_width_3x3(u: Sequence[float]) -> dict[str, Any]:
    """The 3x3 convolution of a network's stage, as ResNet's and VGG's blocks build it: a
    power of two of 32-2048 channels, as many out as in at stride 1 (four in five) or
    twice as many at stride 2 (a stage's first block), padding 1, on the map of a
    network's stage (:func:`stage_map`), batch a power of two (1-256), within the
    default bounds. The most common convolution of convolutional networks is rare in the
    other versions, which draw the widths, kernel, stride and map apart: 48 of the
    12,570 convolutions of rounds 1-27 are same-width 3x3 stride-1 ones on maps of 224
    halved (docs/op-space.md, round 28)."""
    cin = power_of_two(u[1], 32, 2048)
    down = u[4] < 0.2 and cin < 2048
    p = {
        "batch": power_of_two(u[0], 1, 256),
        "cin": cin,
        "cout": 2 * cin if down else cin,
        "kernel": 3,
        "stride": 2 if down else 1,
        "dilation": 1,
        "groups": 1,
        "spatial": stage_map(u[7]),
        **bias_and_layout(u),
    }
    kernel_within_map(p)
    return p


#: Generator 16's output width over input width, and how often each: a block's 1x1
#: convolution keeps its width, expands it (a bottleneck's 4, an inverted residual's 6) or
#: reduces it by as much.
POINTWISE_RATIOS = ((1, 2, 4, 6, 1 / 2, 1 / 4, 1 / 6), (0.2, 0.1, 0.15, 0.1, 0.1, 0.2, 0.15))


def _pointwise(u: Sequence[float]) -> dict[str, Any]:
    """The 1x1 convolution of a network's block: a width of :func:`block_width`, the
    output width that times :data:`POINTWISE_RATIOS` (rounded to 8 channels, 8-2048),
    stride 1 (a downsampling shortcut's 2 in ten), on the map of a network's stage
    (:func:`stage_map`), batch a power of two (1-256). Bottlenecks and inverted residuals
    are mostly such convolutions, and the other versions draw the kernel, the widths
    and the map apart: of the convolutions of rounds 1-39, 7 on the H200 are dense 1x1
    ones of widths that are multiples of 64 on maps of 14, 28 or 56 at batch 8 or more,
    and the ten networks' and the blind six's (ResNet's, ResNeXt's, DenseNet's,
    MobileNet's) were predicted 1.11 (H100) and 1.16 (H200) times their traced GPU time in
    sum with TF32 on (docs/op-space.md, round 40)."""
    cin = block_width(u[1])
    ratio = pick(u[10], *POINTWISE_RATIOS)
    return {
        "batch": power_of_two(u[0], 1, 256),
        "cin": cin,
        "cout": min(max(round_to(round(cin * ratio), 8), 8), 2048),
        "kernel": 1,
        "stride": pick(u[4], [1, 2], [0.8, 0.2]),
        "dilation": 1,
        "groups": 1,
        "spatial": stage_map(u[7]),
        **bias_and_layout(u),
    }


#: Generator 18's patch sizes (kernel and stride) of a patch embedding, and how often each:
#: ConvNeXt's and Swin's 4, ViT's 16 and 32, and the sizes between.
PATCH_SIZES = ((2, 4, 7, 8, 14, 16, 32), (0.1, 0.25, 0.05, 0.15, 0.1, 0.2, 0.15))
#: Generator 18's kernels and strides of an overlapping stem, drawn apart: ResNet's 7x7 and
#: MobileNet's 3x3 at stride 2, VGG's 3x3 at stride 1, AlexNet's 11x11 at stride 4.
STEM_KERNELS = ((3, 5, 7, 11), (0.45, 0.1, 0.35, 0.1))
STEM_STRIDES = ((1, 2, 4), (0.2, 0.65, 0.15))


def _stem(u: Sequence[float]) -> dict[str, Any]:
    """A network's first layer, on an RGB image of one of :data:`INPUT_SIZES`: half of them
    a patch embedding (kernel and stride one of :data:`PATCH_SIZES`, no padding), half an
    overlapping stem (a kernel of :data:`STEM_KERNELS` padded by half of it, a stride of
    :data:`STEM_STRIDES`); a width of :func:`block_width`, batch a power of two (1-256).
    The other versions draw 3 input channels on stage maps at most, a kernel of 7 at
    most and no patch embedding: of rounds 1-43's convolutions none has a kernel wider
    than 7, and a ViT's 32x32 patch embedding ran 3-5 times longer than the op models
    predicted (docs/op-space.md, round 44)."""
    patch = u[3] < 0.5
    kernel = pick(u[5], *PATCH_SIZES) if patch else pick(u[5], *STEM_KERNELS)
    return {
        "batch": power_of_two(u[0], 1, 256),
        "cin": 3,
        "cout": block_width(u[2]),
        "kernel": kernel,
        "stride": kernel if patch else pick(u[4], *STEM_STRIDES),
        "padding": 0 if patch else kernel // 2,
        "dilation": 1,
        "groups": 1,
        "spatial": pick(u[7], *INPUT_SIZES),
        **bias_and_layout(u),
    }


#: The map of each convolution-only version from 4 on (:func:`params`); a later version that
#: changed other families maps convolutions as the newest here.
_VERSIONS: dict[int, Callable[[Sequence[float]], dict[str, Any]]] = {
    4: _dense_3x3,
    5: partial(_dense_3x3, powers_of_two=True),
    6: _dense_aligned,
    7: _dense_heavy,
    8: grouped,
    9: _staged,
    10: grouped_by_count,
    11: narrow_groups,
    12: _same_width_3x3,
    15: few_groups,
    16: _pointwise,
    18: _stem,
    25: depthwise_on_stage,
}
