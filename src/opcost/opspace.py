"""The op space: operation configurations sampled from each op type's parameter ranges.

The training data of the op models (docs/op-space.md) comes from configurations drawn
from ranges, not from a list of networks, so that a network nobody measured is predicted
from ops like its own rather than from the nearest network. Each *family* (convolutions,
linear layers, batched matrix products, attention, norms, activations, pooling,
elementwise ops, softmax, dropout, concatenation, copies, views) maps a point of the unit
cube to one configuration: log-uniform sizes (batch 1-256, channels 3-2048, spatial
7-224, ...), categorical choices (kernel 1-7, stride, dilation, groups up to depthwise,
channels-last inputs, the op type within the family). Points come from a scrambled Sobol
sequence (space-filling); :func:`sample` takes ``n`` points per family from a given
offset, so a second round (adaptive: more points for the families the model misses
most, :func:`allocate`, from trained op models' errors :func:`next_round`) continues the
same sequence without repeating a point.

A configuration is built on PyTorch's ``meta`` device, called as a network calls it, and
recorded with extraction's own spec builder (:func:`opcost.spec.make_spec`), so its spec
and ``op_id`` are exactly those extraction gives the same layer in a network. A
configuration whose step would exceed :data:`MAX_FORWARD_FLOPS` or whose largest tensor
would exceed :data:`MAX_TENSOR_BYTES` (generator 7's convolutions: :data:`HEAVY_BOUNDS`)
has its batch (then its spatial size or sequence) halved until it fits, so that one
configuration never costs more than a few ms per step (tens of ms for generator 7's).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from opcost import opspace_conv
from opcost import spec as specs
from opcost.errors import OpcostError
from opcost.extract import function_spec
from opcost.opspace_draw import Call
from opcost.opspace_ops import FAMILY_MAKERS, VERSIONED_FAMILIES

#: Upper bounds of one configuration (float32): forward FLOPs and its largest tensor.
MAX_FORWARD_FLOPS = 2.0e11
MAX_TENSOR_BYTES = 2**29
#: Generator 7's bounds ``(forward FLOPs, largest tensor bytes)``: the convolutions of a
#: network at batch 64 to 256 (up to about 1 TFLOP forward), which the default bounds
#: would halve to a smaller batch.
HEAVY_BOUNDS = (1.0e12, 2**30)
#: Columns of a table of sampled configurations.
COLUMNS = ("op_id", "family", "type", "kind", "spec", "sample", "round", "generator")
#: Versions of the map from the unit cube to configurations (``op_space.generator``): a
#: round keeps the version it was measured with, so that its samples stay those measured.
#: 2 to 12, 15, 16 and 18 changed convolutions only (:func:`opcost.opspace_conv.params`), 13 and 14
#: norms only (:func:`opcost.opspace_ops._norm`), 17 matrix products only
#: (:func:`opcost.opspace_products._matmul`), 19 linear layers only
#: (:func:`opcost.opspace_products._linear`), 20 attention only
#: (:func:`opcost.opspace_products._attention`), 21 the calls networks make as functions and a
#: shifted-window block's ops (linear layers, activations, pooling, elementwise ops,
#: softmax and copies: :mod:`opcost.opspace_products`, :mod:`opcost.opspace_ops`,
#: :mod:`opcost.opspace_copies`), 22 copies only (a table gathered by a
#: tensor of indices), 23 copies only (a view of part of a tensor, which training's
#: backward pass writes whole: :mod:`opcost.opspace_copies`), 24 copies only (a write into
#: part of a tensor, ``x[index] = value``), 25 convolutions only (depthwise ones on a
#: stage's map); a family a version leaves maps as the version before.
GENERATORS = tuple(range(1, 26))


class OpSpaceError(OpcostError, ValueError):
    """The op space cannot be sampled as asked (unknown family, bad counts)."""


@dataclass(frozen=True)
class Family:
    """One op family: its dimensions in the unit cube, and how a point becomes a call."""

    name: str
    dims: int
    make_params: Callable[..., dict[str, Any]]
    call: Callable[[dict[str, Any]], Call]
    #: Whether ``make_params`` takes the generator version (families it changed).
    versioned: bool = False

    def params(self, u: Sequence[float], generator: int = 1) -> dict[str, Any]:
        """The configuration at point ``u`` of the unit cube, as ``generator`` maps it."""
        if generator not in GENERATORS:
            raise OpSpaceError(f"op-space generator {generator!r}: expected one of {GENERATORS}")
        return self.make_params(u, generator) if self.versioned else self.make_params(u)


FAMILIES: dict[str, Family] = {
    "conv": Family("conv", 11, opspace_conv.params, opspace_conv.call, versioned=True),
    **{
        name: Family(name, *maker, versioned=name in VERSIONED_FAMILIES)
        for name, maker in FAMILY_MAKERS.items()
    },
}


# -- recording -------------------------------------------------------------------------------


def record(call: Call) -> dict[str, Any]:
    """The spec extraction records for this call (module: its type and attributes;
    function: the torch call as the recorder sees it, opcost.extract.function_spec)."""
    if call.module is not None:
        with torch.no_grad():
            out = call.fn(*call.args, **call.kwargs)
        cls = type(call.module)
        spec = specs.make_spec(
            "module",
            specs.qualified_name(cls),
            call.args,
            call.kwargs,
            out,
            attrs=specs.module_attrs(call.module),
        )
    else:
        spec = function_spec(call.fn, call.args, call.kwargs)
    if spec is None:  # pragma: no cover - every family's call has a JSON form
        raise OpSpaceError(f"cannot record {call.fn!r}")
    return spec


def _size(spec: dict[str, Any]) -> tuple[float, int]:
    from opcost.model.features import op_counts

    flops = op_counts(specs.canonical_json(spec))["flops"]
    tensors = [*spec["inputs"], *spec["outputs"]]
    largest = max((math.prod(t["shape"]) for t in tensors), default=0)
    return flops, 4 * largest


def bounds(family: str, generator: int = 1) -> tuple[float, int]:
    """``(forward FLOPs, largest tensor bytes)`` a configuration of ``family`` drawn by
    ``generator`` is shrunk to."""
    if family == "conv" and generator == 7:
        return HEAVY_BOUNDS
    return MAX_FORWARD_FLOPS, MAX_TENSOR_BYTES


def build(family: str, params: dict[str, Any], generator: int = 1) -> dict[str, Any]:
    """The spec of one configuration, shrunk to the size bounds (module docstring)."""
    return fit(family, params, generator)[1]


def fit(
    family: str, params: dict[str, Any], generator: int = 1
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The parameters of one configuration shrunk to ``generator``'s size bounds
    (:func:`bounds`), and their spec."""
    fam = FAMILIES[family]
    max_flops, max_bytes = bounds(family, generator)
    p = dict(params)
    for _ in range(64):
        spec = record(fam.call(p))
        flops, largest = _size(spec)
        if flops <= max_flops and largest <= max_bytes:
            return p, spec
        if p.get("batch", 1) > 1:
            p["batch"] = max(1, p["batch"] // 2)
        elif p.get("spatial", 1) > 7:
            p["spatial"] = max(7, p["spatial"] // 2)
        elif p.get("tokens", 1) > 16:
            p["tokens"] = max(16, p["tokens"] // 2)
        else:
            for key in ("channels", "cin", "cout", "fin", "fout", "m", "n", "k"):
                if key in p and p[key] > 16:
                    p[key] = p[key] // 2
                    break
            else:
                return p, spec
    return p, spec


def points(family: str, n: int, *, seed: int, start: int = 0) -> np.ndarray:
    """Points ``start .. start + n - 1`` of the family's scrambled Sobol sequence."""
    from scipy.stats import qmc

    sobol = qmc.Sobol(FAMILIES[family].dims, scramble=True, seed=seed + _stable(family))
    if start:
        sobol.fast_forward(start)
    with warnings.catch_warnings():  # balance needs n a power of 2; any n is space-filling
        warnings.simplefilter("ignore", UserWarning)
        return sobol.random(n)


def _stable(text: str) -> int:
    return int.from_bytes(text.encode(), "little") % 100_003


def sample(
    counts: dict[str, int],
    *,
    seed: int = 0,
    starts: dict[str, int] | None = None,
    round_: int = 1,
    generator: int = 1,
) -> pd.DataFrame:
    """``counts[family]`` configurations per family, as a table of :data:`COLUMNS`,
    mapped from the unit cube by version ``generator`` of :data:`GENERATORS`.

    ``starts[family]``: the first point of the family's sequence to take (a later
    round continues where the earlier stopped). Configurations that repeat an earlier
    one (a categorical family has few distinct small configurations) are dropped.
    """
    unknown = sorted(set(counts) - set(FAMILIES))
    if unknown:
        raise OpSpaceError(f"unknown op families {unknown}; expected some of {sorted(FAMILIES)}")
    for family, n in counts.items():
        if not isinstance(n, int) or n < 0:
            raise OpSpaceError(f"op family {family}: {n!r} samples asked, expected at least 0")
    rows = []
    for family, n in counts.items():
        start = (starts or {}).get(family, 0)
        for i, u in enumerate(points(family, n, seed=seed, start=start)):
            spec = build(family, FAMILIES[family].params(u, generator), generator)
            rows.append(
                {
                    "op_id": specs.op_id(spec),
                    "family": family,
                    "type": spec["type"],
                    "kind": spec["kind"],
                    "spec": specs.canonical_json(spec),
                    "sample": start + i,
                    "round": round_,
                    "generator": generator,
                }
            )
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    return table.drop_duplicates("op_id", ignore_index=True)


def allocate(errors: dict[str, float], total: int, *, floor: int = 0) -> dict[str, int]:
    """Samples of an adaptive round per family: ``floor`` each, the rest in proportion to
    the family's error in the round before (e.g. its cross-validated MAPE), rounded so
    that they sum to ``total`` (largest remainders first; equal shares if every error
    is 0). Raises :class:`OpSpaceError` naming an unknown family or a family whose error
    is negative or not a number."""
    unknown = sorted(set(errors) - set(FAMILIES))
    if unknown:
        raise OpSpaceError(f"unknown op families {unknown}; expected some of {sorted(FAMILIES)}")
    for family, error in errors.items():
        if not (isinstance(error, int | float) and math.isfinite(error) and error >= 0):
            raise OpSpaceError(f"op family {family}: error {error!r}, expected a number >= 0")
    if floor < 0 or total < floor * len(errors):
        raise OpSpaceError(f"{total} samples cannot give {floor} to each of {len(errors)}")
    if not errors:
        return {}
    spare = total - floor * len(errors)
    mass = sum(errors.values())
    weights = {f: (e / mass if mass else 1 / len(errors)) for f, e in errors.items()}
    shares = {f: spare * w for f, w in weights.items()}
    out = {f: floor + math.floor(x) for f, x in shares.items()}
    left = total - sum(out.values())
    by_remainder = sorted(shares, key=lambda f: (-(shares[f] - math.floor(shares[f])), f))
    for f in by_remainder[:left]:
        out[f] += 1
    return out


def next_round(
    metrics_paths: Sequence[str | Path], total: int, *, floor: int = 0
) -> dict[str, int]:
    """Samples per family of the next adaptive round: :func:`allocate` of ``total`` over
    each family's held-out GPU-time MAPE (%), averaged over the op models'
    ``metrics.json`` files given (``families.<family>.gpu_time_mape_pct``, written by
    rule ``train_op_models``) that score the family. A family no file scores (no
    held-out row with kernels, e.g. views) gets none. Raises :class:`OpSpaceError`
    naming a file that cannot be read as such metrics, or when none is given."""
    if not metrics_paths:
        raise OpSpaceError("no metrics.json given: train the op models first (op_models)")
    errors: dict[str, list[float]] = {}
    for path in metrics_paths:
        try:
            families = json.loads(Path(path).read_text())["families"]
            for family, scores in families.items():
                errors.setdefault(family, []).append(float(scores["gpu_time_mape_pct"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise OpSpaceError(
                f"{path}: not an op models' metrics.json "
                f"(families.<family>.gpu_time_mape_pct): {type(e).__name__}: {e}"
            ) from e
    means = {family: sum(v) / len(v) for family, v in sorted(errors.items())}
    return allocate(means, total, floor=floor)
