"""Operation extraction: run one forward pass and record every operation it executes.

An *operation* is either

* the innermost module whose ``forward`` ran: a module whose forward returned without
  calling any child module's forward (so ``nn.MultiheadAttention`` is one operation even
  though it owns an ``out_proj``), unless it owns child modules, its type is of no op
  family (:func:`opcost.model.op_spec.family_of` gives ``"other"``) and it calls torch
  functions: then those calls are its operations (a network's own composite, such as
  torchvision's ``ShiftedWindowAttention``, which computes with its children's weights
  without calling them, is the linear layers, matrix products and softmax it runs; a
  module of its own without children, such as a scaling, stays one operation), or
* a *functional* operation: a torch function called directly in a non-leaf module's
  ``forward`` (residual additions, ``torch.flatten``, ``torch.cat``, functional
  activations). These are what make a network slower than the sum of its layers.

The forward pass runs on the ``meta`` device: shapes propagate, nothing is computed or
allocated, so ``convnext_base`` at batch 32 extracts in seconds on a small CPU. A model
that cannot run on ``meta`` falls back to the CPU.

Functional calls are seen through a :class:`torch.overrides.TorchFunctionMode`, which sees
only the outermost torch call (calls made inside a handled call are not re-entered).
Module calls are seen through forward hooks on every submodule.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch.overrides import TorchFunctionMode, resolve_name

from opcost import spec as specs
from opcost.errors import OpcostError
from opcost.model import grad_sums
from opcost.model.op_spec import family_of
from opcost.names import ModelInput
from opcost.networks import build_for_extraction, build_model
from opcost.schemas import OPS, UNIQUE_OPS

#: Torch calls that read metadata or convert to Python and launch no work.
_METADATA = re.compile(
    r"(__get__|\.(size|dim|numel|stride|is_contiguous|data_ptr|element_size|__len__|__bool__"
    r"|__index__|__int__|__float__|__format__|__repr__|item|tolist|type|is_floating_point"
    r"|is_complex|requires_grad_|get_device|storage_offset|untyped_storage|nelement"
    r"|__hash__|__eq__|__ne__|__contains__|_is_view|is_set_to|__iter__|unbind_copy)$)"
)


class ExtractionError(OpcostError, RuntimeError):
    """A model-input set could not be extracted; the message names it."""


@dataclass
class _Frame:
    module: torch.nn.Module
    args: tuple
    kwargs: dict
    index: int
    called_child: bool = False
    pending: list[tuple[int, dict[str, Any]]] = field(default_factory=list)


class _Recorder(TorchFunctionMode):
    """Collects op specs while a model runs one forward pass."""

    def __init__(self, functional_ops: bool) -> None:
        super().__init__()
        self.functional_ops = functional_ops
        self.stack: list[_Frame] = []
        #: (call index, spec): the index counts module and function calls as they start.
        self.found: list[tuple[int, dict[str, Any]]] = []
        self.skipped: Counter[str] = Counter()
        self.calls = 0
        #: With gradients on (:func:`gradient_sums`): each tensor's autograd node and output
        #: number -> (the index of the torch call that made it, its bytes).
        self.produced: dict[tuple[Any, int], tuple[int, int]] | None = None
        #: With gradients on: the calls (by index) none of whose outputs needs a gradient.
        self.no_gradient: set[int] = set()

    @property
    def specs(self) -> list[dict[str, Any]]:
        """The specs in call order: an op runs where its call started."""
        return [spec for _, spec in sorted(self.found, key=lambda item: item[0])]

    def _next_index(self) -> int:
        self.calls += 1
        return self.calls - 1

    # -- module hooks -----------------------------------------------------------------
    def pre_hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if self.stack:
            self.stack[-1].called_child = True
        self.stack.append(_Frame(module, args, kwargs, self._next_index()))

    def post_hook(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        frame = self.stack.pop()
        if frame.module is not module:  # pragma: no cover - would be a torch bug
            raise ExtractionError("module call stack out of order")
        if self.produced is not None and not any(t.requires_grad for t in specs.tensors_in(output)):
            self.no_gradient.add(frame.index)
        cls = type(module)
        if frame.called_child or (frame.pending and is_composite(module)):
            self.found.extend(frame.pending)
            return
        spec = specs.make_spec(
            "module",
            specs.qualified_name(cls),
            frame.args,
            frame.kwargs,
            output,
            attrs=specs.module_attrs(module),
        )
        if spec is None:
            self.skipped[specs.qualified_name(cls)] += 1
        else:
            self.found.append((frame.index, spec))

    # -- functional calls ---------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        index = self._next_index()
        result = _with_conv_memory_format(func, args, func(*args, **kwargs))
        written = specs.call_output(func, args, result)
        if self.produced is not None:
            # An in-place write (x[index] = value) changes x's autograd node: x is its output.
            outputs = specs.tensors_in(args[0] if written is not result else result)
            for t in outputs:
                if t.grad_fn is not None:
                    self.produced[(t.grad_fn, t.output_nr)] = (index, t.numel() * t.element_size())
            if not any(t.requires_grad for t in outputs):
                self.no_gradient.add(index)
        if self.functional_ops and self.stack:
            name = kept_call_name(func, written)
            if name is not None:
                spec = specs.make_spec("function", name, args, kwargs, written)
                if spec is None:
                    self.skipped[name] += 1
                else:
                    self.stack[-1].pending.append((index, spec))
        return result


def function_spec(fn: Any, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The spec extraction records for ``fn(*args, **kwargs)`` called in a module's
    forward pass: the torch call as PyTorch hands it to the recorder (a function such as
    ``F.pad`` passes its defaults by name), or None where the recorder keeps no spec of it
    (a call that reads metadata, an argument without a JSON form)."""
    recorder = _Recorder(functional_ops=True)
    recorder.stack.append(_Frame(torch.nn.Module(), (), {}, recorder._next_index()))
    with torch.no_grad(), recorder:
        fn(*args, **kwargs)
    pending = recorder.stack[-1].pending
    return pending[0][1] if len(pending) == 1 else None


