"""Autograd's sums of gradients in a network's backward pass, which no op measured alone runs.

In training, where several calls take one tensor, autograd adds up their gradients of it
before the backward pass of the call that made it runs: a residual block's input, taken
by its first convolution and by the shortcut's add, gets one add of its size; a DenseNet
feature map, concatenated into every later layer's input, one per later layer; Swin's
fused q, k, v, one per ``qkv[i]`` after the first. An op measured alone
(:mod:`opcost.harness`) sums no gradient: its inputs are leaves, each taken once.
:func:`opcost.extract.gradient_sums` counts the sums on the network's autograd graph on
PyTorch's ``meta`` device and gives each to the recorded call that made the tensor, and
tells which calls run no backward pass at all; :func:`opcost.extract.with_gradient_sums`
puts them in an op table per call (:data:`COLUMNS`). :func:`sum_time_s` is the GPU time
the sums take, each add reading two gradients and writing one at the GPU's memory rate::

    table = with_gradient_sums(extract_model_input(mi), mi)   # opcost.extract
    sum_time_s(adds, nbytes, peaks.memory_bytes_per_s, kernel_floor_s)
"""

from __future__ import annotations

from typing import Any

#: Columns an op table may carry, per call of the op (its calls' mean): the gradient sums
#: autograd runs in a training step for the tensors the call makes (adds, and the bytes
#: of one operand over them), and whether the call runs a backward pass at all (1; 0 where
#: none of its outputs needs a gradient, as a mask built from the input's shape).
COLUMNS = ("grad_sum_adds", "grad_sum_bytes", "backward_share")


def sum_time_s(adds: Any, nbytes: Any, memory_bytes_per_s: float, kernel_floor_s: float) -> Any:
    """The GPU time of ``adds`` gradient sums of ``nbytes`` (the bytes of one gradient
    summed, over all the adds): each add reads two gradients and writes one, and takes
    at least ``kernel_floor_s``."""
    return adds * kernel_floor_s + 3.0 * nbytes / memory_bytes_per_s
