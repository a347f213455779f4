"""Each op call of a network annotated in a profiler trace, as :mod:`opcost.extract` finds it.

A :class:`CallAnnotator` wraps every call extraction counts as an op (leaf modules, torch
calls made directly in a non-leaf module's ``forward`` or in a composite's, a write into
part of a tensor as the part it writes) in a profiler range
``opcost.call#<k>``, so that :mod:`opcost.kineto` can cut a traced step into one host span
per call and map each span to its op id (used by :mod:`opcost.tracing`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from opcost import harness, kineto
from opcost import spec as specs
from opcost.extract import is_composite, kept_call_name


class _Range:
    """A profiler annotation opened and closed by hand (module hooks)."""

    def __init__(self, name: str) -> None:
        self.rf = torch.autograd.profiler.record_function(name)
        self.rf.__enter__()

    def close(self) -> None:
        self.rf.__exit__(None, None, None)


class CallAnnotator(TorchFunctionMode):
    """Annotates each op call of a network the way :mod:`opcost.extract` finds ops.

    ``learn()`` runs one forward pass to learn which modules are leaves (returned without
    calling a child, unless a composite of no op family that made torch calls, whose
    calls extraction records instead: :func:`opcost.extract.is_composite`); while active
    afterwards, each leaf module call and each torch call made directly in a non-leaf
    module's ``forward`` is wrapped in ``opcost.call#<k>``,
    ``k`` counting calls in the order extraction gives them positions. ``calls`` maps
    ``k`` to the op id of the op that ran there (calls extraction drops map to None).
    """

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net
        self.leaves: set[int] = set()
        self.learning = False
        self.stack: list[list[Any]] = []  # [module, called_child, range, made_calls]
        self.calls: dict[int, str | None] = {}
        self.counter = 0
        self._busy = False

    @contextlib.contextmanager
    def active(self, learning: bool = False) -> Iterator[None]:
        self.learning = learning
        self.counter = 0
        handles = []
        for module in self.net.modules():
            handles.append(module.register_forward_pre_hook(self._pre, with_kwargs=True))
            handles.append(module.register_forward_hook(self._post, with_kwargs=True))
        try:
            with self:
                yield
        finally:
            for h in handles:
                h.remove()

    def _open(self) -> tuple[int, _Range]:
        self._busy = True
        try:
            k = self.counter
            self.counter += 1
            return k, _Range(f"{kineto.CALL_PREFIX}{k}")
        finally:
            self._busy = False

    def _pre(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if self.stack:
            self.stack[-1][1] = True
        opened = None if self.learning or id(module) not in self.leaves else self._open()
        self.stack.append([module, False, opened, False])

    def _post(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        module_, called_child, opened, made_calls = self.stack.pop()
        if self.learning:
            if not called_child and not (made_calls and is_composite(module_)):
                self.leaves.add(id(module_))
            return
        if opened is None:
            return
        k, rng = opened
        self._busy = True
        try:
            rng.close()
            spec = specs.make_spec(
                "module",
                specs.qualified_name(type(module)),
                args,
                kwargs,
                output,
                attrs=specs.module_attrs(module),
            )
            self.calls[k] = specs.op_id(spec) if spec is not None else None
        finally:
            self._busy = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.learning and self.stack and not self._busy:
            result = func(*args, **kwargs)
            self.stack[-1][3] |= _spec_of(func, args, kwargs, result) is not None
            return result
        if self._busy or self.learning or not self.stack or id(self.stack[-1][0]) in self.leaves:
            return func(*args, **kwargs)
        k, rng = self._open()
        try:
            result = func(*args, **kwargs)
        finally:
            self._busy = True
            rng.close()
            self._busy = False
        spec = _spec_of(func, args, kwargs, result)
        self.calls[k] = specs.op_id(spec) if spec is not None else None
        return result


def _spec_of(func: Any, args: tuple, kwargs: dict, result: Any) -> dict[str, Any] | None:
    """The spec extraction records of the torch call ``func(*args, **kwargs)`` that
    returned ``result`` (a write into part of a tensor: with the part it wrote as its
    output), or None where it keeps none."""
    written = specs.call_output(func, args, result)
    name = kept_call_name(func, written)
    return None if name is None else specs.make_spec("function", name, args, kwargs, written)


def learn_calls(workload: harness.Workload, net: torch.nn.Module) -> CallAnnotator:
    """A :class:`CallAnnotator` for ``net`` that has learnt its leaves from one step."""
    annotator = CallAnnotator(net)
    with workload.context(), annotator.active(learning=True):
        if workload.forward_pass is not None:
            workload.backward_pass(workload.forward_pass())
        else:
            workload.step()
    return annotator
