"""Which networks a study config may name: torchvision's registered models, found without
importing torch, and ``package.module:factory`` import paths (:mod:`opcost.config`)."""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path


@cache
def torchvision_model_names() -> frozenset[str]:
    """The names torchvision registers (``@register_model``), read from its source files
    without importing it (and torch): what ``torchvision.models.list_models()`` returns.
    Empty where torchvision is not installed or its source cannot be read."""
    found = importlib.util.find_spec("torchvision")
    if found is None or found.origin is None:
        return frozenset()
    names: set[str] = set()
    for path in sorted((Path(found.origin).parent / "models").rglob("*.py")):
        try:
            text = path.read_text()
            tree = ast.parse(text) if "register_model(" in text else None
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.FunctionDef):
                names.update(_registered_name(d, node.name) for d in node.decorator_list)
    return frozenset(names - {None})


def _registered_name(decorator: ast.expr, function: str) -> str | None:
    """The name ``@register_model()`` or ``@register_model(name=...)`` registers."""
    if not isinstance(decorator, ast.Call):
        return None
    callee = decorator.func
    if getattr(callee, "id", getattr(callee, "attr", None)) != "register_model":
        return None
    given = [k.value for k in decorator.keywords if k.arg == "name"] + decorator.args[:1]
    if not given:
        return function
    return given[0].value if isinstance(given[0], ast.Constant) else None


def is_torchvision_model(model: str) -> bool:
    """Whether torchvision knows ``model``; imports torchvision only for a name its source
    does not register (to be sure before refusing it)."""
    if model in torchvision_model_names():
        return True
    import torchvision

    return model in torchvision.models.list_models()


@cache
def factory_problem(model: str) -> str | None:
    """Why the import path ``model`` is not a network factory
    (:func:`opcost.networks.check_factory`), or None; each path is checked once per
    process."""
    from opcost.networks import check_factory

    try:
        check_factory(model)
    except ValueError as e:
        return str(e)
    return None
