"""Networks by name: a torchvision model, or a user's ``package.module:factory``, checked
before it is called and built for extraction (on the ``meta`` device) or for measuring."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import re
import sys
import types
import typing
from collections.abc import Iterator
from typing import Any

import torch

_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def resolve_factory(model: str) -> Any:
    """The factory an import path ``package.module:factory`` names, checked without calling it.

    Importing the module runs its code, as any code a study names (README). A factory is
    a ``torch.nn.Module`` subclass, or a callable that takes no required argument and is
    not declared to return something else. Refused, with a ``ValueError`` naming the
    path: anything from the Python standard library (``os:system``, ``builtins:eval``,
    ``subprocess:run``: it builds no network, and calling it could do harm), a path that
    does not resolve, an attribute that is not callable, a callable that needs arguments,
    and one whose return annotation names only classes that are not ``torch.nn.Module``.
    """
    if not _IMPORT_PATH.fullmatch(model):
        raise ValueError(f"{model!r} is not an import path of the form package.module:factory")
    module_name, name = model.split(":")
    if module_name.split(".")[0] in sys.stdlib_module_names:
        raise ValueError(
            f"{model!r} is from the Python standard library, which builds no torch.nn.Module; "
            "name a factory of your own package"
        )
    try:
        obj = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"import path {model!r} does not resolve: {e}") from e
    if inspect.isclass(obj) and not issubclass(obj, torch.nn.Module):
        raise ValueError(f"{model!r} is the class {obj.__name__}, not a torch.nn.Module")
    if not callable(obj):
        raise ValueError(
            f"{model!r} is not callable (a {type(obj).__name__}); a factory is a callable "
            "that returns a torch.nn.Module"
        )
    try:
        signature = inspect.signature(obj)
        signature.bind()
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{model!r} cannot be called without arguments ({e}); a factory takes none"
        ) from e
    if _declared_module(obj) is False:
        declared = _return_annotation(obj)
        raise ValueError(
            f"{model!r} is declared to return {getattr(declared, '__name__', declared)}, "
            "not a torch.nn.Module"
        )
    return obj


def _return_annotation(obj: Any) -> Any:
    """What ``obj`` returns, as declared: the class itself, or the return annotation
    (evaluated where written as a string); ``inspect.Signature.empty`` if undeclared."""
    if inspect.isclass(obj):
        return obj
    try:
        return inspect.signature(obj, eval_str=True).return_annotation
    except Exception:  # an annotation naming what its module does not define
        return inspect.signature(obj).return_annotation


def _declared_module(obj: Any) -> bool | None:
    """Whether ``obj`` is declared to return a ``torch.nn.Module``: ``True`` or ``False``
    when its return annotation names classes (one class, or a union of them), ``None``
    when it names none (no annotation, an unresolved string, another typing construct)."""
    annotation = _return_annotation(obj)
    if annotation is inspect.Signature.empty:
        return None
    members = typing.get_args(annotation) if typing.get_origin(annotation) in _UNIONS else ()
    classes = [c for c in (members or (annotation,)) if inspect.isclass(c)]
    if not classes:
        return None
    return any(issubclass(c, torch.nn.Module) for c in classes)


_UNIONS = (typing.Union, types.UnionType)


def build_model(model: str) -> torch.nn.Module:
    """A torchvision model by name (no weights), or a user's ``package.module:factory``
    (checked by :func:`resolve_factory` before it is called)."""
    if ":" in model:
        net = resolve_factory(model)()
        if not isinstance(net, torch.nn.Module):
            raise ValueError(f"{model!r} returned {type(net).__name__}, not a torch.nn.Module")
        return net
    import torchvision

    if model not in torchvision.models.list_models():
        raise ValueError(
            f"unknown model {model!r}: not a torchvision model "
            "(see torchvision.models.list_models()) nor an import path package.module:factory"
        )
    return torchvision.models.get_model(model, weights=None)


def check_factory(model: str) -> None:
    """Check, at config load, that ``package.module:factory`` builds a ``torch.nn.Module``.

    A factory declared to return one (a ``torch.nn.Module`` subclass, or a function
    annotated ``-> torch.nn.Module`` or a subclass) is not called. Any other that
    :func:`resolve_factory` accepts is built as extraction builds it (on the ``meta``
    device, where parameters are never allocated) and its result checked. Raises
    ``ValueError`` naming the path.
    """
    factory = resolve_factory(model)
    if _declared_module(factory):
        return
    try:
        build_for_extraction(model)
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(
            f"{model!r} failed when called with no arguments: {type(e).__name__}: {e}"
        ) from e


def build_for_extraction(model: str) -> torch.nn.Module:
    """The network, built on the ``meta`` device, or on the CPU without weight
    initialisation where its builder computes with tensors (regnet's widths)."""
    try:
        # Built under the meta device, parameters are never allocated or initialised.
        with torch.device("meta"):
            return build_model(model)
    except (NotImplementedError, RuntimeError):
        with _no_weight_init():
            return build_model(model)


@contextlib.contextmanager
def _no_weight_init() -> Iterator[None]:
    """Make ``torch.nn.init``'s in-place initialisers no-ops (shapes stay, values don't)."""
    names = [n for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, fn in saved.items():
            setattr(torch.nn.init, n, fn)