def is_composite(module: torch.nn.Module) -> bool:
    """Whether a module that called none of its children is the calls it made rather than
    an operation: it owns child modules (it computes with their parameters without calling
    them) and its type is of no op family (:func:`opcost.model.op_spec.family_of`), as
    torchvision's ``ShiftedWindowAttention``; ``nn.MultiheadAttention`` is an attention."""
    return family_of(specs.qualified_name(type(module))) == "other" and any(
        True for _ in module.children()
    )


#: Convolutions: on CPU and CUDA their output takes the memory format of their input
#: (cuDNN and oneDNN run channels-last convolutions channels-last); on ``meta`` it is
#: always contiguous.
_CONVOLUTIONS = {
    torch.conv1d,
    torch.conv2d,
    torch.conv3d,
    torch.conv_transpose1d,
    torch.conv_transpose2d,
    torch.conv_transpose3d,
    torch.convolution,
}


def _with_conv_memory_format(func: Any, args: tuple, result: Any) -> Any:
    """A convolution's output on ``meta`` in the memory format CPU and CUDA give it, so that
    the ops after it are recorded with the strides they see on a GPU (convnext's blocks
    run channels-last from their first permute on)."""
    if (
        func in _CONVOLUTIONS
        and isinstance(result, torch.Tensor)
        and result.device.type == "meta"
        and args
        and isinstance(args[0], torch.Tensor)
        and result.dim() == args[0].dim()
        and result.dim() in (4, 5)
    ):
        fmt = torch.channels_last if result.dim() == 4 else torch.channels_last_3d
        if args[0].is_contiguous(memory_format=fmt) and not args[0].is_contiguous():
            return result.contiguous(memory_format=fmt)
    return result


def kept_call_name(func: Any, written: Any) -> str | None:
    """The name of a torch call that wrote ``written`` (its output, or the part of a
    tensor it wrote into: :func:`opcost.spec.call_output`), where extraction keeps the
    call as an op; None for a call that reads metadata or writes no tensor."""
    name = resolve_name(func)
    if name is None or _METADATA.search(name) or not _has_tensor(written):
        return None
    return name


def _has_tensor(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, list | tuple):
        return any(_has_tensor(i) for i in x)
    return False


