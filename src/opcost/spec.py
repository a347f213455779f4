"""Operation specs: the canonical JSON that identifies an operation and rebuilds it.

A spec is a JSON object (see ``docs/formats.md``)::

    {"kind": "module" | "function",
     "type": "torch.nn.modules.conv.Conv2d" | "torch.Tensor.__iadd__",
     "attrs": {...},                 # modules only: the settings that shape the work
     "args": [...], "kwargs": {...}, # the call, tensors replaced by {"__tensor__": i}
     "inputs": [{"shape": [...], "dtype": "float32", "param": false}, ...],
     "outputs": [{"shape": [...], "dtype": "float32"}, ...]}

``op_id`` is the first 16 hex digits of SHA-256 over the canonical JSON (sorted keys, no
whitespace, no NaN): identical across processes, machines and Python versions, because it
depends only on the JSON text.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from opcost.errors import OpcostError
from opcost.names import SPEC_VERSION as SPEC_VERSION  # defined torch-free

TENSOR = "__tensor__"
_SETITEM = "torch.Tensor.__setitem__"
_SKIP = object()

#: Constructor parameters that a module does not keep as a plain attribute, and the
#: attribute(s) whose presence (not None) says their value.
_PRESENCE_ATTRS = {
    "bias": ("bias", "in_proj_bias"),
    "add_bias_kv": ("bias_k",),
}


class SpecError(OpcostError, ValueError):
    """A spec cannot be built or rebuilt."""


def canonical_json(obj: Any) -> str:
    """JSON text with sorted keys and no whitespace: the input to ``op_id``."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def op_id(spec: dict[str, Any]) -> str:
    """Short stable hash of a spec: 16 hex digits of SHA-256 over its canonical JSON."""
    return hashlib.sha256(canonical_json(spec).encode("utf-8")).hexdigest()[:16]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise SpecError(f"unknown dtype {name!r}")
    return dtype


def encode_value(value: Any, tensors: list[torch.Tensor], mark_tuples: bool = False) -> Any:
    """Encode a call argument or attribute as JSON; tensors go to ``tensors``.

    With ``mark_tuples`` (call arguments), tuples are kept apart from lists. Returns
    ``_SKIP`` for values that have no JSON form (callables, modules, ...).
    """
    if isinstance(value, torch.Tensor):
        # One tensor passed several times stays one input: PyTorch takes other paths for
        # it (MultiheadAttention's fused self-attention needs query is key is value).
        for i, seen in enumerate(tensors):
            if seen is value:
                return {TENSOR: i}
        tensors.append(value)
        return {TENSOR: len(tensors) - 1}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, torch.dtype):
        return {"__dtype__": dtype_name(value)}
    if isinstance(value, torch.device):
        return {"__device__": True}  # rebuilt on the measuring device
    if isinstance(value, slice):
        return {
            "__slice__": [encode_value(v, tensors) for v in (value.start, value.stop, value.step)]
        }
    if value is Ellipsis:
        return {"__ellipsis__": True}
    if isinstance(value, torch.memory_format):
        return {"__memory_format__": str(value).removeprefix("torch.")}
    if isinstance(value, list | tuple | torch.Size):
        items = [encode_value(v, tensors, mark_tuples) for v in value]
        if any(i is _SKIP for i in items):
            return _SKIP
        # In a call, a tuple and a list can mean different things (x[(a, b)] vs x[[a, b]]).
        if mark_tuples and isinstance(value, tuple) and not isinstance(value, torch.Size):
            return {"__tuple__": items}
        return items
    if isinstance(value, dict):
        items = {str(k): encode_value(v, tensors, mark_tuples) for k, v in value.items()}
        return _SKIP if any(i is _SKIP for i in items.values()) else items
    return _SKIP


