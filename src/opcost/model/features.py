"""Feature encoding: one fixed-length numeric vector per measurement (thesis section 4.2).

Tree models take numbers only, and ops differ in how many inputs, dimensions and
attributes they have; every entry that may not apply is a pair ``(value, flag)``:
the value and 1 where it applies, ``-1`` and 0 where it does not. The vector holds the
one-hot op type, the input shapes, the attributes of :data:`ATTRIBUTES`, numeric call
arguments, mode, dtype width, TF32, the measured clocks and power limit, and (with
``derived``) FLOPs, parameters, element counts, bytes moved and arithmetic intensity;
docs/prediction.md lists every column. A :class:`FeatureSchema` fixes the columns; it
is saved with the models (``features.json``) and a model is used only with the schema it
was trained with (:func:`check_schema`)::

    schema = build_schema(rows["op_type"], derived=True)
    x = encode_features(rows, schema)          # rows: spec, mode, dtype, tf32, conditions
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from opcost.errors import OpcostError

#: Bump when the encoding changes: a model trained with another version is refused.
FEATURES_VERSION = 2
NOT_APPLICABLE = -1.0

#: Attributes encoded for every op: (name, number of components). Chosen, as in the
#: thesis, heuristically and rather too many than too few.
ATTRIBUTES: tuple[tuple[str, int], ...] = (
    ("in_channels", 1),
    ("out_channels", 1),
    ("kernel_size", 3),
    ("stride", 3),
    ("padding", 3),
    ("dilation", 3),
    ("output_padding", 3),
    ("groups", 1),
    ("transposed", 1),
    ("in_features", 1),
    ("out_features", 1),
    ("bias", 1),
    ("num_features", 1),
    ("num_groups", 1),
    ("num_channels", 1),
    ("normalized_shape", 1),
    ("affine", 1),
    ("elementwise_affine", 1),
    ("track_running_stats", 1),
    ("embed_dim", 1),
    ("num_heads", 1),
    ("kdim", 1),
    ("vdim", 1),
    ("batch_first", 1),
    ("num_embeddings", 1),
    ("embedding_dim", 1),
    ("hidden_size", 1),
    ("num_layers", 1),
    ("output_size", 3),
    ("ceil_mode", 1),
    ("count_include_pad", 1),
    ("scale_factor", 1),
    ("p", 1),
    ("inplace", 1),
    ("dim", 1),
    ("start_dim", 1),
    ("end_dim", 1),
)
#: Tuple attributes that PyTorch broadcasts from a single integer over spatial dims.
_SPATIAL = frozenset(
    {"kernel_size", "stride", "padding", "dilation", "output_padding", "output_size"}
)
#: Attributes given as a shape whose product is what matters.
_PRODUCT = frozenset({"normalized_shape"})
#: Element counts of an op (:func:`op_counts`).
COUNTS = ("flops", "params", "input_numel", "output_numel")
DERIVED = ("flops", "params", "input_numel", "output_numel", "bytes_moved", "flops_per_byte")
CONDITIONS = ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w")
#: Columns a table needs for :func:`encode_features`.
REQUIRED_COLUMNS = ("spec", "mode", "dtype", "tf32", *CONDITIONS)
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


class SchemaError(OpcostError, ValueError):
    """A model, its feature schema and the data do not fit together; the message says why."""


@dataclass(frozen=True)
class FeatureSchema:
    """What the feature vector holds; saved in ``features.json`` beside the models."""

    op_types: tuple[str, ...]
    max_dims: int = 5
    n_inputs: int = 2
    n_scalar_args: int = 3
    attributes: tuple[tuple[str, int], ...] = ATTRIBUTES
    derived: bool = True
    version: int = FEATURES_VERSION

    def columns(self) -> list[str]:
        """Feature names, in the order of the vector."""
        cols = [f"type[{t}]" for t in self.op_types]
        cols += ["is_module", "n_inputs", "strided_inputs"]
        for i in range(self.n_inputs):
            for j in range(self.max_dims):
                cols += [f"in{i}_d{j}", f"in{i}_d{j}_flag"]
        for name, k in self.attributes:
            for c in range(k):
                cols += [f"attr_{name}_{c}", f"attr_{name}_{c}_flag"]
        for k in range(self.n_scalar_args):
            cols += [f"arg{k}", f"arg{k}_flag"]
        cols += ["training", "dtype_bytes", "tf32", *CONDITIONS]
        if self.derived:
            cols += list(DERIVED)
        return cols

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["op_types"] = list(self.op_types)
        d["attributes"] = [list(a) for a in self.attributes]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureSchema:
        try:
            return cls(
                op_types=tuple(d["op_types"]),
                max_dims=int(d["max_dims"]),
                n_inputs=int(d["n_inputs"]),
                n_scalar_args=int(d["n_scalar_args"]),
                attributes=tuple((str(n), int(k)) for n, k in d["attributes"]),
                derived=bool(d["derived"]),
                version=int(d["version"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise SchemaError(f"feature schema is malformed ({e!r})") from e


def build_schema(op_types: Iterable[str], *, derived: bool = True) -> FeatureSchema:
    """The schema for training data with these op types (sorted, so the order is stable)."""
    return FeatureSchema(op_types=tuple(sorted(set(op_types))), derived=derived)


def check_schema(schema: FeatureSchema, columns: Sequence[str], where: str) -> None:
    """Refuse a model whose feature columns are not those the schema encodes.

    Raises:
        SchemaError: for another encoding version or another column list, naming ``where``
            and what to do (retrain).
    """
    if schema.version != FEATURES_VERSION:
        raise SchemaError(
            f"{where}: features version {schema.version}, but this opcost encodes version "
            f"{FEATURES_VERSION}; retrain the predictors (snakemake --forcerun train)"
        )
    expected = schema.columns()
    if list(columns) != expected:
        missing = [c for c in expected if c not in columns][:3]
        extra = [c for c in columns if c not in expected][:3]
        raise SchemaError(
            f"{where}: the model's {len(columns)} feature columns differ from the "
            f"{len(expected)} its schema encodes (missing e.g. {missing}, unexpected e.g. "
            f"{extra}); retrain the predictors (snakemake --forcerun train)"
        )


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a floating dtype name (``float32`` -> 4)."""
    try:
        return _DTYPE_BYTES[dtype]
    except KeyError:
        raise SchemaError(
            f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPE_BYTES)}"
        ) from None


