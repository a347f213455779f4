"""What the ``opcost`` subcommands share: the error type, ``--input`` shapes, extraction
through the op cache, number formatting and progress bars."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from typing import Any

import pandas as pd

from opcost.errors import OpcostError

EXIT_ERROR = 2


DEFAULT_PREDICTORS = "results/predictors"


PREDICTORS_HELP = (
    "directory of trained predictors, one subdirectory per GPU configuration (default: "
    f"{DEFAULT_PREDICTORS} where it holds any, else those shipped with opcost)"
)


#: Extrapolated ops listed in the table output (all of them in JSON).
MAX_LISTED = 8


_SHAPE = re.compile(r"[0-9]+(?:[,x][0-9]+)*")


class CliError(OpcostError, ValueError):
    """A command-line argument is unusable; the message says what was expected."""


def parse_shape(text: str) -> tuple[int, ...]:
    """``"32,3,224,224"`` (or ``32x3x224x224``) -> ``(32, 3, 224, 224)``."""
    compact = re.sub(r"\s+", "", text)
    shape = tuple(int(p) for p in re.split(r"[,x]", compact)) if _SHAPE.fullmatch(compact) else ()
    if not shape or any(d <= 0 for d in shape):
        raise CliError(
            f"--input {text!r} is not a shape: give positive integers separated by commas, "
            "e.g. --input 32,3,224,224"
        )
    return shape


def _progress(total: int, desc: str):
    from tqdm import tqdm

    # disable=None: a bar on an interactive terminal, silence in pipes and logs.
    return tqdm(total=total, desc=desc, file=sys.stderr, disable=None, leave=False)


def _extract(args: argparse.Namespace) -> pd.DataFrame:
    """The op table of ``--model`` at ``--input``, from the op cache where it holds it."""
    from opcost.opcache import cache_dir, extract_cached

    shape = parse_shape(args.input)
    functional = not args.no_functional

    def extract() -> pd.DataFrame:
        from opcost.extract import extract_model_input
        from opcost.names import ModelInput

        return extract_model_input(ModelInput(args.model, shape), functional_ops=functional)

    directory = None if args.no_cache else cache_dir(args.cache_dir)
    return extract_cached(
        args.model, shape, functional, extract, directory, lambda line: print(line, file=sys.stderr)
    )


def _short_type(name: str) -> str:
    return name.rsplit(".", 1)[-1] if name.startswith("torch.nn.modules.") else name


def _input_shapes(spec: str) -> str:
    inputs = json.loads(spec).get("inputs", [])
    return " ".join("x".join(str(d) for d in i["shape"]) or "()" for i in inputs)


def _fmt(value: float, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}g}"


def _json_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for record in frame.to_dict(orient="records"):
        clean = {}
        for k, v in record.items():
            if hasattr(v, "item"):
                v = v.item()
            if isinstance(v, float) and not math.isfinite(v):
                v = None
            clean[k] = v
        out.append(clean)
    return out


class _NoProgress:
    """Stands in for a tqdm bar that would be disabled, without importing tqdm."""

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_postfix_str(self, text: str) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None
