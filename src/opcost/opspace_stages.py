"""The maps and widths networks build, which the op space's later versions draw.

A network runs at an input size of :data:`INPUT_SIZES` and halves it stage by stage
(:func:`stage_map`); its blocks' widths are powers of two or multiples of a grain
(:func:`block_width`, :func:`aligned_width`). The convolutions' versions
(:mod:`opcost.opspace_conv`, :mod:`opcost.opspace_grouped`) and the other families'
(:mod:`opcost.opspace_ops`, :mod:`opcost.opspace_copies`) draw from these, so that
their samples lie where networks' ops do.
"""

from __future__ import annotations

from opcost.opspace_draw import beyond, log_int, pick, power_of_two, round_to

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


#: Grains of an aligned width (:func:`aligned_width`, generators 6-9): a multiple of 32 or
#: 64, or a power of two (the rest).
ALIGNED_GRAINS = (32, 64)


def aligned_width(v: float) -> int:
    """A width of 16-2048 channels at quantile ``v``: a multiple of 32 or 64 (two in
    three) or a power of two."""
    if beyond(v) < 2 / 3:
        grain = pick(beyond(beyond(v)), ALIGNED_GRAINS)
        return min(round_to(log_int(v, 16, 2048), grain), 2048)
    return power_of_two(v, 16, 2048)


#: Grains of a block's width (channels) from generator 16 on: a multiple of one of them, or a power
#: of two (:func:`block_width`). MobileNet's and EfficientNet's widths are multiples of 8,
#: DenseNet's of 32, ResNet's powers of two.
BLOCK_GRAINS = (8, 16, 32, 64)


def block_width(v: float) -> int:
    """A width of 16-2048 channels at quantile ``v``: a power of two (four in ten) or a
    multiple of a grain of :data:`BLOCK_GRAINS`, log-uniform."""
    if beyond(v) < 0.4:
        return power_of_two(v, 16, 2048)
    grain = pick(beyond(beyond(v)), BLOCK_GRAINS)
    return min(round_to(log_int(v, 16, 2048), grain), 2048)