# -- per operation ------------------------------------------------------------------------


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _attr_components(name: str, value: Any, k: int, n_spatial: int) -> list[float | None]:
    """The ``k`` components of one attribute (None where a component does not apply)."""
    out: list[float | None] = [None] * k
    if isinstance(value, dict) and "__tuple__" in value:
        value = value["__tuple__"]
    if isinstance(value, list):
        if name in _PRODUCT:
            numbers = [_number(v) for v in value]
            if numbers and all(n is not None for n in numbers):
                out[0] = float(math.prod(numbers))  # type: ignore[arg-type]
            return out
        for c, v in enumerate(value[:k]):
            out[c] = _number(v)
        return out
    number = _number(value)
    if number is None:
        return out
    reps = min(k, n_spatial) if name in _SPATIAL and not isinstance(value, bool) else 1
    for c in range(reps):
        out[c] = number
    return out


def _flops_and_params(spec: dict[str, Any], attrs: dict[str, Any]) -> tuple[float, float]:
    """Forward FLOPs (multiply-add = 2) and parameter elements, by op type; rough but monotone."""
    shapes = [inp["shape"] for inp in spec["inputs"]]
    in_numel = sum(_numel(s) for s in shapes)
    out_shapes = [o["shape"] for o in spec.get("outputs", [])]
    out_numel = _numel(out_shapes[0]) if out_shapes else 0
    name = spec["type"].rsplit(".", 1)[-1]
    lname = name.lower()
    bias = 1.0 if attrs.get("bias") is True else 0.0
    param_inputs = sum(_numel(inp["shape"]) for inp in spec["inputs"] if inp.get("param"))

    def kernel() -> float:
        ks = attrs.get("kernel_size", 1)
        n_spatial = max(1, len(shapes[0]) - 2) if shapes else 1
        if isinstance(ks, list):
            return float(math.prod(int(v) for v in ks))
        return float(int(ks) ** n_spatial)

    if spec["kind"] == "module":
        if "conv" in lname and "in_channels" in attrs:
            groups = max(1, int(attrs.get("groups", 1)))
            cin, cout = int(attrs["in_channels"]), int(attrs["out_channels"])
            params = cout * cin / groups * kernel() + bias * cout
            if attrs.get("transposed") or "transpose" in lname:
                return 2.0 * in_numel * cout / groups * kernel(), params
            return 2.0 * out_numel * cin / groups * kernel() + bias * out_numel, params
        if "in_features" in attrs and "out_features" in attrs:
            fin, fout = int(attrs["in_features"]), int(attrs["out_features"])
            return 2.0 * out_numel * fin + bias * out_numel, fin * fout + bias * fout
        if name == "MultiheadAttention" and shapes:
            e = int(attrs.get("embed_dim", shapes[0][-1]))
            q, kv = shapes[0], shapes[1] if len(shapes) > 1 else shapes[0]
            seq_dim = 1 if attrs.get("batch_first") else 0
            if len(q) == 3:
                n, length, src = q[1 - seq_dim], q[seq_dim], kv[seq_dim]
            else:  # unbatched (L, E)
                n, length, src = 1, q[0], kv[0]
            flops = 2.0 * n * e * e * (length + 2 * src)  # q, k, v projections
            flops += 4.0 * n * length * src * e  # scores and weighted sum
            flops += 2.0 * n * length * e * e  # output projection
            return flops, 4.0 * e * e + 4.0 * e * bias
        if "pool" in lname and "adaptive" not in lname:
            return float(out_numel) * kernel(), 0.0
        if "num_embeddings" in attrs and "embedding_dim" in attrs:
            return 0.0, float(attrs["num_embeddings"]) * float(attrs["embedding_dim"])
        if "num_features" in attrs:  # batch and instance norms
            affine = attrs.get("affine") is True
            return 5.0 * in_numel, 2.0 * int(attrs["num_features"]) * affine
        if "normalized_shape" in attrs:
            ns = attrs["normalized_shape"]
            size = math.prod(ns) if isinstance(ns, list) else int(ns)
            affine = attrs.get("elementwise_affine") is True
            return 5.0 * in_numel, float(size) * affine * (1 + (attrs.get("bias") is not False))
        if "num_channels" in attrs and "num_groups" in attrs:
            affine = attrs.get("affine") is True
            return 5.0 * in_numel, 2.0 * int(attrs["num_channels"]) * affine
        return float(max(in_numel, out_numel)), 0.0
    # Functional ops: parameters are the inputs marked ``param``.
    if lname in {"matmul", "mm", "bmm", "__matmul__", "__rmatmul__", "einsum"} and shapes:
        k = shapes[0][-1] if shapes[0] else 1
        return 2.0 * out_numel * k, float(param_inputs)
    if lname in {"addmm", "baddbmm", "addbmm", "addmv"} and len(shapes) > 1:
        return 2.0 * out_numel * shapes[1][-1], float(param_inputs)
    if lname == "linear" and len(shapes) > 1:
        return 2.0 * out_numel * shapes[1][-1], float(param_inputs)
    if lname.startswith("conv") and len(shapes) > 1 and len(shapes[1]) >= 3:
        return 2.0 * out_numel * _numel(shapes[1][1:]), float(param_inputs)
    if lname == "scaled_dot_product_attention" and len(shapes) > 1:
        return 4.0 * _numel(shapes[0]) * shapes[1][-2], float(param_inputs)
    return float(max(in_numel, out_numel)), float(param_inputs)


