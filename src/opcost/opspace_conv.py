"""Convolutions of the op space: the versions of the map from a point to a convolution.

Every version (``op_space.generator``, :data:`opcost.opspace.GENERATORS`) a round was
measured with stays here unchanged, so that a round's samples stay those measured:
:func:`params` maps a point of the 11-dimensional unit cube to a convolution's
parameters, :func:`call` makes it a ``torch.nn.Conv2d`` call on the ``meta`` device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from opcost.opspace_draw import (
    Call,
    beyond,
    log_int,
    meta_tensor,
    module_call,
    pick,
    power_of_two,
    round_to,
    width,
)


def _bias_and_layout(u: Sequence[float]) -> dict[str, bool]:
    """A convolution's bias (three in ten) and channels-last input (one in four), from
    coordinates 8 and 9 of its point, as every generator draws them."""
    return {"bias": u[8] < 0.3, "channels_last": u[9] < 0.25}


def _kernel_within_map(p: dict[str, Any]) -> None:
    """A kernel (dilated) wider than its map becomes 3x3, or 1x1 on maps under 3, in
    place: padding would be most of it."""
    if p["spatial"] < p["kernel"] * p["dilation"]:
        p["kernel"], p["dilation"] = (3 if p["spatial"] >= 3 else 1), 1


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
    (:func:`_grouped`): grouped and depthwise convolutions only. Generator 9
    (:func:`_staged`): generator 6's dense convolutions (six in ten) and generator 8's
    grouped and depthwise ones, on the maps of a network's stages. Generator 10
    (:func:`_grouped_by_count`): grouped convolutions drawn by their number of groups.
    Generator 11 (:func:`_narrow_groups`): grouped convolutions of 4-16 channels a group.
    Generator 12 (:func:`_same_width_3x3`): a network stage's same-width 3x3 convolution;
    versions 13 and 14 changed other families and keep it. Generator 15
    (:func:`_few_groups`): grouped convolutions of 2-8 groups. Generator 16
    (:func:`_pointwise`): the 1x1 convolutions of a network's blocks; version 17 changed
    matrix products and keeps it. Generator 18 (:func:`_stem`): a network's first layer, a
    patch embedding or an overlapping stem on an RGB image."""
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
        **_bias_and_layout(u),
    }
    if generator >= 2:
        _kernel_within_map(p)
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
        **_bias_and_layout(u),
    }


#: Grains of generator 6's widths: a multiple of 32 or 64, or a power of two (the rest).
ALIGNED_GRAINS = (32, 64)


def _aligned_width(v: float) -> int:
    """A width of 16-2048 channels at quantile ``v``: a multiple of 32 or 64 (two in
    three) or a power of two."""
    if beyond(v) < 2 / 3:
        grain = pick(beyond(beyond(v)), ALIGNED_GRAINS)
        return min(round_to(log_int(v, 16, 2048), grain), 2048)
    return power_of_two(v, 16, 2048)


def _aligned_widths(u: Sequence[float], shares: Sequence[float]) -> tuple[int, int]:
    """``(cin, cout)`` of generators 6 and 7: one in ten on RGB images, else an aligned
    width; as many output channels as input, twice as many or a width drawn apart, in
    ``shares``."""
    cin = 3 if u[1] < 0.1 else _aligned_width((u[1] - 0.1) / 0.9)
    out = pick(u[10], ["same", "double", "apart"], shares)
    cout = {"same": max(cin, 16), "double": max(2 * cin, 16), "apart": _aligned_width(u[2])}[out]
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
        **_bias_and_layout(u),
    }
    _kernel_within_map(p)
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
        **_bias_and_layout(u),
    }


#: Generator 8's channels per group of a grouped convolution (ResNeXt's 4-64, RegNet's
#: 8-128 group widths).
GROUP_WIDTHS = (4, 8, 16, 24, 32, 48, 64, 128)


