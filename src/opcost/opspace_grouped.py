"""Grouped and depthwise convolutions of the op space: the versions that draw only those.

Generators 8, 10, 11, 15 and 25 of :func:`opcost.opspace_conv.params` (the map from a
point of the unit cube to a convolution's parameters): cuDNN runs a grouped convolution
as one kernel, or one per group, some on several streams at once, depending on its
widths, map and batch, and these versions put samples where those choices change. Each
stays unchanged once a round was measured with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opcost.opspace_draw import (
    bias_and_layout,
    kernel_within_map,
    log_int,
    pick,
    power_of_two,
    round_to,
)
from opcost.opspace_stages import aligned_width, block_width, stage_map

#: Generator 8's channels per group of a grouped convolution (ResNeXt's 4-64, RegNet's
#: 8-128 group widths).
GROUP_WIDTHS = (4, 8, 16, 24, 32, 48, 64, 128)


def grouped(u: Sequence[float]) -> dict[str, Any]:
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
    cin = aligned_width(u[1])
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
        **bias_and_layout(u),
    }
    kernel_within_map(p)
    return p


#: Generator 10's numbers of groups, log-uniform: where cuDNN runs a grouped convolution
#: as one kernel for some widths, maps and batches and as one kernel per group for others.
GROUP_COUNTS = (8, 256)
#: Generator 10's widest convolution (channels in and out).
MAX_GROUPED_WIDTH = 4096


def grouped_by_count(u: Sequence[float]) -> dict[str, Any]:
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


def narrow_groups(u: Sequence[float]) -> dict[str, Any]:
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


def few_groups(u: Sequence[float]) -> dict[str, Any]:
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
        **bias_and_layout(u),
    }
    kernel_within_map(p)
    return p


#: Generator 25's depthwise kernels, and how often each: MobileNet's and EfficientNet's 3
#: and 5, ConvNeXt's 7.
DEPTHWISE_KERNELS = ((3, 5, 7), (0.45, 0.25, 0.3))
#: Generator 25's most elements of a depthwise convolution's input per image (channels x
#: map): networks widen as their maps shrink, MobileNet V2's widest at 96 x 112 x 112.
DEPTHWISE_MAX_ELEMENTS = 2**21


def depthwise_on_stage(u: Sequence[float]) -> dict[str, Any]:
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
    kernel_within_map(p)
    return p
