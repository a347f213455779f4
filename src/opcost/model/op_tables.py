"""The op-space tables a GPU configuration's op models learn from.

A configuration's chunk tables (:func:`read_chunks`) hold its own samples; a configuration
with TF32 off or ``cudnn_benchmark`` on measures only the families those change and takes
the rest from its *twin* (:func:`twin_of`: the same GPU and dtype with TF32 on and
``cudnn_benchmark`` off); with
``op_space.model.pool_gpus`` it also learns from its *peers* (:func:`peers_of`: the other
GPUs' configurations of the same numerics), the configurations only they measured
(:func:`pooled_rows`). :func:`training_rows` keeps the usable samples of any of them;
:func:`within_budget` the samples a study stopped after so many GPU-minutes would hold.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def training_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The usable samples (``status`` ok, finite times) with the model's targets."""
    rows = table[table["status"] == "ok"].copy()
    # An empty chunk's columns are untyped: concatenated, they leave objects behind.
    rows = rows.infer_objects()
    rows = rows[rows["host_time_s"].astype("float64").gt(0)]
    rows["op_type"] = rows["op_type"].astype(str)
    rows["dtype"] = rows["dtype"].astype(str)
    rows["tf32"] = rows["tf32"].astype(bool)
    # Tables measured before the column were measured with cuDNN's heuristics.
    benchmark = rows.get("cudnn_benchmark", False)
    rows["cudnn_benchmark"] = (
        pd.Series(benchmark, index=rows.index, dtype="boolean").fillna(False).astype(bool)
    )
    for c in ("sm_clock_mhz", "mem_clock_mhz", "power_limit_w"):
        rows[c] = np.nan
    return rows.reset_index(drop=True)


def within_budget(
    table: pd.DataFrame, minutes: float, order: str = "measured", seed: int = 0
) -> pd.DataFrame:
    """The rows a configuration's study would hold had it measured for ``minutes`` only,
    kept while the sum of their ``measure_s`` stays within the budget. ``order``:
    ``"measured"``, the rows in the order they finished (``finished_unix_s``): the study
    stopped after that long, its adaptive rounds in the order they ran; ``"random"``,
    its op ids in a random order (``seed``), each with all its rows: every round thinned
    alike, the same design at a smaller size.

    Raises:
        ValueError: ``minutes`` negative or not a number, or an unknown ``order``.
    """
    if not (isinstance(minutes, int | float) and minutes >= 0):
        raise ValueError(f"a budget of {minutes!r} minutes: expected a number >= 0")
    cost_s = table["measure_s"].to_numpy(dtype=float)
    if order == "measured":
        rows = table["finished_unix_s"].to_numpy(dtype=float).argsort(kind="stable")
        return table.iloc[np.sort(rows[cost_s[rows].cumsum() <= 60.0 * minutes])]
    if order != "random":
        raise ValueError(f"budget order {order!r}: expected 'measured' or 'random'")
    per_op = pd.Series(cost_s, index=table.index).groupby(table["op_id"].to_numpy()).sum()
    shuffled = per_op.iloc[np.random.default_rng(seed).permutation(len(per_op))]
    kept = shuffled.index[shuffled.cumsum().to_numpy() <= 60.0 * minutes]
    return table[table["op_id"].isin(set(kept))]


def read_chunks(paths: list[str]) -> pd.DataFrame:
    """One configuration's op-space chunk tables, concatenated (empty chunks too)."""
    from opcost.io import read_parquet

    tables = [read_parquet(p) for p in paths]
    return pd.concat([t for t in tables if len(t)] or tables[:1], ignore_index=True)


#: The columns that say which numerics a chunk table was measured with.
NUMERICS_COLUMNS = ("gpu_name", "dtype", "tf32", "cudnn_benchmark")


def read_numerics(path: str) -> pd.DataFrame:
    """:data:`NUMERICS_COLUMNS` of one chunk table; ``cudnn_benchmark`` False where the
    table predates the column (measured with cuDNN's heuristics)."""
    import pyarrow.parquet as pq

    present = set(pq.read_schema(path).names)
    table = pd.read_parquet(path, columns=[c for c in NUMERICS_COLUMNS if c in present])
    if "cudnn_benchmark" not in present:
        table["cudnn_benchmark"] = False
    return table