@lru_cache(maxsize=65536)
def _op_vector(spec_json: str, schema: FeatureSchema) -> tuple[np.ndarray, np.ndarray]:
    """The op's part of the vector, and its element counts (flops, params, in, out)."""
    spec = json.loads(spec_json)
    values: list[float] = []
    type_index = {t: i for i, t in enumerate(schema.op_types)}
    onehot = [0.0] * len(schema.op_types)
    if spec["type"] in type_index:
        onehot[type_index[spec["type"]]] = 1.0
    values += onehot
    inputs = spec.get("inputs", [])
    values += [
        1.0 if spec["kind"] == "module" else 0.0,
        float(len(inputs)),
        float(sum("stride" in inp for inp in inputs)),
    ]

    def pair(v: float | None) -> list[float]:
        return [NOT_APPLICABLE, 0.0] if v is None else [float(v), 1.0]

    for i in range(schema.n_inputs):
        shape = [int(d) for d in inputs[i]["shape"]] if i < len(inputs) else []
        if len(shape) > schema.max_dims:
            shape = shape[: schema.max_dims - 1] + [_numel(shape[schema.max_dims - 1 :])]
        for j in range(schema.max_dims):
            values += pair(shape[j] if j < len(shape) else None)

    attrs = dict(spec.get("kwargs") or {})
    attrs.update(spec.get("attrs") or {})
    first_ndim = len(inputs[0]["shape"]) if inputs else 0
    n_spatial = min(3, max(1, first_ndim - 2))
    for name, k in schema.attributes:
        comps = _attr_components(name, attrs[name], k, n_spatial) if name in attrs else [None] * k
        for v in comps:
            values += pair(v)

    scalars = [n for a in spec.get("args", []) if (n := _number(a)) is not None]
    for k in range(schema.n_scalar_args):
        values += pair(scalars[k] if k < len(scalars) else None)

    flops, params = _flops_and_params(spec, spec.get("attrs") or {})
    in_numel = float(sum(_numel(inp["shape"]) for inp in inputs))
    outputs = spec.get("outputs", [])
    out_numel = float(sum(_numel(o["shape"]) for o in outputs))
    counts = np.array([flops, params, in_numel, out_numel], dtype=np.float64)
    return np.array(values, dtype=np.float64), counts


