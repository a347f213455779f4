"""Points of the unit cube to op parameters, and the calls the op space records.

The op space (:mod:`opcost.opspace`) maps each coordinate of a sampled point to one
parameter: log-uniform integers and widths rounded to the grains networks use, weighted
choices, powers of two; a family's parameters then become a :class:`Call` on PyTorch's
``meta`` device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def log_int(u: float, lo: int, hi: int) -> int:
    """An integer log-uniform in ``[lo, hi]`` at quantile ``u``."""
    return int(min(hi, max(lo, round(math.exp(math.log(lo) + u * math.log(hi / lo))))))


#: Grains of sampled widths (channels, features, matrix sizes) and their weights: networks
#: use widths that are multiples of 8 to 64 almost always, and cuDNN and cuBLAS pick
#: faster kernels for them (on an H100, dense convolutions with both widths multiples of 16
#: reached twice the roofline efficiency of unaligned ones), so most samples are aligned.
WIDTH_GRAINS = (1, 8, 16, 32, 64)
WIDTH_GRAIN_WEIGHTS = (0.15, 0.15, 0.2, 0.25, 0.25)


def beyond(u: float) -> float:
    """A second quantile from the digits of ``u`` beyond its first use: a choice drawn
    alongside another from one coordinate, nearly independent of it."""
    return (u * 977.0) % 1.0


def width(u: float, lo: int, hi: int) -> int:
    """A width log-uniform in ``[lo, hi]`` at quantile ``u``, rounded to a grain of
    :data:`WIDTH_GRAINS` drawn from the digits of ``u`` beyond its quantile."""
    grain = pick(beyond(u), WIDTH_GRAINS, WIDTH_GRAIN_WEIGHTS)
    n = log_int(u, lo, hi)
    if grain > 1 and hi >= grain:
        n = min(round_to(n, grain), hi // grain * grain)
    return n


def pick(u: float, options: Sequence[Any], weights: Sequence[float] | None = None) -> Any:
    """The option at quantile ``u`` of the (weighted) options."""
    w = np.asarray(weights if weights is not None else [1.0] * len(options), dtype=float)
    edges = np.cumsum(w / w.sum())
    return options[min(int(np.searchsorted(edges, u, side="right")), len(options) - 1)]


def round_to(value: int, multiple: int) -> int:
    return max(multiple, int(round(value / multiple)) * multiple)


def power_of_two(u: float, lo: int, hi: int) -> int:
    """A power of two in ``[lo, hi]`` (both powers of two), log-uniform at quantile ``u``."""
    return lo * 2 ** min(int(u * (math.log2(hi // lo) + 1)), int(math.log2(hi // lo)))


# -- what networks are built of -----------------------------------------------------------


#: Generator 17's tokens of an attention block (a window of 7x7 or 8x8, ViT's 50 and
#: 197, a map of 14x14 or 16x16 and larger) and head sizes, and how often each.
ATTENTION_TOKENS = (
    (49, 64, 50, 197, 196, 256, 576, 1024),
    (0.25, 0.1, 0.1, 0.15, 0.1, 0.1, 0.1, 0.1),
)
HEAD_DIMS = ((32, 64, 128), (0.4, 0.4, 0.2))


#: Generator 20's heads of a transformer's attention, and how often each: DeiT-Tiny's 3,
#: ViT-Small's 6, ViT-Base's 12, ViT-Large's and ViT-Huge's 16, and between.
TRANSFORMER_HEADS = ((2, 3, 4, 6, 8, 12, 16), (0.1, 0.05, 0.15, 0.15, 0.2, 0.2, 0.15))


def nchw(p: dict[str, Any]) -> tuple[int, int, int, int]:
    return p["batch"], p["channels"], p["spatial"], p["spatial"]


def tensor_shape(u: Sequence[float]) -> dict[str, Any]:
    """An activation tensor: NCHW (optionally channels-last) or tokens (N, L, C)."""
    return {
        "batch": log_int(u[0], 1, 256),
        "layout": pick(u[1], ["nchw", "tokens"], [0.7, 0.3]),
        "channels": width(u[2], 8, 2048),
        "spatial": log_int(u[3], 1, 112),
        "tokens": log_int(u[3], 4, 1024),
        "channels_last": u[4] < 0.25,
    }


# -- building one configuration ------------------------------------------------------------


@dataclass
class Call:
    """One configuration ready to record: a module or function, and how it is called."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict[str, Any]
    module: torch.nn.Module | None = None


def meta_tensor(*shape: int, channels_last: bool = False) -> torch.Tensor:
    x = torch.empty(shape, device="meta")
    if channels_last and len(shape) == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def module_call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Call:
    return Call(module, args, kwargs, module.eval())


def function_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Call:
    return Call(fn, args, kwargs)


def bias_and_layout(u: Sequence[float]) -> dict[str, bool]:
    """A convolution's bias (three in ten) and channels-last input (one in four), from
    coordinates 8 and 9 of its point, as every generator draws them."""
    return {"bias": u[8] < 0.3, "channels_last": u[9] < 0.25}


def kernel_within_map(p: dict[str, Any]) -> None:
    """A kernel (dilated) wider than its map becomes 3x3, or 1x1 on maps under 3, in
    place: padding would be most of it."""
    if p["spatial"] < p["kernel"] * p["dilation"]:
        p["kernel"], p["dilation"] = (3 if p["spatial"] >= 3 else 1), 1