def extract_ops(
    net: torch.nn.Module,
    shape: tuple[int, ...],
    *,
    functional_ops: bool = True,
    device: str = "meta",
) -> list[dict[str, Any]]:
    """Specs of every operation executed by one forward pass, in execution order.

    The network runs in ``eval()`` mode: training-only branches (e.g. auxiliary
    classifiers) are not part of the operation set.
    """
    recorder = _Recorder(functional_ops)
    with torch.no_grad():
        _record(net, shape, device, recorder)
    return recorder.specs


def _record(net: torch.nn.Module, shape: tuple[int, ...], device: str, recorder: _Recorder) -> Any:
    """One forward pass of ``net`` in ``eval()`` mode on an input of ``shape``, seen by
    ``recorder``; its output."""
    net = net.to(device).eval()
    handles = []
    for module in net.modules():
        handles.append(module.register_forward_pre_hook(recorder.pre_hook, with_kwargs=True))
        handles.append(module.register_forward_hook(recorder.post_hook, with_kwargs=True))
    x = torch.empty(shape, device=device) if device == "meta" else torch.randn(shape, device=device)
    try:
        with recorder:
            return net(x)
    finally:
        for h in handles:
            h.remove()


def gradient_sums(
    net: torch.nn.Module,
    shape: tuple[int, ...],
    *,
    functional_ops: bool = True,
    device: str = "meta",
) -> list[tuple[str, int, int, int]]:
    """Per operation :func:`extract_ops` records, in call order: ``(op_id, adds, bytes,
    backward)``, the gradient sums autograd runs in a training step's backward pass for
    the tensors the call makes (:mod:`opcost.model.grad_sums`): where ``k`` gradients of a
    tensor meet (``k`` calls take it, or it is the output), ``k - 1`` adds of its bytes;
    and whether the call runs a backward pass at all (0 where none of its outputs needs a
    gradient: a mask built from the input's shape, an index).

    The forward pass runs as :func:`extract_ops`' with gradients on (the parameters need
    them, the input does not), and each sum goes to the recorded call in whose span the
    tensor was made (a module's inner calls to the module); the autograd graph is walked
    from the output."""
    recorder = _Recorder(functional_ops)
    recorder.produced = {}
    with torch.enable_grad():
        out = _record(net, shape, device, recorder)
    roots = [t for t in specs.tensors_in(out) if t.grad_fn is not None]
    taken: Counter[tuple[Any, int]] = Counter((t.grad_fn, t.output_nr) for t in roots)
    seen, stack = set(), [t.grad_fn for t in roots]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        for following, number in node.next_functions:
            if following is not None:
                taken[(following, number)] += 1
                stack.append(following)
    found = sorted(recorder.found, key=lambda item: item[0])
    starts = [index for index, _ in found]
    adds, nbytes = [0] * len(found), [0] * len(found)
    for key, k in taken.items():
        made = recorder.produced.get(key)
        position = bisect.bisect_right(starts, made[0]) - 1 if made and k > 1 else -1
        if position >= 0:
            adds[position] += k - 1
            nbytes[position] += (k - 1) * made[1]
    return [
        (specs.op_id(spec), a, b, int(index not in recorder.no_gradient))
        for (index, spec), a, b in zip(found, adds, nbytes, strict=True)
    ]


def extract_model_input(mi: ModelInput, *, functional_ops: bool = True) -> pd.DataFrame:
    """The operations of one model-input set: one row per distinct op with its count.

    Columns: ``model_input``, ``op_id``, ``kind``, ``type``, ``spec`` (canonical JSON),
    ``count`` (how often the op runs in one forward pass).
    """
    if len(mi.shape) < 1 or any(int(d) <= 0 for d in mi.shape):
        raise ExtractionError(f"model-input set {mi.name}: input shape {mi.shape} is malformed")
    return ops_table(mi.name, _run_network(mi, extract_ops, functional_ops))