def _recorded(table: pd.DataFrame) -> tuple[Any, Any, bool | None, bool]:
    """``(gpu_name, dtype, tf32, cudnn_benchmark)`` as a configuration's chunk table records
    them (its first non-missing value of each; None where it records none; for
    ``cudnn_benchmark``, False)."""

    def first(column: str) -> Any:
        values = table[column].dropna() if column in table else ()
        return values.iloc[0] if len(values) else None

    tf32 = first("tf32")
    return (
        first("gpu_name"),
        first("dtype"),
        None if tf32 is None else bool(tf32),
        bool(first("cudnn_benchmark") or False),
    )


def twin_of(tables: dict[str, pd.DataFrame], gpu: str) -> str | None:
    """For a configuration with TF32 off or ``cudnn_benchmark`` on, the configuration
    among ``tables`` measured on the same GPU model with the same dtype, TF32 on and
    ``cudnn_benchmark`` off (the one whose rows fill the families it does not measure);
    None for those numerics themselves or without one."""
    gpu_name, dtype, tf32, benchmark = _recorded(tables[gpu])
    if tf32 is None or (tf32 and not benchmark):
        return None
    for name, table in sorted(tables.items()):
        if name != gpu and _recorded(table) == (gpu_name, dtype, True, False):
            return name
    return None


def peers_of(tables: dict[str, pd.DataFrame], gpu: str) -> list[str]:
    """The configurations among ``tables`` whose samples the op models of ``gpu`` pool
    with its own (:func:`opcost.model.opmodel.fit`): measured on another GPU model with
    the same dtype, TF32 and ``cudnn_benchmark`` setting. Their kernels are the same (on
    the H100 and the H200, 99.5 % of the sampled convolutions ran as many kernels on both,
    in a median 4 % less time on the H200), so a configuration either measured teaches
    both."""
    gpu_name, *numerics = _recorded(tables[gpu])
    recorded = {name: _recorded(table) for name, table in sorted(tables.items()) if name != gpu}
    return [n for n, (g, *num) in recorded.items() if g != gpu_name and num == numerics]


def pooled_rows(
    table: pd.DataFrame, twin: pd.DataFrame | None, peers: pd.DataFrame | None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(own, pooled)`` rows. ``own``: the configuration's samples and, for the families
    it does not measure, those its ``twin`` table ran on the same GPU (TF32 and
    ``cudnn_benchmark`` set as its own). ``pooled``: its samples, its ``peers``' and, for
    the families none of them measures, those of ``twin``'s GPUs, indexed 0..n-1, with
    columns ``_measured`` (its or a peer's own measurement, not a twin's) and ``_train``:
    the rows learnt from, its own samples and then those of a configuration and mode only
    a peer measured (its own GPU's twin first). Every row of a GPU sets that GPU's
    ceilings and kernel floor."""
    rows = training_rows(table)
    tf32, name = rows["tf32"].iloc[0], rows["gpu_name"].iloc[0]
    parts = [rows.assign(_measured=True, _train=True)]
    if peers is not None and len(peers):
        theirs = training_rows(peers)
        keys = sample_keys(theirs)
        fresh = ~keys.isin(set(sample_keys(rows))) & ~keys.duplicated()
        parts.append(theirs.assign(_measured=True, _train=fresh.to_numpy()))
    measured = pd.concat(parts, ignore_index=True)
    own_lacking = lacking = measured.iloc[:0]
    if twin is not None:
        lacking = training_rows(twin).assign(
            tf32=tf32, cudnn_benchmark=bool(rows["cudnn_benchmark"].iloc[0]), _measured=False
        )
        lacking = lacking.sort_values("gpu_name", key=lambda g: g != name, kind="stable")
        own_lacking = lacking[~lacking["family"].isin(set(rows["family"]))]
        own_lacking = own_lacking[own_lacking["gpu_name"] == name]
        lacking = lacking[~lacking["family"].isin(set(measured["family"]))]
        mine, keys = lacking["gpu_name"] == name, sample_keys(lacking)
        lacking = lacking.assign(_train=mine | (~keys.isin(set(keys[mine])) & ~keys.duplicated()))
    own = pd.concat([rows, own_lacking.drop(columns="_measured")], ignore_index=True)
    return own, pd.concat([measured, lacking], ignore_index=True)


def sample_keys(rows: pd.DataFrame) -> pd.Series:
    """A sample's configuration and mode, as one key per row."""
    return rows["op_id"].astype(str) + "/" + rows["mode"].astype(str)