def _grouped(u: Sequence[float]) -> dict[str, Any]:
    """A grouped (seven in ten) or depthwise convolution as networks build them: an
    aligned width of 16-2048 channels (rounded to the group width,
    :data:`GROUP_WIDTHS`), as many output channels (three in four) or twice as many (at
    most 2,048),
    kernel 1, 3, 5 or 7 (no wider than the map), stride 1 or 2, maps of 1-112
    (log-uniform), batch a power of two (1-256). cuDNN runs many of these with one kernel
    per group, some on several streams at once (docs/op-space.md, "How it is
    measured"): held out of the models of rounds 1-11, grouped convolutions missed by a
    median 33-43 % against 15-16 % for dense ones, and the committed rounds with grouped
    convolutions predate the busy time (``gpu_busy_time_s``) that tells the overlap."""
    cin = _aligned_width(u[1])
    if u[6] < 0.7:
        per_group = pick(u[10], GROUP_WIDTHS)
        cin = min(max(round_to(cin, per_group), 2 * per_group), 2048 // per_group * per_group)
        groups = cin // per_group
    else:
        groups = cin
    p = {
        "batch": power_of_two(u[0], 1, 256),
        "cin": cin,
        "cout": cin * (pick(u[2], [1, 2], [0.75, 0.25]) if 2 * cin <= 2048 else 1),
        "kernel": pick(u[3], [1, 3, 5, 7], [0.1, 0.6, 0.15, 0.15]),
        "stride": pick(u[4], [1, 2], [0.75, 0.25]),
        "dilation": 1,
        "groups": groups,
        "spatial": log_int(u[7], 1, 112),
        **_bias_and_layout(u),
    }
    _kernel_within_map(p)
    return p


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


#: Input sizes networks are run at, which generator 9 halves once per stage, and how
#: often each: 224 (ImageNet's) three times in ten.
INPUT_SIZES = (
    (128, 160, 192, 224, 256, 288, 320, 384, 512),
    (0.0875, 0.0875, 0.0875, 0.3, 0.0875, 0.0875, 0.0875, 0.0875, 0.0875),
)
#: How many times generator 9 halves the input size (its stem and stages: 2 to 32 for the
#: last stage of an ImageNet network), and how often each.
HALVINGS = ((0, 1, 2, 3, 4, 5), (0.05, 0.15, 0.2, 0.2, 0.2, 0.2))


#: How many times a patch-embedding network's stages have halved the input size: a stem of
#: 4x4 patches, then three merges (224: 56, 28, 14, 7), each as often.
PATCH_HALVINGS = ((2, 3, 4, 5), (0.25, 0.25, 0.25, 0.25))


def stage_map(v: float, halvings: tuple[tuple[int, ...], tuple[float, ...]] = HALVINGS) -> int:
    """The map of a network's stage at quantile ``v``: an input size of
    :data:`INPUT_SIZES` halved :data:`HALVINGS` times (224: 224, 112, 56, 28, 14, 7), or
    as ``halvings`` (:data:`PATCH_HALVINGS`: 56, 28, 14, 7)."""
    size = pick(v, *INPUT_SIZES)
    return max(size >> pick(beyond(v), *halvings), 1)


def _staged(u: Sequence[float]) -> dict[str, Any]:
    """A convolution on the map of a network's stage (:func:`stage_map`): generator 6's
    dense convolution (six in ten, by coordinate 5) or generator 8's grouped or
    depthwise one, its map an input size halved per stage instead of any of 1-224.
    Networks halve a round input size stage by stage, and cuDNN's kernels tile such maps
    evenly: held out of the models of rounds 1-21 (H100, TF32 on), the dense
    convolutions on maps of 7, 14, 28, 56, 112 or 224 were predicted a median 8.3 % too
    slow against 2.4 % for the others (50 and 800 held-out dense convolutions;
    docs/op-space.md, round 22)."""
    p = _dense_aligned(u) if u[5] < 0.6 else _grouped(u)
    p["spatial"] = stage_map(u[7])
    p["kernel"] = pick(u[3], [1, 3, 5, 7], [0.4, 0.45, 0.05, 0.1])
    p["dilation"] = 1
    _kernel_within_map(p)
    return p


#: Generator 10's numbers of groups, log-uniform: where cuDNN runs a grouped convolution
#: as one kernel for some widths, maps and batches and as one kernel per group for others.
GROUP_COUNTS = (8, 256)
#: Generator 10's widest convolution (channels in and out).
MAX_GROUPED_WIDTH = 4096


def _grouped_by_count(u: Sequence[float]) -> dict[str, Any]:
    """A grouped convolution drawn by its number of groups, as ResNeXt and RegNet build
    theirs: 8-256 groups (:data:`GROUP_COUNTS`, log-uniform) of
    :data:`GROUP_WIDTHS` channels each (fewer groups where that exceeds
    :data:`MAX_GROUPED_WIDTH` channels), as many output channels (nine in ten) or twice
    as many, kernel 3 mostly (1, 5 or 7 one in ten each), stride 1 or 2, on the map of a
    network's stage (:func:`stage_map`), batch a power of two (1-256). Generator 8 draws
    the width and derives the groups, so few of its samples have 16-256 groups, where
    the held-out grouped convolutions of the models of rounds 1-23 missed most: a median
    26-73 % per bin of groups against 18-20 % for 2-4 groups (H100, and H200 with TF32
    off; docs/op-space.md, rounds 24-25)."""
    return _grouped_on_stage(
        u, GROUP_WIDTHS, GROUP_COUNTS, twice=[0.9, 0.1], kernels=[0.1, 0.7, 0.1, 0.1]
    )


#: Generator 11's channels per group: the narrow groups of ResNeXt's first stages and
#: RegNet's smallest widths.
NARROW_GROUP_WIDTHS = (4, 8, 16)
#: Generator 11's numbers of groups, log-uniform.
NARROW_GROUP_COUNTS = (8, 512)


def _narrow_groups(u: Sequence[float]) -> dict[str, Any]:
    """A grouped convolution of :data:`NARROW_GROUP_WIDTHS` channels a group and 8-512
    groups (:data:`NARROW_GROUP_COUNTS`, log-uniform; at most
    :data:`MAX_GROUPED_WIDTH` channels), as many output channels (four in five) or twice
    as many, kernel 3 (six in ten), 1 (two in ten), 5 or 7, stride 1 or 2, on the map of
    a network's stage (:func:`stage_map`), batch a power of two (1-256). Held out of the
    models of rounds 1-25, grouped convolutions of 8 channels a group or fewer missed
    most (a median 31-36 % on each GPU configuration, against 11-18 % for 64-128), and
    those of more than 64 groups 34-46 %; 1x1 ones 28-31 % against 16-24 % for 3x3
    (docs/op-space.md, rounds 26-27). cuDNN runs such a convolution as one kernel or as
    one per group depending on the batch, the map and the number of groups."""
    return _grouped_on_stage(
        u, NARROW_GROUP_WIDTHS, NARROW_GROUP_COUNTS, twice=[0.8, 0.2], kernels=[0.2, 0.6, 0.1, 0.1]
    )


#: Generator 15's numbers of groups, log-uniform: RegNet's first stages (a width of 48-64 in
#: groups of 16-24) and ResNeXt-like blocks of few wide groups.
FEW_GROUP_COUNTS = (2, 8)


def _few_groups(u: Sequence[float]) -> dict[str, Any]:
    """A grouped convolution of 2-8 groups (:data:`FEW_GROUP_COUNTS`, log-uniform) of
    :data:`GROUP_WIDTHS` channels each, as many output channels (four in five) or twice as
    many, kernel 3 (seven in ten), 1 (two in ten), 5 or 7, stride 1 or 2, on the map of a
    network's stage (:func:`stage_map`), batch a power of two (1-256). For some batches
    and maps cuDNN runs such a convolution on a slow path of a dozen kernels, a tenth of
    the speed of its neighbours: regnet_y_800mf's 4-group 3x3 stride-2 convolution of 64
    channels on 112x112 took 0.98 ms at batch 8 in 12 kernels and 0.29 ms at batch 64 in
    5 (H100, TF32 on), predicted 0.09 ms by the models of rounds 1-35; generators 10 and
    11 draw 8 groups or more, and generator 8 derives its groups from a width drawn over
    any map and batch (docs/op-space.md, round 36)."""
    return _grouped_on_stage(
        u, GROUP_WIDTHS, FEW_GROUP_COUNTS, twice=[0.8, 0.2], kernels=[0.2, 0.7, 0.05, 0.05]
    )


def _grouped_on_stage(
    u: Sequence[float],
    widths: Sequence[int],
    counts: tuple[int, int],
    *,
    twice: list[float],
    kernels: list[float],
) -> dict[str, Any]:
    """A grouped convolution of ``widths`` channels a group and ``counts`` groups
    (log-uniform; fewer where the width would exceed :data:`MAX_GROUPED_WIDTH`), as many
    output channels as input or twice as many (weights ``twice``), kernel 1, 3, 5 or 7
    (weights ``kernels``), stride 1 or 2, on the map of a network's stage
    (:func:`stage_map`), batch a power of two (1-256): generators 10 and 11."""
    per_group = pick(u[10], widths)
    groups = min(log_int(u[6], *counts), MAX_GROUPED_WIDTH // per_group)
    cin = groups * per_group
    p = {
        "batch": power_of_two(u[0], 1, 256),
        "cin": cin,
        "cout": cin * (pick(u[2], [1, 2], twice) if 2 * cin <= MAX_GROUPED_WIDTH else 1),
        "kernel": pick(u[3], [1, 3, 5, 7], kernels),
        "stride": pick(u[4], [1, 2], [0.75, 0.25]),
        "dilation": 1,
        "groups": groups,
        "spatial": stage_map(u[7]),
        **_bias_and_layout(u),
    }
    _kernel_within_map(p)
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
        **_bias_and_layout(u),
    }
    _kernel_within_map(p)
    return p


#: Generator 16's grains of a block's width (channels): a multiple of one of them, or a power
#: of two (:func:`block_width`). MobileNet's and EfficientNet's widths are multiples of 8,
#: DenseNet's of 32, ResNet's powers of two.
BLOCK_GRAINS = (8, 16, 32, 64)
#: Generator 16's output width over input width, and how often each: a block's 1x1
#: convolution keeps its width, expands it (a bottleneck's 4, an inverted residual's 6) or
#: reduces it by as much.
POINTWISE_RATIOS = ((1, 2, 4, 6, 1 / 2, 1 / 4, 1 / 6), (0.2, 0.1, 0.15, 0.1, 0.1, 0.2, 0.15))


def block_width(v: float) -> int:
    """A width of 16-2048 channels at quantile ``v``: a power of two (four in ten) or a
    multiple of a grain of :data:`BLOCK_GRAINS`, log-uniform."""
    if beyond(v) < 0.4:
        return power_of_two(v, 16, 2048)
    grain = pick(beyond(beyond(v)), BLOCK_GRAINS)
    return min(round_to(log_int(v, 16, 2048), grain), 2048)


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
        **_bias_and_layout(u),
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
        **_bias_and_layout(u),
    }


