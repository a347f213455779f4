"""Autograd's sums of gradients in a network's backward pass, which no op measured alone runs.

In training, where several calls take one tensor, autograd adds up their gradients of it
before the backward pass of the call that made it runs: a residual block's input, taken
by its first convolution and by the shortcut's add, gets one add of its size; a DenseNet
feature map, concatenated into every later layer's input, one per later layer; Swin's
fused q, k, v, one per ``qkv[i]`` after the first. An op measured alone
(:mod:`opcost.harness`) sums no gradient: its inputs are leaves, each taken once.
:func:`opcost.extract.extract_gradient_sums` counts the sums on the network's autograd
graph on PyTorch's ``meta`` device and gives each to the recorded call that made the
tensor (:data:`COLUMNS` of an op table, over its calls); :func:`sum_time_s` is the GPU
time they take, each add reading two gradients and writing one at the GPU's memory rate::

    table = with_gradient_sums(extract_model_input(mi), mi)   # opcost.extract
    sum_time_s(adds, nbytes, peaks.memory_bytes_per_s, kernel_floor_s)
"""

from __future__ import annotations

from typing import Any

#: Columns an op table may carry: the gradient sums autograd runs, over the op's calls in
#: one training step, for the tensors they make (adds, and the bytes of one operand each).
COLUMNS = ("grad_sum_adds", "grad_sum_bytes")


def sum_time_s(adds: Any, nbytes: Any, memory_bytes_per_s: float, kernel_floor_s: float) -> Any:
    """The GPU time of ``adds`` gradient sums of ``nbytes`` (the bytes of one gradient
    summed, over all the adds): each add reads two gradients and writes one, and takes
    at least ``kernel_floor_s``."""
    return adds * kernel_floor_s + 3.0 * nbytes / memory_bytes_per_s


def per_call(table: Any) -> tuple[Any, Any]:
    """``(adds, bytes)`` per call of each row of an op table with ``count``: its
    :data:`COLUMNS` over its calls, divided by them; zeros where it has no such columns."""
    import numpy as np

    if not all(c in table for c in COLUMNS):
        zeros = np.zeros(len(table))
        return zeros, zeros.copy()
    count = table["count"].to_numpy(dtype=float).clip(min=1)
    return (
        table[COLUMNS[0]].to_numpy(dtype=float) / count,
        table[COLUMNS[1]].to_numpy(dtype=float) / count,
    )