def decode_value(value: Any, tensors: Sequence[torch.Tensor], device: torch.device) -> Any:
    """Inverse of :func:`encode_value`: placeholders become the given tensors."""
    if isinstance(value, list):
        return [decode_value(v, tensors, device) for v in value]
    if isinstance(value, dict):
        if TENSOR in value:
            return tensors[value[TENSOR]]
        if "__float__" in value:
            return float(value["__float__"])
        if "__dtype__" in value:
            return dtype_from_name(value["__dtype__"])
        if "__device__" in value:
            return device
        if "__tuple__" in value:
            return tuple(decode_value(v, tensors, device) for v in value["__tuple__"])
        if "__slice__" in value:
            return slice(*(decode_value(v, tensors, device) for v in value["__slice__"]))
        if "__ellipsis__" in value:
            return Ellipsis
        if "__memory_format__" in value:
            return getattr(torch, value["__memory_format__"])
        return {k: decode_value(v, tensors, device) for k, v in value.items()}
    return value


def _as_tuples(value: Any) -> Any:
    """Constructor arguments: JSON lists back to the tuples modules were built with."""
    if isinstance(value, list):
        return tuple(_as_tuples(v) for v in value)
    return value


def module_attrs(module: torch.nn.Module) -> dict[str, Any]:
    """The settings of a module that shape its work, captured generically.

    Every public plain attribute (numbers, strings, booleans, tuples of them, dtypes)
    is kept, so module types nobody listed still work. Constructor parameters that the
    module keeps only as the presence of a tensor (``bias``) are added as booleans.
    """
    attrs: dict[str, Any] = {}
    for name, value in vars(module).items():
        if name.startswith("_") or name == "training":
            continue
        encoded = encode_value(value, tensors := [])
        if encoded is not _SKIP and not tensors:
            attrs[name] = encoded
    try:
        params = inspect.signature(type(module).__init__).parameters
    except (TypeError, ValueError):
        params = {}
    for name, param in params.items():
        if name in attrs or name == "self":
            continue
        for attr in _PRESENCE_ATTRS.get(name, (name,)):
            if hasattr(module, attr):
                value = getattr(module, attr)
                if value is None or isinstance(value, torch.Tensor):
                    attrs[name] = value is not None
                    break
        else:
            width = _width_from_children(module, name, param)
            if width is not None:
                attrs[name] = width
    return attrs


_WIDTH_PARAM = re.compile(r"(^|_)(dim|channels|features|width)$")


def _width_from_children(module: torch.nn.Module, name: str, param: inspect.Parameter) -> Any:
    """A required width argument the module does not keep (Swin's attention ``dim``).

    Taken from the input width of its first child layer, where the name says it is a width.
    """
    if param.default is not inspect.Parameter.empty or not _WIDTH_PARAM.search(name):
        return None
    for child in module.children():
        for attr in ("in_features", "in_channels", "embed_dim", "num_features"):
            value = getattr(child, attr, None)
            if isinstance(value, int):
                return value
    return None


def tensor_spec(t: torch.Tensor) -> dict[str, Any]:
    """Shape, dtype, whether a parameter, and the strides of a non-contiguous tensor (a
    permuted or channels-last view runs other kernels than a contiguous one). A contiguous
    tensor has no ``stride`` key, so its spec and op_id are those of earlier versions."""
    spec = {
        "shape": list(t.shape),
        "dtype": dtype_name(t.dtype),
        "param": isinstance(t, torch.nn.Parameter),
    }
    if not t.is_contiguous():
        spec["stride"] = list(t.stride())
    return spec


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor in a (possibly nested) value, in order: the value itself, the items of
    lists and tuples, the values of dicts."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in tensors_in(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors_in(item)]
    return []


def output_specs(output: Any) -> list[dict[str, Any]]:
    """Shapes and dtypes of every tensor in a (possibly nested) output."""
    return [{"shape": list(t.shape), "dtype": dtype_name(t.dtype)} for t in tensors_in(output)]


