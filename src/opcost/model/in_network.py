"""What a call in a network runs that its op measured alone does not, and the reverse.

The op models learn from ops measured alone (:mod:`opcost.harness`), whose
floating-point inputs are leaves; in a network the same call's inputs are earlier calls'
outputs. :meth:`opcost.model.opmodel.OpModel.predict` corrects a training row's
prediction for three differences, each measured where it was found:

* **host time** (:func:`network_host_time_s`): an isolated op's backward accumulates a
  gradient into each leaf input, a network's call does not; what a leaf adds is learnt
  from the samples of views (:func:`leaf_overhead`), and at least one trivial backward
  node's time stays;
* **the leaf inputs' gradient copies** (:func:`without_leaf_copies`,
  :mod:`opcost.model.leaf_grads`): taken off the GPU time and the kernels;
* **the clone of an in-place op's input** (:func:`with_inplace_saves`,
  :mod:`opcost.model.inplace_saves`): added to the forward pass.

Each function works on the frame of predictions ``out`` and the op rows ``rows`` that
:meth:`~opcost.model.opmodel.OpModel.predict` builds, row for row; the GPU functions
change GPU times and kernels, and the caller derives the busy times from them.
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pandas as pd

from opcost.model import inplace_saves, leaf_grads


@lru_cache(maxsize=65536)
def leaf_inputs(spec: str) -> int:
    """The floating-point tensors op ``spec`` takes that are not its parameters: each a
    leaf with a gradient when the op is measured alone."""
    inputs = json.loads(spec).get("inputs", [])
    return sum(
        1
        for t in inputs
        if not t.get("param") and str(t.get("dtype", "")).startswith(("float", "bfloat"))
    )


def leaf_overhead(rows: pd.DataFrame) -> tuple[float, float]:
    """``(leaf overhead, backward node)`` relative to the host probe, from the training
    samples of views (no kernels, one leaf input): their backward host time is one
    trivial node plus the leaf's gradient accumulation; ``backward_node_s`` (measured per
    chunk) is the node alone. ``(0, 0)`` where the samples lack either."""
    if "backward_node_s" not in rows:
        return 0.0, 0.0
    node = pd.to_numeric(rows["backward_node_s"], errors="coerce") / rows["host_probe_s"]
    node = node.dropna()
    views = rows[rows["family"].eq("view") & rows["mode"].eq("training")]
    backward = (views["host_time_s"] - views["forward_host_time_s"]) / views["host_probe_s"]
    backward = backward.dropna()
    if node.empty or backward.empty:
        return 0.0, 0.0
    node_ratio = float(node.median())
    return max(float(backward.median()) - node_ratio, 0.0), node_ratio


def network_host_time_s(
    out: pd.DataFrame,
    rows: pd.DataFrame,
    training: np.ndarray,
    probe_s: float,
    leaf_overhead_ratio: float,
    backward_node_ratio: float,
) -> np.ndarray:
    """``out``'s host time per call as in a network: a training row's backward pass less
    :func:`leaf_overhead`'s share per leaf input (``leaf_overhead_ratio`` times the probe
    ``probe_s``), keeping at least one node's time (``backward_node_ratio``) or its own
    where that is less."""
    leaves = np.array([float(leaf_inputs(s)) for s in rows["spec"]])
    backward = out["host_time_s"] - out["forward_host_time_s"]
    kept = np.maximum(
        backward - leaves * leaf_overhead_ratio * probe_s,
        np.minimum(backward, backward_node_ratio * probe_s),
    )
    return np.where(training, out["forward_host_time_s"] + kept, out["host_time_s"])


def without_leaf_copies(
    out: pd.DataFrame,
    rows: pd.DataFrame,
    training: np.ndarray,
    memory_bytes_per_s: float,
    kernel_floor_s: float,
) -> None:
    """Take off the training rows of ``out`` the copies of their leaf inputs' gradients
    that the isolated samples ran and a network's call does not
    (:mod:`opcost.model.leaf_grads`), at the GPU's measured memory rate; the backward
    pass keeps no less than nothing. Where the copies are all the backward kernels the
    row predicts (``add``, ``cat``, ``contiguous``: their backward hands the gradient
    on), the call's backward runs nothing in a network, and its GPU time is its forward
    pass's: the isolated copies of 1-10 MB took a median 1.6 and up to 3 times their
    time at the memory rate (H200), which subtracting that time leaves in."""
    copies, nbytes = leaf_grads.copies_of(rows[training])
    copy_s = leaf_grads.copy_time_s(copies, nbytes, memory_bytes_per_s, kernel_floor_s)
    sel = np.flatnonzero(training)
    gpu = out["gpu_time_s"].to_numpy(dtype=float).copy()
    fwd = out["forward_gpu_time_s"].to_numpy(dtype=float)
    kernels = out["n_kernels"].to_numpy(dtype=float).copy()
    fwd_k = out["forward_n_kernels"].to_numpy(dtype=float)
    only_copies = (copies > 0) & (kernels[sel] - fwd_k[sel] - copies < 0.5)
    left = np.where(only_copies, fwd[sel], np.maximum(gpu[sel] - copy_s, fwd[sel]))
    gpu[sel] = np.where(gpu[sel] > 0, left, gpu[sel])
    kernels[sel] = np.maximum(kernels[sel] - copies, fwd_k[sel])
    out["gpu_time_s"] = gpu
    out["n_kernels"] = kernels


def with_inplace_saves(
    out: pd.DataFrame,
    rows: pd.DataFrame,
    training: np.ndarray,
    memory_bytes_per_s: float,
    kernel_floor_s: float,
) -> None:
    """Add to the training rows of ``out`` the clones of their input that autograd makes
    before an in-place op overwrites it in a network, which the samples' out-of-place
    form did not run (:mod:`opcost.model.inplace_saves`): a copy kernel each in the
    forward pass, at the GPU's measured memory rate."""
    copies, nbytes = inplace_saves.saves_of(rows[training])
    if not copies.any():
        return
    copy_s = leaf_grads.copy_time_s(copies, nbytes, memory_bytes_per_s, kernel_floor_s)
    sel = np.flatnonzero(training)
    ran = out["gpu_time_s"].to_numpy()[sel] > 0
    added = {"gpu_time_s": copy_s, "forward_gpu_time_s": copy_s,
             "n_kernels": copies, "forward_n_kernels": copies}  # fmt: skip
    for col, add in added.items():
        values = out[col].to_numpy(dtype=float).copy()
        values[sel] += np.where(ran, add, 0.0)
        out[col] = values
