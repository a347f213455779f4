"""Roofline work of an op: its FLOPs and DRAM bytes, and the time they take at peak rates.

Each op's GPU time is modelled as ``roofline_time_s / efficiency`` with the efficiency in
(0, 1]; this module gives the roofline time, from the op's spec (:mod:`opcost.spec`
format) alone. It imports no torch (``opcost predict`` imports it)::

    work = op_work(spec, "training")            # Work(flops=..., bytes=...)
    t_s = roofline_time_s(work, Peaks.from_dict(measure_peaks()))

**Bytes** are the tensors that must cross DRAM at least once: the tensor inputs (each
once, also when broadcast or passed several times), the outputs and the module's
parameters (buffers such as BatchNorm's running statistics, at most 4 elements per
channel, are left out), at their dtypes' widths (``dtype`` replaces every floating
dtype, as the measuring harness casts floating inputs and parameters). Extra tensors
that PyTorch's GPU kernels always write and read: the int64 indices of max pooling
(written in the forward pass, read in the backward pass), the query/key/value and context
intermediates of ``nn.MultiheadAttention`` (written by one kernel, read by the next), the
bool mask of an active dropout.

**FLOPs** count a multiply-add as 2 and leave bias additions out (as
``torch.utils.flop_counter`` does): direct convolution ``2 * N * C_out * prod(out
spatial) * C_in / groups * prod(kernel)`` (transposed: input spatial and the channels
swapped), ``2 * M * N * K`` for matrix products (``2 * out_numel * K``; einsum: 2 times the
product of every index size), attention ``Q, K, V projections + QK^T + AV + output
projection`` (``nn.MultiheadAttention``) or ``QK^T + AV`` (SDPA). Memory-bound ops count a
small constant per element: activation 1 per output element, norm 5 per input element,
softmax 5 per element, elementwise 1 per output element (reductions ``mean``/``sum``: 1
per input element), pooling ``prod(kernel)`` per output element (adaptive: 1 per input
element), active dropout 2 per element, cat/copy/view 0.

**Rows.** A layer norm (``LayerNorm``, ``F.layer_norm``, ConvNeXt's ``LayerNorm2d``,
RMS norms) reduces each row of its normalised size apart, a row to a group of threads:
below a few hundred elements a row, its kernels run at a rate of rows, not of bytes
(an H200 takes about 1.45 ns a row for 8 to 128 elements a row, where its bytes alone
would take 0.1-0.2 ns). ``Work.rows`` counts them, once per pass (the forward, and in
training the backward); a configuration's ceilings (:class:`Peaks`) hold the highest
row rate its samples achieved (``rows_per_s``), and the roofline time is the largest
of the three times.

**Training** is one step of the measuring harness: the forward pass, then the backward
pass w.r.t. every floating input (the harness makes them all require grad) and the
module's parameters. With F, X, W, O the forward FLOPs, floating-input bytes, parameter
bytes and output bytes (O: floating outputs) and ``S`` the saved tensors the backward
pass reads:

=================================  ==============  ======================================
family                             training FLOPs  training bytes
=================================  ==============  ======================================
conv, linear, matmul, attention    3 F             3 x forward bytes (two backward
                                                   products, each reading its operands
                                                   and writing its result)
norm, activation, pool,            2 F             forward bytes + O + X + 2 W + S
elementwise, softmax, dropout,                     (read the output gradients, write the
cat, copy, other                                   input gradients, read the parameters
                                                   and write their gradients, read S)
view                               0               0 (a view's gradient is a view); a
                                                   view of part of X: X + 2 O (zeros
                                                   written, the part's gradient copied
                                                   in); a split into parts: X + O
=================================  ==============  ======================================

``S``: activation X (its input or output), norm X, max pooling its int64 indices,
softmax O, elementwise ``mul``/``div`` X (each operand's gradient needs the other),
dropout its mask; 0 for the rest. Dropout in training also writes its mask in the
forward pass.

**Identities.** View ops (``view``, ``permute``, ``expand``, slicing, ...) launch no
kernel in the forward pass: ``Work(0, 0)``, also for a strided input; in training, one
that takes part of its input (slicing, ``x[0]``, ``chunk``: :data:`PART_VIEWS`,
:data:`SPLIT_VIEWS`) writes the whole input's gradient in its backward pass. Indexing
with a tensor (``x[idx]``) gathers: the index is read and the output written.
``reshape`` and ``flatten`` of an input whose strides admit no view of the new shape
(:func:`view_strides`: a permuted map, say) copy it: read and written once.
``x[index] = value`` (``Tensor.__setitem__``, a copy) writes the part of ``x`` its spec
records as output and reads the value; in training, a tensor value's gradient reads that
part of the output gradient and writes the value's (a scalar value has no backward pass).
``contiguous`` of a contiguous input, ``to`` without a change of dtype or layout, dropout
and ``StochasticDepth`` in inference (or with ``p == 0``) return their input: ``Work(0,
0)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from opcost.errors import OpcostError
from opcost.model.op_spec import (
    COMPUTE_FAMILIES,
    DTYPE_BYTES,
    OpSpec,
    conv_flops_params,
    family_of,
    int_list,
    is_float,
    linear_flops_params,
    numel,
    spatial_dims,
)
from opcost.names import MODES

_INDEX_BYTES = 8  # int64 indices of max pooling


class RooflineError(OpcostError, ValueError):
    """An op's work cannot be counted from its spec; the message names the op and field."""


