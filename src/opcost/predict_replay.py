"""Prediction by replay: a network's step from its ops' predicted host and GPU times.

For every GPU configuration's op models (:mod:`opcost.model.opmodel`, learnt from the
op-space study) and mode, each distinct op of an op table is predicted: GPU kernel time
and the time the GPU is busy with it (their union: less where kernels overlap), kernels,
host time (for one host, whose host-speed probe is ``host_probe_s``, on every
configuration) and busy power. The network's calls, in the order
extraction recorded (``positions``; training: the forward calls, then their backward
passes in reverse, each with the gradient sums the network's autograd runs for the
tensors the call made, where the op table carries them: :mod:`opcost.model.grad_sums`),
are replayed on a host thread and a GPU stream (:mod:`opcost.replay`):

* ``time_s``: the replayed step, ended by one synchronisation;
* ``energy_j``: each call's busy power × its GPU busy time, plus the waiting power of the op
  models × the rest of the step; ``power_w`` = energy / time;
* ``host_time_s`` and ``gpu_busy_s``: the host's work and the GPU stream's busy time per
  step; ``bound``: ``host`` or ``gpu``, whichever is busy longer, sets the pace. Where the
  host does, the GPU barely changes the time;
* ``graph_time_s`` and ``graph_energy_j``: the step run from a CUDA graph
  (:func:`opcost.replay.graph_replay`: no host time, kernels back to back, each call's
  for its busy time from a graph, ``graph_busy_time_s``, at its busy power), where the
  host's share vanishes and the GPU alone sets the time;
* ``grouped_conv_share``: the share of the GPU busy time in grouped convolutions
  (:func:`opcost.model.shapes.grouped_conv`), whose time depends on which kernels cuDNN
  picks, one for the whole call or one a group, which their shapes do not tell: a
  network with much of its time in them is predicted less surely.

Ops whose type the op space never sampled are predicted by a stand-in (the elementwise
model) and listed in ``extrapolation``::

    models = load_op_models("results/op-models")
    result = replay_networks(models, read_ops_table("ops.parquet"))
    result.table, result.best
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from opcost import replay as rp
from opcost.model import PredictorError, grad_sums, inplace_saves, leaf_grads
from opcost.model.op_spec import family_of
from opcost.model.opmodel import NO_KERNEL_FAMILIES, OpModel, model_key
from opcost.model.shapes import grouped_conv
from opcost.names import MODES
from opcost.predict import PER_OP_COLUMNS, NetworkPrediction, best_choices

#: The setting op models predict (the op space is measured at the GPU's defaults).
SETTING = "default"
#: Why an op is listed in ``extrapolation``.
UNSAMPLED_FAMILY = "op family not in the op space: predicted as elementwise"
UNSAMPLED_TYPE = "op type not sampled in its family"
OUTSIDE_SIZES = "sizes outside the sampled ones: "
#: Per op prediction columns the replay reads.
_STEP_COLUMNS = {
    "host": ("host_time_s", "forward_host_time_s"),
    # The GPU stream is busy for the union of a call's kernels, less than their sum
    # where they run on several streams at once.
    "gpu": ("gpu_busy_time_s", "forward_gpu_busy_time_s"),
    "n": ("n_kernels", "forward_n_kernels"),
    # From a CUDA graph, kernels that eager launches leave apart may run at once.
    "graph": ("graph_busy_time_s", "forward_graph_busy_time_s"),
}


def call_sequence(net_ops: pd.DataFrame) -> list[str]:
    """The network's op ids in call order, from its op table's ``positions``.

    Raises:
        PredictorError: the table has no call order (from an older opcost extract).
    """
    if "positions" not in net_ops.columns:
        raise PredictorError(
            "the op table records no call order (no 'positions' column); extract the "
            "network again (opcost extract) to predict by replay"
        )
    calls = sorted(
        (int(p), str(oid))
        for oid, positions in zip(net_ops["op_id"], net_ops["positions"], strict=True)
        for p in str(positions).split(",")
        if p.strip()
    )
    return [oid for _, oid in calls]


def step_entries(
    seq: Sequence[str],
    ops: pd.DataFrame,
    training: bool,
    backward_extra: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The replayed step's entries (``op_id``, ``host``, ``gpu``, ``n`` kernels that take
    the device's gap (:func:`opcost.replay.gapped_kernels`), ``graph``:
    the GPU's busy time from a CUDA graph, ``phase``) from per-op predictions indexed by
    op id: inference, each call; training, each call's forward part in order, then each
    call's backward part in reverse order, times ``backward_extra``'s ``share`` of an op
    id's calls that run one and with its ``host``, ``gpu``, ``n`` and ``graph`` per call
    added (the network's gradient sums, :func:`gradient_sum_entries`). Predictions
    without graph busy times take the busy times for them."""
    o = ops.reindex(list(seq))
    for graph, gpu in zip(_STEP_COLUMNS["graph"], _STEP_COLUMNS["gpu"], strict=True):
        if graph not in o:
            o[graph] = o[gpu]
    whole = {k: o[c[0]].to_numpy(dtype=float) for k, c in _STEP_COLUMNS.items()}
    whole["n"] = rp.gapped_kernels(whole["n"], whole["gpu"], o["gpu_time_s"])
    ids = o.index.to_numpy()
    if not training:
        return pd.DataFrame({"op_id": ids, **whole, "phase": "forward"})
    fwd = {k: o[c[1]].to_numpy(dtype=float) for k, c in _STEP_COLUMNS.items()}
    fwd["n"] = rp.gapped_kernels(fwd["n"], fwd["gpu"], o["forward_gpu_time_s"])
    bwd = {k: (whole[k] - fwd[k])[::-1].clip(min=0) for k in whole}
    if backward_extra is not None:
        extra = backward_extra.reindex(list(seq)).fillna({"share": 1.0}).fillna(0.0)
        share = extra["share"].to_numpy(dtype=float)[::-1]
        for k in bwd:
            bwd[k] = bwd[k] * share + extra[k].to_numpy(dtype=float)[::-1]
    return pd.concat(
        [
            pd.DataFrame({"op_id": ids, **fwd, "phase": "forward"}),
            pd.DataFrame({"op_id": ids[::-1], **bwd, "phase": "backward"}),
        ],
        ignore_index=True,
    )