def call_output(func: Any, args: Sequence[Any], result: Any) -> Any:
    """What a call's spec records as its output: its result; for ``x[index] = value``
    (``Tensor.__setitem__``, which returns None) the part of ``x`` it writes,
    ``x[index]``, where the device can tell its shape (a boolean mask on ``meta`` cannot:
    then None, and no spec)."""
    if func is torch.Tensor.__setitem__ and len(args) >= 2 and isinstance(args[0], torch.Tensor):
        try:
            with torch.no_grad():
                return args[0][args[1]]
        except (RuntimeError, NotImplementedError, IndexError, TypeError):
            return result
    return result


def set_part(target: torch.Tensor, index: Any, value: Any) -> torch.Tensor:
    """``target[index] = value``, returning the tensor written, as :func:`rebuild` runs a
    ``Tensor.__setitem__`` spec. Where ``target`` requires a gradient (a training step
    makes every floating input require one), the value is written into a fresh
    :meth:`~torch.Tensor.detach` of it, so that autograd allows the in-place write and a
    step's graph does not grow with every call: the result then needs a gradient where the
    value does, as an activation written into a buffer does in a network."""
    out = target.detach() if target.requires_grad else target
    out[index] = value
    return out


def qualified_name(obj: Any) -> str:
    """``module.QualName`` of a class or function."""
    return f"{obj.__module__}.{obj.__qualname__}"


def resolve_name(name: str) -> Any:
    """Import the object named by a qualified name (``torch.Tensor.__iadd__``)."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        return obj
    raise SpecError(f"cannot import {name!r}")


def make_spec(
    kind: str,
    type_name: str,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    output: Any,
    attrs: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Build a spec from a recorded call; ``None`` if an argument has no JSON form."""
    tensors: list[torch.Tensor] = []
    enc_args = encode_value(list(args), tensors, mark_tuples=True)
    enc_kwargs = encode_value(dict(kwargs), tensors, mark_tuples=True)
    if enc_args is _SKIP or enc_kwargs is _SKIP:
        return None
    spec: dict[str, Any] = {
        "kind": kind,
        "type": type_name,
        "args": enc_args,
        "kwargs": enc_kwargs,
        "inputs": [tensor_spec(t) for t in tensors],
        "outputs": output_specs(output),
    }
    if kind == "module":
        spec["attrs"] = attrs or {}
    return spec


def _rebuild_module(
    spec: dict[str, Any], *, inplace_ok: bool, device: torch.device | str | None
) -> torch.nn.Module:
    cls = resolve_name(spec["type"])
    attrs = dict(spec["attrs"])
    if not inplace_ok and attrs.get("inplace") is True:
        attrs["inplace"] = False
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        params = {}
    # JSON has no tuples: a list goes back as a tuple unless the parameter is annotated as
    # a list (Swin's window_size, which its forward copies with list.copy()).
    ctor = {
        k: attrs[k] if "list" in str(params[k].annotation).lower() else _as_tuples(attrs[k])
        for k in params
        if k in attrs
    }
    try:
        # Built on the target device: initialising weights there is much faster.
        with torch.device(device) if device is not None else contextlib.nullcontext():
            module = cls(**ctor)
    except TypeError as e:
        raise SpecError(f"cannot construct {spec['type']} from its attributes: {e}") from e
    for key, value in attrs.items():
        if key in ctor or not hasattr(module, key):
            continue
        current = encode_value(getattr(module, key), tensors := [])
        if current is not _SKIP and not tensors and current != value:
            keep_list = isinstance(getattr(module, key), list)
            setattr(module, key, value if keep_list else _as_tuples(value))
    return module


#: In-place functions whose out-of-place twin is used in training mode, where autograd
#: forbids writing into a leaf that requires a gradient.
def out_of_place_name(name: str) -> str:
    head, _, last = name.rpartition(".")
    if last.startswith("__i") and last.endswith("__"):
        return f"{head}.__{last[3:]}"
    if last.endswith("_") and not last.endswith("__"):
        return f"{head}.{last[:-1]}"
    return name