#: Generator 25's depthwise kernels, and how often each: MobileNet's and EfficientNet's 3
#: and 5, ConvNeXt's 7.
DEPTHWISE_KERNELS = ((3, 5, 7), (0.45, 0.25, 0.3))
#: Generator 25's most elements of a depthwise convolution's input per image (channels x
#: map): networks widen as their maps shrink, MobileNet V2's widest at 96 x 112 x 112.
DEPTHWISE_MAX_ELEMENTS = 2**21


def _depthwise_on_stage(u: Sequence[float]) -> dict[str, Any]:
    """A depthwise convolution (a group a channel, the width kept) as MobileNet, EfficientNet
    and ConvNeXt build theirs: a width of :func:`block_width`, halved while its input per
    image exceeds :data:`DEPTHWISE_MAX_ELEMENTS` (to a multiple of 8, at least 16), a kernel of
    :data:`DEPTHWISE_KERNELS`, stride 1 (three in four) or 2, on the map of a network's
    stage (:func:`stage_map`), batch a power of two (1-256), a bias and a channels-last
    input one in two each (ConvNeXt's blocks have both). In training cuDNN runs up to 16
    kernels a call for the larger ones, one after the other, where no round had timed
    such a call from a CUDA graph: the models of rounds 1-58 took the graph share of the
    grouped convolutions whose per-group kernels a graph runs at once, and predicted
    ConvNeXt's depthwise convolutions in training at 0.53-0.64 of their time from a
    graph (docs/op-space.md, round 59)."""
    spatial = stage_map(u[7])
    cin = block_width(u[1])
    while cin > 16 and cin * spatial * spatial > DEPTHWISE_MAX_ELEMENTS:
        cin = max(16, round_to(cin // 2, 8))
    p = {
        "batch": power_of_two(u[0], 1, 256),
        "cin": cin,
        "cout": cin,
        "kernel": pick(u[3], *DEPTHWISE_KERNELS),
        "stride": pick(u[4], [1, 2], [0.75, 0.25]),
        "dilation": 1,
        "groups": cin,
        "spatial": spatial,
        "bias": u[8] < 0.5,
        "channels_last": u[9] < 0.5,
    }
    _kernel_within_map(p)
    return p


#: The map of each convolution-only version from 4 on (:func:`params`); a later version that
#: changed other families maps convolutions as the newest here.
_VERSIONS: dict[int, Callable[[Sequence[float]], dict[str, Any]]] = {
    4: _dense_3x3,
    5: partial(_dense_3x3, powers_of_two=True),
    6: _dense_aligned,
    7: _dense_heavy,
    8: _grouped,
    9: _staged,
    10: _grouped_by_count,
    11: _narrow_groups,
    12: _same_width_3x3,
    15: _few_groups,
    16: _pointwise,
    18: _stem,
    25: _depthwise_on_stage,
}
