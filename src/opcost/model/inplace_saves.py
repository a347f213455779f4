"""The copy of its input an in-place op makes in a network's training step, which the op
measured alone does not.

In training an in-place op is measured as its out-of-place form (:mod:`opcost.harness`:
autograd forbids writing into a leaf that needs a gradient). In a network it runs in
place on an earlier call's output, and where its derivative needs the input it
overwrites, autograd first clones that input (the ``original_self`` its generated
kernel saves): ``SiLU``, ``Hardswish``, ``Hardsigmoid`` and ``ReLU6`` with
``inplace=True``, ``mul_``; not ``ReLU`` or ``add_``, whose derivatives need the result
or nothing. Traced in a network (efficientnet_b1 and mobilenet_v3_large, 8x3x224x224,
H200), each such call's forward pass runs two kernels, the clone and the op.

:func:`saved_copies` finds those clones by running the op both ways on PyTorch's ``meta``
device under a dispatch mode that counts them, so it holds for any op autograd knows;
their time is a copy's (:func:`opcost.model.leaf_grads.copy_time_s`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from opcost.model import leaf_grads

#: Columns an op table may carry with :func:`saved_copies` of each op, so that a
#: prediction from it imports no torch (:func:`opcost.opcache.extract_cached` adds them).
COLUMNS = ("inplace_save_copies", "inplace_save_copy_bytes")


@lru_cache(maxsize=65536)
def saved_copies(spec: str) -> tuple[int, int]:
    """``(copies, bytes)``: the clones autograd makes when op ``spec`` runs in place in a
    training step, on inputs that are earlier calls' outputs, beyond those of its
    out-of-place form, and the bytes they copy. ``(0, 0)`` for an op that is not in
    place, or one the ``meta`` device cannot run."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from opcost import spec as specs

    parsed = json.loads(spec)
    if not specs.is_inplace(parsed):
        return 0, 0

    class Clones(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.copies = self.nbytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.clone.default:
                self.copies += 1
                self.nbytes += args[0].numel() * args[0].element_size()
            return func(*args, **(kwargs or {}))

    def clones(inplace_ok: bool) -> tuple[int, int]:
        op = specs.rebuild(parsed, inplace_ok=inplace_ok, device="meta")
        leaves = specs.random_inputs(parsed, "meta", requires_grad=True)
        inputs = [t.clone() if t.requires_grad else t for t in leaves]  # not leaves
        with Clones() as counted:
            op(inputs)
        return counted.copies, counted.nbytes

    try:
        in_place, in_place_bytes = clones(True)
        out_of_place, out_of_place_bytes = clones(False)
    except (NotImplementedError, RuntimeError, TypeError, ValueError, specs.SpecError):
        return 0, 0
    if in_place <= out_of_place:
        return 0, 0
    return in_place - out_of_place, max(in_place_bytes - out_of_place_bytes, 0)


def with_saves(table: Any) -> Any:
    """``table`` (a frame with ``spec``) with :data:`COLUMNS` of each row's op."""
    return leaf_grads.with_columns(table, COLUMNS, saved_copies)


def saves_of(rows: Any) -> tuple[Any, Any]:
    """``(copies, bytes)`` arrays for the rows of a frame with ``spec``: its
    :data:`COLUMNS` where it has them, else :func:`saved_copies` of each spec."""
    return leaf_grads.columns_of(rows, COLUMNS, saved_copies)
