"""The gradient copies an op measured alone runs in training, and a network's call does not.

Measured alone (:mod:`opcost.harness`), an op's floating-point inputs are leaves, and
autograd's ``AccumulateGrad`` stores each one's gradient in its ``.grad``. It keeps the
gradient tensor itself only if nothing else holds it and it is laid out as the input is;
otherwise it copies it (PyTorch's ``clone_obey_contract``): where the op's backward hands
on the output's gradient itself, which the harness holds (``add`` to both inputs,
``contiguous``), or a gradient laid out otherwise than its input (``cat``'s slices along
the channels, ``LayerNorm2d``'s permuted one). In a network the op's inputs are earlier
calls' outputs, and the gradient flows on without a copy: an isolated ``add`` of two
1024x14x14 maps at batch 64 runs three kernels in training and takes three times its
forward pass, in ResNet-101 one kernel and its forward pass's time (H200, 2026-11-29).

:func:`copied_leaves` finds those inputs by running the op's backward on PyTorch's
``meta`` device, as the harness builds it, so it holds for any op autograd knows;
:func:`copy_time_s` is what their copies take, read and written once at the GPU's
memory rate.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=65536)
def copied_leaves(spec: str) -> tuple[int, int]:
    """``(copies, bytes)``: how many of op ``spec``'s non-parameter floating-point inputs
    (leaves when measured alone in training) get a gradient ``AccumulateGrad`` copies, and
    their bytes. ``(0, 0)`` for an op without gradients, or one the ``meta`` device cannot
    run."""
    import torch

    from opcost import spec as specs

    parsed = json.loads(spec)
    try:
        op = specs.rebuild(parsed, inplace_ok=False, device="meta")
        inputs = specs.random_inputs(parsed, "meta", requires_grad=True)
        out = op(inputs)
        outs = [t for t in _tensors(out) if t.requires_grad]
        leaves = [
            t
            for t, i in zip(inputs, parsed["inputs"], strict=True)
            if t.requires_grad and not i.get("param")
        ]
        if not outs or not leaves:
            return 0, 0
        held = [torch.empty_like(t) for t in outs]  # the harness keeps its output gradients
        grads = torch.autograd.grad(outs, leaves, held, allow_unused=True)
    except (NotImplementedError, RuntimeError, TypeError, ValueError, specs.SpecError):
        return 0, 0
    copies = nbytes = 0
    for leaf, grad in zip(leaves, grads, strict=True):
        if grad is None:
            continue
        held_too = any(grad is h for h in held)  # the output's gradient itself
        if held_too or not _obeys_layout(grad, leaf):
            copies += 1
            nbytes += leaf.numel() * leaf.element_size()
    return copies, nbytes


def copy_time_s(copies: Any, nbytes: Any, memory_bytes_per_s: float, kernel_floor_s: float) -> Any:
    """The GPU time of ``copies`` copy kernels moving ``nbytes`` (each byte read and
    written once) at ``memory_bytes_per_s``, each at least ``kernel_floor_s``."""
    return copies * kernel_floor_s + 2.0 * nbytes / memory_bytes_per_s


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _obeys_layout(grad: Any, leaf: Any) -> bool:
    """PyTorch's ``obeys_layout_contract``: a gradient strided as its input (dimensions of
    size 1 aside) where the input is non-overlapping and dense, else a contiguous one."""
    if not _non_overlapping_and_dense(leaf):
        return grad.is_contiguous()
    for size, g, v in zip(grad.shape, grad.stride(), leaf.stride(), strict=True):
        if (size != 1 and g != v) or (size == 1 and g == 0):
            return False
    return True


def _non_overlapping_and_dense(t: Any) -> bool:
    expected = 1
    for size, stride in sorted(
        ((s, st) for s, st in zip(t.shape, t.stride(), strict=True) if s != 1),
        key=lambda d: d[1],
    ):
        if stride != expected:
            return False
        expected *= size
    return True


#: Columns an op table may carry with :func:`copied_leaves` of each op, so that a
#: prediction from it imports no torch (:func:`opcost.opcache.extract_cached` adds them).
COLUMNS = ("leaf_grad_copies", "leaf_grad_copy_bytes")


def with_copies(table: Any) -> Any:
    """``table`` (a frame with ``spec``) with :data:`COLUMNS` of each row's op."""
    return with_columns(table, COLUMNS, copied_leaves)


def copies_of(rows: Any) -> tuple[Any, Any]:
    """``(copies, bytes)`` arrays for the rows of a frame with ``spec``: its
    :data:`COLUMNS` where it has them, else :func:`copied_leaves` of each spec."""
    return columns_of(rows, COLUMNS, copied_leaves)


def with_columns(table: Any, columns: tuple[str, str], find: Any) -> Any:
    """``table`` (a frame with ``spec``) with ``columns``: ``find(spec)``'s ``(copies,
    bytes)`` of each row's op, as integers."""
    copies, nbytes = columns_of(table[["spec"]], columns, find)
    return table.assign(**{columns[0]: copies.astype("int64"), columns[1]: nbytes.astype("int64")})


def columns_of(rows: Any, columns: tuple[str, str], find: Any) -> tuple[Any, Any]:
    """``(copies, bytes)`` arrays for the rows of a frame with ``spec``: its ``columns``
    where it has them, else ``find(spec)`` of each row."""
    import numpy as np

    if all(c in rows for c in columns):
        return (rows[columns[0]].to_numpy(dtype=float), rows[columns[1]].to_numpy(dtype=float))
    found = np.array([find(str(s)) for s in rows["spec"]], dtype=float).reshape(-1, 2)
    return found[:, 0], found[:, 1]