# -- work -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    """The work of one step of an op: FLOPs (multiply-add = 2), DRAM bytes and the rows a
    layer norm reduces (once per pass; module docstring, "Rows")."""

    flops: float
    bytes: float
    rows: float = 0.0


def _einsum_flops(op: OpSpec) -> float:
    equation = op.arg(0, "equation")
    if not isinstance(equation, str):
        raise KeyError("equation")
    lhs = equation.replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    ellipsis: list[int] = []
    for term, t in zip(lhs, op.inputs, strict=False):
        shape = [int(d) for d in t["shape"]]
        if "..." in term:
            head, tail = term.split("...")
            n_ell = len(shape) - len(head) - len(tail)
            ell = shape[len(head) : len(head) + n_ell]
            ellipsis = [max(a, b) for a, b in zip(ellipsis[-n_ell:] or ell, ell, strict=False)]
            term = head + tail
            shape = shape[: len(head)] + shape[len(head) + n_ell :]
        for letter, size in zip(term, shape, strict=False):
            sizes[letter] = max(sizes.get(letter, 1), size)
    product = float(math.prod(sizes.values()) * numel(ellipsis))
    return (2.0 if len(lhs) > 1 else 1.0) * product


def _matmul(op: OpSpec) -> float:
    if op.name == "einsum":
        return _einsum_flops(op)
    position = 1 if op.name in {"baddbmm", "addbmm"} else 0
    a = op.tensor_arg(position, "batch1" if position else "input")
    if a is None:
        a = op.inputs[position]
    k = int(a["shape"][-1]) if a["shape"] else 1
    return 2.0 * numel(op.out_shape()) * k


def _mha(op: OpSpec) -> tuple[float, float, float]:
    """FLOPs, parameter elements and intermediate bytes of nn.MultiheadAttention."""
    a = op.attrs
    e = int(a["embed_dim"])
    kdim, vdim = int(a.get("kdim") or e), int(a.get("vdim") or e)
    q, k = op.tensor_arg(0, "query"), op.tensor_arg(1, "key")
    if q is None or k is None:
        raise KeyError("query/key")
    qs, ks = [int(d) for d in q["shape"]], [int(d) for d in k["shape"]]
    if len(qs) == 3:
        seq = 1 if a.get("batch_first") else 0
        n, length, src = qs[1 - seq], qs[seq], ks[seq]
    else:  # unbatched (L, E)
        n, length, src = 1, qs[0], ks[0]
    flops = 2.0 * n * (length * e * e + src * kdim * e + src * vdim * e)  # projections
    flops += 2.0 * n * length * src * e  # QK^T over all heads
    flops += 2.0 * n * length * src * e  # AV
    flops += 2.0 * n * length * e * e  # output projection
    bias = a.get("bias", True) is not False
    params = e * (e + kdim + vdim) + e * e + (4 * e if bias else 0)
    params += 2 * e if a.get("add_bias_kv") else 0
    width = DTYPE_BYTES.get(op.param_dtype, 4)
    # q, k, v written by the projections and read by attention; the context written by
    # attention and read by the output projection.
    inter = 2.0 * width * n * (length * e + 2 * src * e) + 2.0 * width * n * length * e
    return flops, float(params), inter


def _sdpa(op: OpSpec) -> float:
    q, k, v = (op.tensor_arg(i, n) for i, n in enumerate(("query", "key", "value")))
    if q is None or k is None or v is None:
        raise KeyError("query/key/value")
    qs = [int(d) for d in q["shape"]]
    s, ev = int(k["shape"][-2]), int(v["shape"][-1])
    batch, length, e = numel(qs[:-2]), qs[-2], qs[-1]
    return 2.0 * batch * length * s * e + 2.0 * batch * length * s * ev


def _norm_params(op: OpSpec) -> float:
    a = op.attrs
    if op.kind != "module":
        return 0.0  # weights are inputs
    if "normalized_shape" in a:
        ns = a["normalized_shape"]
        size = numel(ns) if isinstance(ns, list) else int(ns)
        if not a.get("elementwise_affine", True):
            return 0.0
        return float(size * (2 if a.get("bias", True) is not False else 1))
    channels = int(a.get("num_features") or a.get("num_channels") or 0)
    return float(2 * channels) if a.get("affine") else 0.0


def _pool_kernel(op: OpSpec) -> int:
    n_sp = spatial_dims(op, max(1, len(op.shape(0)) - 2))
    value = op.attrs.get("kernel_size") if op.kind == "module" else op.arg(1, "kernel_size")
    if value is None:
        raise KeyError("kernel_size")
    return numel(int_list(value, n_sp))


def _active_dropout(op: OpSpec, training: bool) -> bool:
    if op.kind == "module":
        p = op.attrs.get("p", 0.5)
        return training and isinstance(p, int | float) and p > 0
    p = op.arg(1, "p", 0.5)
    active = op.arg(2, "training", True)
    return bool(active) and isinstance(p, int | float) and p > 0


#: Views that take a part of their input (slicing, an index, ``select``, ``narrow``).
PART_VIEWS = frozenset({"getitem", "select", "narrow", "slice"})
#: Views that split their input into parts, each an output.
SPLIT_VIEWS = frozenset({"chunk", "split", "split_with_sizes", "tensor_split", "unbind"})


def _part_gradient_bytes(op: OpSpec) -> float:
    """The bytes the backward pass of a view that takes part of its floating input
    moves: the input's whole gradient written, zeros where no part was taken, and each
    part's gradient read (and, for one part, copied into its place: ``select_backward``,
    ``slice_backward``); 0 for a view of the whole input (``x[None]``, ``view``,
    ``permute``), whose gradient is a view of the output's."""
    if not op.inputs or not is_float(str(op.inputs[0].get("dtype", ""))):
        return 0.0
    whole, part = op.nbytes(op.inputs[0]), op.float_out_bytes
    if op.name in SPLIT_VIEWS and len(op.outputs) > 1:
        return whole + part
    if op.name in PART_VIEWS and op.out_numel < numel(op.shape(0)):
        return whole + 2.0 * part
    return 0.0