def gradient_sum_entries(
    net_ops: pd.DataFrame, model: OpModel, host_probe_s: float
) -> pd.DataFrame | None:
    """Per op id of a network's op table with :data:`opcost.model.grad_sums.COLUMNS`, the
    ``share`` of its calls that run a backward pass, and what their gradient sums add to
    it: GPU time (busy, and from a graph) at the GPU's measured memory rate and shortest
    kernel (:func:`opcost.model.grad_sums.sum_time_s`), one kernel per add, and per add
    the host time of a backward node that launches one kernel (``backward_node_ratio``:
    autograd's engine dispatches the add). None for a table without those columns."""
    if not all(c in net_ops for c in grad_sums.COLUMNS):
        return None
    adds = net_ops[grad_sums.COLUMNS[0]].to_numpy(dtype=float)
    gpu = grad_sums.sum_time_s(
        adds,
        net_ops[grad_sums.COLUMNS[1]].to_numpy(dtype=float),
        model.peaks.memory_bytes_per_s,
        model.kernel_floor_s,
    )
    host = adds * model.backward_node_ratio * host_probe_s
    share = net_ops[grad_sums.COLUMNS[2]].to_numpy(dtype=float)
    extra = pd.DataFrame(
        {"host": host, "gpu": gpu, "n": adds, "graph": gpu, "share": share},
        index=net_ops["op_id"].to_numpy(),
    )
    return extra[~extra.index.duplicated()]


