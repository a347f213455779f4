"""A traced network's GPU time op type by op type, against what the op models predict.

    python bench/op_breakdown.py --op-models DIR TRACE [TRACE ...] [--top 20]

Each ``TRACE`` is a network's trace record (``{gpu}/{setting}/{mode}/traces/networks/
{model_input}.json``, as ``experiments/graph_networks.py`` or the pipeline's trace jobs
write it; a ``.tar.gz`` of such records is read whole). Its breakdown names the op of
every call of one traced step (forward, and in training the backward nodes mapped to the
call that made them); the network is extracted afresh and its calls predicted with the
op models of the trace's GPU configuration as ``opcost predict`` replays them
(:func:`opcost.predict_replay.step_entries`: a call's forward and backward parts, the
gradient sums its outputs need). Printed per op type, largest difference first: calls,
GPU busy time and kernels, predicted and traced, then the totals.

Autograd's glue, named by no call (``AccumulateGrad`` adding a parameter's gradient into
``.grad``), is given to the call whose backward node ran just before it, the one that
made that gradient: an op measured alone pays its parameters' accumulation too. The
breakdown must come from a trace whose calls are named as extraction records them
(traces recorded since 2026-11-30); in an older one, a composite module's calls
(Swin's window attention) are one call under an op id extraction no longer makes, and
show as ``(not extracted)``.
"""

from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from opcost.extract import extract_model_input, with_gradient_sums
from opcost.model.opmodel_format import load_op_models
from opcost.names import ModelInput
from opcost.predict_replay import call_sequence, gradient_sum_entries, step_entries

GLUE = "(autograd glue)"
NOT_EXTRACTED = "(not extracted)"
GRAD_SUMS = "(gradient sums)"


def traced_calls(record: dict) -> pd.DataFrame:
    """The record's breakdown, each row with the op id it is charged to (``op_id``): its
    own, else, for a backward row of no call, the op of the row before it."""
    rows = pd.DataFrame(record["breakdown"])
    op = rows["op_id"].where(rows["op_id"].notna())
    backward = rows["phase"].eq("backward")
    charged = op.where(~backward, op.ffill())
    return rows.assign(op_id=charged, glue=op.isna())


def predicted_calls(
    table: pd.DataFrame, sequence: list[str], model, mode: str, host_probe_s: float
) -> pd.DataFrame:
    """Per replayed entry of one step of the network of ``table`` whose calls are
    ``sequence`` (:func:`opcost.predict_replay.call_sequence`): ``op_id``, ``phase``,
    ``gpu`` busy seconds and ``n`` kernels, as :func:`opcost.predict_replay.replay_networks`
    replays them; the gradient sums as their own entries (``op_id`` :data:`GRAD_SUMS`)."""
    distinct = table.drop_duplicates("op_id")[["op_id", "spec"]].reset_index(drop=True)
    distinct["op_type"] = [json.loads(s)["type"] for s in distinct["spec"]]
    pred = model.predict(distinct.assign(mode=mode), host_probe_s=host_probe_s)
    pred.index = distinct["op_id"].to_numpy()
    training = mode == "training"
    extra = gradient_sum_entries(table, model, host_probe_s) if training else None
    steps = step_entries(sequence, pred, training, None if extra is None else
                         extra.assign(host=0.0, gpu=0.0, n=0.0, graph=0.0))  # fmt: skip
    out = steps.assign(gpu=steps["graph"])[["op_id", "phase", "gpu", "n"]]
    if extra is not None:
        calls = pd.Series(sequence).value_counts()
        sums = extra.assign(calls=extra.index.map(calls).fillna(0))
        out = pd.concat(
            [out, pd.DataFrame({"op_id": [GRAD_SUMS], "phase": ["backward"],
                                "gpu": [float((sums["graph"] * sums["calls"]).sum())],
                                "n": [float((sums["n"] * sums["calls"]).sum())]})],
            ignore_index=True,
        )  # fmt: skip
    return out


def compare(record: dict, models: dict) -> pd.DataFrame:
    """Per op type of one traced network: calls, predicted and traced GPU busy time (µs)
    and kernels."""
    name = record["model_input"]
    mi = ModelInput.from_name(name)
    table = with_gradient_sums(extract_model_input(mi), mi)
    types = dict(zip(table["op_id"], [json.loads(s)["type"] for s in table["spec"]], strict=True))
    types[GRAD_SUMS] = GRAD_SUMS
    sequence = call_sequence(table)
    pred = predicted_calls(
        table, sequence, models[record["gpu"]], record["mode"], record["host_probe_s"]
    )
    traced = traced_calls(record)
    busy = "gpu_busy_s" if "gpu_busy_s" in traced else "gpu_s"
    traced["type"] = traced["op_id"].map(types).fillna(NOT_EXTRACTED)
    traced.loc[traced["op_id"].isna(), "type"] = GLUE
    pred["type"] = pred["op_id"].map(types)
    calls = pd.Series(sequence).map(types).value_counts()
    out = pd.DataFrame(
        {
            "calls": calls,
            "pred_us": pred.groupby("type")["gpu"].sum() * 1e6,
            "traced_us": traced.groupby("type")[busy].sum() * 1e6,
            "pred_kernels": pred.groupby("type")["n"].sum(),
            "traced_kernels": traced.groupby("type")["n_kernels"].sum(),
            "glue_us": traced[traced["glue"]].groupby("type")[busy].sum() * 1e6,
        }
    ).fillna(0.0)
    out.index = [t.removeprefix("torch.nn.modules.").removeprefix("torch.") for t in out.index]
    out["diff_us"] = out["pred_us"] - out["traced_us"]
    return out


def records(paths: list[Path], tmp: Path) -> list[dict]:
    found = []
    for path in paths:
        if path.name.endswith(".tar.gz"):
            with tarfile.open(path) as tar:
                tar.extractall(tmp / path.name, filter="data")
            found += records(sorted((tmp / path.name).rglob("traces/networks/*.json")), tmp)
        else:
            record = json.loads(path.read_text())
            if record.get("status") == "ok" and record.get("breakdown"):
                found.append(record)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--op-models", type=Path, default=Path("results/op-models"))
    parser.add_argument("--top", type=int, default=20, help="op types shown per network")
    args = parser.parse_args()
    models = load_op_models(args.op_models)
    pd.set_option("display.width", 200)
    with tempfile.TemporaryDirectory() as tmp:
        for record in records(args.traces, Path(tmp)):
            if record["gpu"] not in models:
                print(f"{record['model_input']}: no op models of {record['gpu']}; skipped")
                continue
            t = compare(record, models)
            pred, traced = t["pred_us"].sum(), t["traced_us"].sum()
            print(
                f"\n== {record['model_input']} {record['mode']} on {record['gpu']} "
                f"({record['gpu_name']}): predicted {pred:.0f} µs, traced {traced:.0f} µs "
                f"({100 * (pred / traced - 1):+.1f} %); kernels {t['pred_kernels'].sum():.0f} "
                f"against {t['traced_kernels'].sum():.0f}; glue {t['glue_us'].sum():.0f} µs "
                "given to the calls before it"
            )
            order = np.argsort(-t["diff_us"].abs().to_numpy())[: args.top]
            shown = t.iloc[order].drop(columns="glue_us")
            print(shown.round(1).to_string())


if __name__ == "__main__":
    main()