def with_gradient_sums(
    table: pd.DataFrame, mi: ModelInput, *, functional_ops: bool = True
) -> pd.DataFrame:
    """``table`` (the op table of ``mi``, :func:`extract_model_input`) with
    :data:`opcost.model.grad_sums.COLUMNS`: each op's gradient sums per call and the share
    of its calls that run a backward pass (:func:`gradient_sums`, averaged over its
    calls); 0 sums and a share of 1 for an op the pass with gradients did not record.

    Raises:
        ExtractionError: the network's forward pass fails with gradients on.
    """
    found = _run_network(mi, gradient_sums, functional_ops)
    sums = pd.DataFrame(found, columns=["op_id", *grad_sums.COLUMNS])
    per_op = sums.groupby("op_id")[list(grad_sums.COLUMNS)].mean()
    out = table.drop(columns=[c for c in grad_sums.COLUMNS if c in table])
    for column, unseen in zip(grad_sums.COLUMNS, (0.0, 0.0, 1.0), strict=True):
        out[column] = out["op_id"].map(per_op[column]).fillna(unseen).astype("float64")
    return out


def _run_network(mi: ModelInput, run: Any, functional_ops: bool) -> Any:
    """``run(net, shape, functional_ops=..., device="meta")`` of ``mi``'s network built on
    the ``meta`` device (:func:`extract_ops`, :func:`gradient_sums`), or, where ``meta``
    cannot run it (an op without a meta kernel, ``.item()``), of the network built on the
    CPU.

    Raises:
        ExtractionError: the network cannot be built or its forward pass fails (a wrong
            shape fails on ``meta``, before the CPU would allocate the real input),
            naming the model-input set.
    """
    try:
        net = build_for_extraction(mi.model)
    except ValueError as e:
        raise ExtractionError(f"model-input set {mi.name}: {e}") from e
    try:
        return run(net, mi.shape, functional_ops=functional_ops, device="meta")
    except (NotImplementedError, RuntimeError) as meta_error:
        if not _meta_unsupported(meta_error):
            raise ExtractionError(
                f"model-input set {mi.name}: forward pass failed: {meta_error}"
            ) from meta_error
        try:
            return run(build_model(mi.model), mi.shape, functional_ops=functional_ops, device="cpu")
        except Exception as e:
            raise ExtractionError(
                f"model-input set {mi.name}: forward pass failed ({e}); "
                f"on the meta device: {meta_error}"
            ) from e
    except Exception as e:
        raise ExtractionError(f"model-input set {mi.name}: forward pass failed: {e}") from e


def _meta_unsupported(error: BaseException) -> bool:
    """Whether a forward pass failed on ``meta`` because it needs real data (an op
    without a meta kernel, ``.item()``), not because the input does not fit the network."""
    return isinstance(error, NotImplementedError) or "meta" in str(error).lower()


def ops_table(model_input: str, found: list[dict[str, Any]]) -> pd.DataFrame:
    """Merge identical specs, count them and keep where they run (``found`` in call order;
    columns: :data:`opcost.schemas.OPS`)."""
    rows: dict[str, dict[str, Any]] = {}
    counts: Counter[str] = Counter()
    positions: dict[str, list[str]] = {}
    for position, spec in enumerate(found):
        text = specs.canonical_json(spec)
        oid = specs.op_id(spec)
        counts[oid] += 1
        positions.setdefault(oid, []).append(str(position))
        rows.setdefault(
            oid,
            {
                "model_input": model_input,
                "op_id": oid,
                "kind": spec["kind"],
                "type": spec["type"],
                "spec": text,
            },
        )
    table = pd.DataFrame(
        list(rows.values()), columns=[c for c in OPS.names if c not in ("count", "positions")]
    )
    table["count"] = table["op_id"].map(counts).astype("int64")
    table["positions"] = table["op_id"].map(lambda oid: ",".join(positions[oid])).astype(str)
    return table[list(OPS.names)]


def unique_ops(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Every distinct operation of a study, with the networks it occurs in.

    Columns: :data:`opcost.schemas.UNIQUE_OPS` (``networks`` comma-separated).
    """
    if not tables:
        return pd.DataFrame(columns=list(UNIQUE_OPS.names))
    allops = pd.concat(tables, ignore_index=True)
    networks = allops.groupby("op_id")["model_input"].agg(lambda s: ",".join(sorted(set(s))))
    first = allops.drop_duplicates("op_id").set_index("op_id")[["kind", "type", "spec"]]
    out = first.join(networks.rename("networks")).reset_index()
    return out.sort_values("op_id", ignore_index=True)[list(UNIQUE_OPS.names)]