def replay_networks(
    models: dict[str, OpModel],
    ops: pd.DataFrame,
    modes: Sequence[str] | None = None,
    host_probe_s: float | None = None,
) -> NetworkPrediction:
    """Predict networks from their op tables by replay on every GPU configuration's op
    models (module docstring).

    Args:
        models: GPU configuration -> op models (:func:`load_op_models`).
        ops: op table(s) as ``opcost extract`` writes them: ``op_id``, ``spec``,
            ``count``, ``positions``, and ``model_input`` (the network; one if absent).
        modes: modes to predict (default: both).
        host_probe_s: the host-speed probe of the host to predict for (None:
            :func:`common_probe_s`); every configuration is predicted for that one host,
            so that they differ only by their GPUs.

    Raises:
        PredictorError: an empty op table, one without call order, or an unknown mode.
    """
    if ops.empty:
        raise PredictorError("the network has no operations to predict")
    if not models:
        raise PredictorError("no op models to predict with")
    modes = list(modes) if modes is not None else list(MODES)
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise PredictorError(f"unknown mode {unknown[0]!r} (one of {', '.join(MODES)})")
    if host_probe_s is None:
        host_probe_s = common_probe_s(models)
    ops = ops.copy()
    if "model_input" not in ops.columns:
        ops["model_input"] = "network"
    # Python strings: Arrow-backed columns are slow to iterate.
    for column in ("op_id", "spec", "model_input", "positions"):
        if column in ops:
            ops[column] = ops[column].astype(str).astype(object)
    tables = {str(n): g for n, g in ops.groupby("model_input", sort=False)}
    sequences = {n: call_sequence(g) for n, g in tables.items()}
    # The op cache's columns: predicting from them needs no torch.
    carried = [c for c in (*leaf_grads.COLUMNS, *inplace_saves.COLUMNS) if c in ops]
    distinct = ops.drop_duplicates("op_id")[["op_id", "spec", *carried]].reset_index(drop=True)
    distinct["op_type"] = [json.loads(s)["type"] for s in distinct["spec"]]
    grouped = set(distinct.loc[[grouped_conv(s) for s in distinct["spec"]], "op_id"])
    rows, op_rows, flagged = [], [], []
    for gpu in sorted(models):
        model = models[gpu]
        flags = _extrapolation(distinct, model)
        # Every mode in one call: the models' fixed cost per call dominates small tables.
        both = pd.concat([distinct.assign(mode=m) for m in modes], ignore_index=True)
        predicted = model.predict(both, host_probe_s=host_probe_s)
        predicted.index = both["op_id"]
        for mode in modes:
            pred = predicted[(both["mode"] == mode).to_numpy()]
            for network, seq in sequences.items():
                training = mode == "training"
                extra = (
                    gradient_sum_entries(tables[network], model, host_probe_s) if training else None
                )
                steps = step_entries(seq, pred, training, extra)
                r = rp.replay(
                    list(steps["host"]),
                    list(steps["gpu"]),
                    list(steps["n"]),
                    kernel_gap_s=model.kernel_gap_s,
                    sync_s=model.sync_s,
                )
                busy_w = pred["busy_power_w"].reindex(steps["op_id"]).to_numpy()
                gpu_s = steps["gpu"].to_numpy()
                busy_j = float(np.nansum(gpu_s * busy_w))
                gpu_sum = float(gpu_s.sum())
                grouped_s = float(gpu_s[steps["op_id"].isin(grouped).to_numpy()].sum())
                energy = rp.step_energy_j(busy_j, model.wait_power_w, r.time_s, gpu_sum)
                # Busy power is learnt from windows run from graphs: the power of a
                # call's kernels as a graph runs them, for their busy time there.
                graph_gpu_s = steps["graph"].to_numpy()
                graph = rp.graph_replay(list(graph_gpu_s), list(steps["n"]))
                graph_energy = rp.step_energy_j(
                    float(np.nansum(graph_gpu_s * busy_w)),
                    model.wait_power_w,
                    graph.time_s,
                    float(graph_gpu_s.sum()),
                )
                if not np.isfinite(energy):
                    energy = np.nan
                if not np.isfinite(graph_energy):
                    graph_energy = np.nan
                rows.append(
                    {
                        "network": network,
                        "gpu": gpu,
                        "setting": SETTING,
                        "mode": mode,
                        "time_s": r.time_s,
                        "power_w": energy / r.time_s if r.time_s > 0 else np.nan,
                        "energy_j": energy,
                        "host_time_s": r.host_s,
                        "gpu_busy_s": r.gpu_busy_s,
                        "bound": r.bound,
                        "graph_time_s": graph.time_s,
                        "graph_energy_j": graph_energy,
                        "grouped_conv_share": grouped_s / gpu_sum if gpu_sum > 0 else 0.0,
                    }
                )
                per_call = steps.groupby("op_id", sort=False)[["host", "gpu"]].sum()
                per_call = per_call.rename(columns={"host": "host_pred_s", "gpu": "gpu_pred_s"})
                op_rows.append(per_call.reset_index().assign(network=network, gpu=gpu, mode=mode))
        if len(flags):
            for network, net_ops in ops.groupby("model_input", sort=False):
                f = net_ops[["op_id", "count"]].merge(flags, on="op_id")
                flagged.append(f.assign(network=network, gpu=gpu))
    table = pd.DataFrame(rows)
    table["edp_js"] = table["energy_j"] * table["time_s"]
    shape = ops.groupby("model_input", sort=False).agg(
        n_ops=("op_id", "nunique"), n_calls=("count", "sum")
    )
    table = table.join(shape, on="network")
    extrapolation = (
        pd.concat(flagged, ignore_index=True)
        if flagged
        else pd.DataFrame(columns=["network", "gpu", "op_id", "type", "count", "reason"])
    )[["network", "gpu", "op_id", "type", "count", "reason"]]
    n_flagged = extrapolation.groupby(["network", "gpu"])["op_id"].nunique()
    table["n_extrapolated"] = [
        int(n_flagged.get((n, g), 0)) for n, g in zip(table["network"], table["gpu"], strict=True)
    ]
    best = best_choices(table, lambda gpu, mode, criterion: None)
    return NetworkPrediction(
        table=table.sort_values(["network", "mode", "gpu"], ignore_index=True),
        best=best,
        per_op=pd.DataFrame(columns=PER_OP_COLUMNS),
        extrapolation=extrapolation,
        op_predictions=pd.concat(op_rows, ignore_index=True),
    )


def common_probe_s(models: dict[str, OpModel]) -> float:
    """The host probe a prediction assumes where none is given: the median of the hosts
    that measured the op models' samples."""
    return float(np.median([m.host_probe_s for m in models.values()]))


def _extrapolation(distinct: pd.DataFrame, model: OpModel) -> pd.DataFrame:
    """The distinct ops the op models never sampled the like of (their family, their
    type, or sizes beyond the sampled ranges): ``op_id``, ``type``, ``reason``."""
    out = []
    for oid, op_type, spec in zip(
        distinct["op_id"], distinct["op_type"], distinct["spec"], strict=True
    ):
        family = family_of(op_type)
        if family in NO_KERNEL_FAMILIES and family not in model.families:
            continue
        fam = model.families.get(model_key(family, op_type)) or model.families.get(family)
        if fam is None:
            out.append((oid, op_type, UNSAMPLED_FAMILY))
        elif op_type not in fam.schema.op_types:
            out.append((oid, op_type, UNSAMPLED_TYPE))
        elif outside := fam.outside(spec):
            out.append((oid, op_type, OUTSIDE_SIZES + ", ".join(outside)))
    return pd.DataFrame(out, columns=["op_id", "type", "reason"])