def op_counts(spec_json: str) -> dict[str, float]:
    """Derived counts of one op: ``flops``, ``params``, ``input_numel``, ``output_numel``."""
    _, counts = _op_vector(spec_json, FeatureSchema(op_types=()))
    return dict(zip(COUNTS, counts.tolist(), strict=True))


def _check_table(table: pd.DataFrame, required: Sequence[str] = REQUIRED_COLUMNS) -> None:
    missing = [c for c in required if c not in table.columns]
    if missing:
        raise SchemaError(f"cannot encode features: the table lacks columns {missing}")
    bad_modes = sorted(set(table["mode"]) - {"inference", "training"})
    if bad_modes:
        raise SchemaError(f"unknown mode(s) {bad_modes}; expected inference or training")


def _condition_part(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row: ``training``, ``dtype_bytes``, ``tf32`` and :data:`CONDITIONS` (``-1``
    where not measured) as a ``(n, 6)`` array, and the dtype's bytes per element."""
    nbytes = np.array([dtype_bytes(str(d)) for d in table["dtype"]], dtype=np.float64)
    conds = [
        pd.to_numeric(table[c], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        for c in CONDITIONS
    ]
    part = np.column_stack(
        [
            (table["mode"].to_numpy() == "training").astype(np.float64),
            nbytes,
            table["tf32"].astype(bool).to_numpy(dtype=np.float64),
            *[np.where(np.isfinite(c), c, NOT_APPLICABLE) for c in conds],
        ]
    )
    return part, nbytes


def _derived_part(counts: np.ndarray, nbytes: np.ndarray) -> list[np.ndarray]:
    """The :data:`DERIVED` features from an op's counts and the dtype's bytes per
    element; the last axis of ``counts`` holds :data:`COUNTS`, and the two broadcast."""
    flops, params, in_numel, out_numel = np.moveaxis(counts, -1, 0)
    moved = (in_numel + out_numel + params) * nbytes
    flops = np.broadcast_to(flops, moved.shape)
    intensity = np.divide(flops, moved, out=np.zeros_like(moved), where=moved > 0)
    return [np.broadcast_to(c, moved.shape) for c in (flops, params, in_numel, out_numel)] + [
        moved,
        intensity,
    ]


def encode_features(table: pd.DataFrame, schema: FeatureSchema) -> pd.DataFrame:
    """Feature matrix of a table of measurements (or of ops at chosen conditions).

    Args:
        table: one row per measurement, with columns ``spec`` (canonical JSON),
            ``mode``, ``dtype``, ``tf32``, ``sm_clock_mhz``, ``mem_clock_mhz`` and
            ``power_limit_w`` (NaN where not measured).
        schema: the encoding.

    Returns:
        A float frame with ``schema.columns()`` and ``table``'s index.

    Raises:
        SchemaError: a required column is missing or a mode is unknown.
    """
    _check_table(table)
    columns = schema.columns()
    n = len(table)
    if n == 0:
        return pd.DataFrame(np.empty((0, len(columns))), columns=columns, index=table.index)
    specs = table["spec"].astype(str).to_numpy()
    uniq, inverse = np.unique(specs, return_inverse=True)
    parts = [_op_vector(s, schema) for s in uniq]
    op_part = np.stack([p[0] for p in parts])[inverse]
    counts = np.stack([p[1] for p in parts])[inverse]
    row_part, nbytes = _condition_part(table)
    blocks = [op_part, row_part]
    if schema.derived:
        blocks.append(np.column_stack(_derived_part(counts, nbytes)))
    matrix = np.hstack(blocks)
    if matrix.shape[1] != len(columns):  # pragma: no cover - would be a bug in this module
        raise SchemaError(f"encoded {matrix.shape[1]} features, schema has {len(columns)}")
    return pd.DataFrame(matrix, columns=columns, index=table.index)


def encode_grid(
    specs: Sequence[str], conditions: pd.DataFrame, schema: FeatureSchema
) -> np.ndarray:
    """Feature vectors of every op at every condition, as prediction needs them.

    The same numbers as :func:`encode_features` of the table with one row per op and
    condition (op-major: all conditions of the first op, then the second's), but each
    op's part is encoded once and each condition's once, instead of once per row.

    Args:
        specs: canonical JSON of each op.
        conditions: one row per condition, with the columns of :func:`encode_features`
            other than ``spec``.
        schema: the encoding.

    Returns:
        ``(len(specs), len(conditions), len(schema.columns()))`` floats.

    Raises:
        SchemaError: a required column is missing or a mode is unknown.
    """
    _check_table(conditions, [c for c in REQUIRED_COLUMNS if c != "spec"])
    columns = schema.columns()
    out = np.empty((len(specs), len(conditions), len(columns)))
    if out.size == 0:
        return out
    parts = [_op_vector(str(s), schema) for s in specs]
    op_part = np.stack([p[0] for p in parts])
    counts = np.stack([p[1] for p in parts])
    row_part, nbytes = _condition_part(conditions)
    n_op, n_row = op_part.shape[1], row_part.shape[1]
    out[:, :, :n_op] = op_part[:, None, :]
    out[:, :, n_op : n_op + n_row] = row_part[None, :, :]
    if schema.derived:
        derived = _derived_part(counts[:, None, :], nbytes[None, :])
        out[:, :, n_op + n_row :] = np.stack(derived, axis=-1)
    elif n_op + n_row != len(columns):  # pragma: no cover - would be a bug in this module
        raise SchemaError(f"encoded {n_op + n_row} features, schema has {len(columns)}")
    return out