def _has_index_tensor(op: OpSpec) -> bool:
    """``x[idx]`` with a tensor in the index: a gather, not a view."""
    return "__tensor__" in json.dumps(op.spec.get("args", [])[1:])


def view_strides(
    shape: Sequence[int], stride: Sequence[int], new_shape: Sequence[int]
) -> list[int] | None:
    """The strides of ``new_shape`` as a view of a tensor of ``shape`` and ``stride``, or
    None where no view gives it (PyTorch's ``computeStride``: ``reshape`` and ``flatten``
    then copy, ``view`` fails). Dimensions merge only where their strides are contiguous
    with each other."""
    if math.prod(shape) == 0:
        return [0] * len(new_shape)
    if not shape:
        return [1] * len(new_shape)
    new_stride = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = stride[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and stride[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_stride[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = stride[d - 1]
                tensor_numel = view_numel = 1
    return new_stride if view_d == -1 else None


def _reshape_copies(op: OpSpec) -> bool:
    """``reshape`` or ``flatten`` of an input whose recorded strides admit no view of the
    output's shape: PyTorch copies it into a new tensor (an input recorded without
    strides is contiguous, and is viewed)."""
    if op.name not in ("reshape", "flatten") or not op.inputs or not op.outputs:
        return False
    x = op.inputs[0]
    if not x.get("stride"):
        return False
    return view_strides(x["shape"], x["stride"], op.outputs[0]["shape"]) is None


def _forward_and_backward(op: OpSpec, family: str, training: bool) -> Work:
    """Work of one step (see the module docstring)."""
    x, o = op.float_in_bytes, op.float_out_bytes
    io = op.in_bytes + op.out_bytes
    saved = 0.0
    n_params = 0.0
    extra = 0.0  # further forward bytes (intermediates, indices, masks)
    if family == "view":
        if op.name == "getitem" and _has_index_tensor(op):  # a gather: index read, output
            return Work(0.0, op.in_bytes - op.nbytes(op.inputs[0]) + 2.0 * op.out_bytes)
        if _reshape_copies(op):  # read and written once; its backward is a view
            return Work(0.0, 2.0 * op.out_bytes)
        return Work(0.0, _part_gradient_bytes(op) if training else 0.0)
    if family in COMPUTE_FAMILIES:
        if family == "conv":
            flops, n_params = conv_flops_params(op)
        elif family == "linear":
            flops, n_params = linear_flops_params(op)
        elif family == "matmul":
            flops = _matmul(op)
        elif op.name == "multiheadattention":
            flops, n_params, extra = _mha(op)
        else:
            flops = _sdpa(op)
        fwd_bytes = io + op.param_bytes(n_params) + extra
        return Work(3 * flops, 3 * fwd_bytes) if training else Work(flops, fwd_bytes)
    in_numel, out_numel = op.in_numel, op.out_numel
    if family == "norm":
        flops, n_params, saved = 5.0 * in_numel, _norm_params(op), x
    elif family == "activation":
        flops, saved = 1.0 * out_numel, x
    elif family == "softmax":
        flops, saved = 5.0 * in_numel, o
    elif family == "pool":
        if "adaptive" in op.name:
            flops = float(in_numel)
        else:
            flops = float(numel(op.out_shape()) * _pool_kernel(op))
        if "max" in op.name:
            indices = numel(op.out_shape()) * _INDEX_BYTES
            if len(op.outputs) == 1:  # written on the GPU even when not returned
                extra += indices
            saved = indices
    elif family == "elementwise":
        if op.name in {"stochasticdepth", "stochastic_depth"}:
            if op.kind == "module":
                active = training and bool(op.attrs.get("p"))
            else:  # stochastic_depth(input, p, mode, training=True)
                active = bool(op.arg(3, "training", True)) and bool(op.arg(1, "p"))
            if not active:
                return Work(0.0, 0.0)
        if op.name in {"mean", "sum"}:
            flops = float(in_numel)
        else:
            flops = float(numel(op.out_shape())) if op.outputs else float(in_numel)
        if op.name in {"mul", "div", "truediv"}:
            saved = x
    elif family == "dropout":
        if not _active_dropout(op, training):
            return Work(0.0, 0.0)
        flops = 2.0 * in_numel
        mask = float(numel(op.shape(0)))  # bool, 1 byte per element
        extra, saved = mask, mask
    elif family in {"cat", "copy"}:
        flops = 0.0
        if family == "copy" and _copy_is_identity(op):
            return Work(0.0, 0.0)
        if op.name == "copy":  # dst.copy_(src): src read, dst written
            io = sum(op.nbytes(t) for t in op.inputs[1:]) + op.out_bytes
        if op.name == "setitem":
            return _set_part_work(op, training)
    else:  # other
        flops = float(max(in_numel, out_numel))
    w = op.param_bytes(n_params)
    fwd = io + w + extra
    rows = _norm_rows(op) if family == "norm" else 0.0
    if not training:
        return Work(flops, fwd, rows)
    return Work(2.0 * flops, fwd + o + x + 2.0 * w + saved, 2.0 * rows)


#: Norms that reduce each row of their normalised size apart (reduced names).
ROW_NORMS = frozenset({"layernorm", "layer_norm", "layernorm2d", "rmsnorm", "rms_norm"})


def _norm_rows(op: OpSpec) -> float:
    """The rows a layer norm reduces: its input's elements over its normalised size (the
    module's ``normalized_shape``, or ``F.layer_norm``'s argument); 0 for other norms."""
    if op.name not in ROW_NORMS:
        return 0.0
    if op.kind == "module":
        shape = op.attrs.get("normalized_shape")
    else:
        shape = op.arg(1, "normalized_shape")
    size = numel(int_list(shape, 1)) if shape is not None else 0
    return float(numel(op.shape(0)) // size) if size > 0 else 0.0


def _set_part_work(op: OpSpec, training: bool) -> Work:
    """``x[index] = value``: the part of ``x`` written (the spec's output, ``x[index]``)
    and the value and index tensors read; in training, where the value is a floating
    tensor, its gradient: the output gradient's part read and the value's gradient
    written. A scalar value has no backward pass."""
    values = op.inputs[1:]
    fwd = sum(op.nbytes(t) for t in values) + op.out_bytes
    if not training:
        return Work(0.0, fwd)
    grads = sum(op.nbytes(t) for t in values if is_float(str(t.get("dtype", ""))))
    return Work(0.0, fwd + (op.float_out_bytes + grads if grads else 0.0))


def _copy_is_identity(op: OpSpec) -> bool:
    """``contiguous`` of a contiguous tensor, ``to`` changing neither dtype nor layout."""
    if not op.inputs or not op.outputs:
        return True
    src, dst = op.inputs[0], op.outputs[0]
    if op.name == "contiguous":
        fmt = json.dumps(op.spec.get("args", [])[1:]) + json.dumps(op.spec.get("kwargs", {}))
        return "stride" not in src and "channels_last" not in fmt
    if op.name == "to":
        call = json.dumps(op.spec.get("args", [])[1:]) + json.dumps(op.spec.get("kwargs", {}))
        same_dtype = src["dtype"] == dst["dtype"] or (
            op.dtype is not None and is_float(src["dtype"]) and is_float(dst["dtype"])
        )
        return same_dtype and "__memory_format__" not in call and '"copy": true' not in call
    return False


def op_work(spec: dict[str, Any], mode: str, dtype: str | None = None) -> Work:
    """FLOPs and DRAM bytes of one step of an op in ``mode`` (see the module docstring).

    Args:
        spec: the op's spec (:mod:`opcost.spec` format).
        mode: ``"inference"`` (forward) or ``"training"`` (forward and backward).
        dtype: the floating dtype the op runs in (the harness casts floating inputs and
            parameters to it); None: the spec's own dtypes.
    """
    if mode not in MODES:
        raise RooflineError(f"unknown mode {mode!r}; expected one of {list(MODES)}")
    op_type = spec.get("type", "?") if isinstance(spec, dict) else "?"
    try:
        op = OpSpec(spec, dtype)
        return _forward_and_backward(op, family_of(op.type), mode == "training")
    except RooflineError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise RooflineError(
            f"cannot count the work of {op_type}: its spec lacks or garbles {e}; "
            "extract it again (opcost.spec format)"
        ) from None


# -- peaks and times ------------------------------------------------------------------


@dataclass(frozen=True)
class Peaks:
    """A GPU's achievable rates: matrix-product FLOP/s, DRAM bytes/s and, where known, the
    rows a layer norm reduces a second (``math.inf``: no bound; module docstring,
    "Rows")."""

    matmul_flops_per_s: float
    memory_bytes_per_s: float
    rows_per_s: float = math.inf

    def to_dict(self) -> dict[str, float]:
        out = {
            "matmul_flops_per_s": self.matmul_flops_per_s,
            "memory_bytes_per_s": self.memory_bytes_per_s,
        }
        if math.isfinite(self.rows_per_s):
            out["rows_per_s"] = self.rows_per_s
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Peaks:
        """From :meth:`to_dict` or :func:`opcost.peaks.measure_peaks` (other keys ignored;
        ``rows_per_s`` optional)."""
        values = {}
        for key in ("matmul_flops_per_s", "memory_bytes_per_s", "rows_per_s"):
            value = d.get(key)
            if value is None and key == "rows_per_s":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise RooflineError(f"peaks: {key} missing or not a number; measure peaks again")
            if not (math.isfinite(value) and value > 0):
                raise RooflineError(f"peaks: {key} = {value!r} must be positive and finite")
            values[key] = float(value)
        return cls(**values)


def roofline_time_s(work: Work, peaks: Peaks) -> float:
    """The roofline time: ``max(flops / matmul rate, bytes / memory rate, rows / row
    rate)``, seconds."""
    return max(
        work.flops / peaks.matmul_flops_per_s,
        work.bytes / peaks.memory_bytes_per_s,
        work.rows / peaks.rows_per_s,
    )


@lru_cache(maxsize=65536)
def _cached_work(spec_json: str, mode: str, dtype: str | None) -> Work:
    return op_work(json.loads(spec_json), mode, dtype)


def roofline_times_s(
    specs: Sequence[str],
    modes: Sequence[str],
    peaks: Peaks,
    dtypes: Sequence[str | None] | None = None,
) -> np.ndarray:
    """Roofline times (s) of ops given as canonical spec JSON strings, one mode each
    (and optionally one floating dtype each); the work is cached per (spec, mode, dtype)."""
    if len(specs) != len(modes) or (dtypes is not None and len(dtypes) != len(specs)):
        raise RooflineError("roofline_times_s: specs, modes and dtypes differ in length")
    dts = dtypes if dtypes is not None else [None] * len(specs)
    works = [_cached_work(s, m, d) for s, m, d in zip(specs, modes, dts, strict=True)]
    flops = np.fromiter((w.flops for w in works), dtype=np.float64, count=len(works))
    nbytes = np.fromiter((w.bytes for w in works), dtype=np.float64, count=len(works))
    rows = np.fromiter((w.rows for w in works), dtype=np.float64, count=len(works))
    return np.maximum.reduce(
        [
            flops / peaks.matmul_flops_per_s,
            nbytes / peaks.memory_bytes_per_s,
            rows / peaks.rows_per_s,
        ]
    )


# -- shape features ---------------------------------------------------------------------