def is_inplace(spec: dict[str, Any]) -> bool:
    if spec["kind"] == "module":
        return spec.get("attrs", {}).get("inplace") is True
    named = (spec.get("kwargs") or {}).get("inplace") is True  # F.relu(x, inplace=True)
    return named or out_of_place_name(spec["type"]) != spec["type"]


@dataclass
class Rebuilt:
    """An operation ready to run: ``fn(*tensors)`` runs it on the given inputs."""

    fn: Callable[..., Any]
    module: torch.nn.Module | None
    args: Any
    kwargs: Any

    def __call__(self, tensors: Sequence[torch.Tensor]) -> Any:
        device = tensors[0].device if tensors else torch.device("cpu")
        args = decode_value(self.args, tensors, device)
        kwargs = decode_value(self.kwargs, tensors, device)
        return self.fn(*args, **kwargs)


def rebuild(
    spec: dict[str, Any], *, inplace_ok: bool = True, device: torch.device | str | None = None
) -> Rebuilt:
    """Construct the operation of a spec (a fresh module with random weights, or the function).

    Args:
        spec: the op's spec.
        inplace_ok: if False (training mode), in-place variants are replaced by their
            out-of-place twins (a function's ``inplace=True`` by ``inplace=False``), since
            autograd cannot write into a leaf input.
        device: where a module's parameters are created.
    """
    if spec["kind"] == "module":
        module = _rebuild_module(spec, inplace_ok=inplace_ok, device=device)
        return Rebuilt(module, module, spec["args"], spec["kwargs"])
    if spec["kind"] == "function":
        name, kwargs = spec["type"], spec["kwargs"]
        if not inplace_ok:
            name = out_of_place_name(name)
            if kwargs.get("inplace") is True:
                kwargs = {**kwargs, "inplace": False}
        fn = set_part if name == _SETITEM else resolve_name(name)
        return Rebuilt(fn, None, spec["args"], kwargs)
    raise SpecError(f"unknown op kind {spec.get('kind')!r}")


def random_inputs(
    spec: dict[str, Any],
    device: torch.device | str = "cpu",
    float_dtype: torch.dtype | None = None,
    requires_grad: bool = False,
    generator: torch.Generator | None = None,
) -> list[torch.Tensor]:
    """Random tensors of the spec's input shapes (floating inputs cast to ``float_dtype``),
    with the recorded strides where an input was not contiguous. Integer inputs are 0 or 1,
    but those that index the rows of another input (``table[index]``), which are drawn
    over its rows, as an index spreads over the table it gathers from."""
    out = []
    for k, inp in enumerate(spec["inputs"]):
        shape, stride = inp["shape"], inp.get("stride")
        # A strided input is a view of a buffer just large enough for its strides.
        size = [_storage_numel(shape, stride)] if stride is not None else shape
        dtype = dtype_from_name(inp["dtype"])
        if dtype.is_floating_point:
            dtype = float_dtype or dtype
            t = torch.randn(size, dtype=dtype, device=device, generator=generator)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, size, device=device, generator=generator).bool()
        else:
            high = _index_rows(spec, k) or 2
            t = torch.randint(0, high, size, dtype=dtype, device=device, generator=generator)
        if stride is not None:
            t = t.as_strided(shape, stride).detach()
        if dtype.is_floating_point:
            t.requires_grad_(requires_grad)
        out.append(t)
    return out


def _index_rows(spec: dict[str, Any], k: int) -> int | None:
    """The rows input ``k`` indexes where the spec gathers ``table[index]`` or writes
    ``table[index] = value`` with it (a ``__getitem__`` or ``__setitem__`` of one tensor
    by another), else None."""
    args = spec.get("args") or []
    if (
        spec["type"].endswith(("__getitem__", "__setitem__"))
        and len(args) >= 2
        and args[1] == {"__tensor__": k}
        and isinstance(args[0], dict)
        and "__tensor__" in args[0]
    ):
        shape = spec["inputs"][args[0]["__tensor__"]]["shape"]
        return int(shape[0]) if shape else None
    return None


def _storage_numel(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Elements a buffer needs to hold a view of this shape and these strides."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
