"""Networks in no study, predicted by the op models alone, against real H100 and H200 runs.

    python bench/unseen_networks.py [--traces tests/data/unseen_networks/traces*.tar.gz]
                                    [--op-models results/op-models] [--csv out.csv]

The traces (``experiments/graph_networks.py --models ...``: ten torchvision networks that no
study of this project profiles, at batch 1, 8 and 64, both modes, each GPU configuration in
one run on one host; one or more tarballs, by default every ``traces*.tar.gz`` of
``tests/data/unseen_networks``) hold each network's eager step (``wall_time_s``, with the
host's probe) and its step replayed from a CUDA graph (``graph_time_s``,
``graph_energy_j``). Each network is extracted here and predicted as ``opcost predict
--op-models`` does (:func:`opcost.predict_replay.replay_networks`): from a graph
(``graph_time_s``, ``graph_energy_j``), and eagerly for the traced host's probe
(``time_s``). The op models never saw an op of a network. Prints, per GPU configuration and
mode, the MAPE and the median signed miss of each, per batch, and the choice between the
H100 and the H200 from a graph against the measured one, for each TF32 setting traced on
both GPUs.
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
from opcost.model.format import load_predictors
from opcost.model.opmodel_format import load_op_models
from opcost.names import ModelInput
from opcost.predict import predict_networks
from opcost.predict_replay import replay_networks
from opcost.validate.predictions import choice_scores, configuration_choice

REPO = Path(__file__).resolve().parents[1]


def measured(traces: list[Path]) -> pd.DataFrame:
    """One row per traced network, GPU configuration and mode whose step was captured, from
    every tarball of ``traces``."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for tarball in traces:
            with tarfile.open(tarball) as tar:
                tar.extractall(tmp, filter="data")
        for path in sorted(Path(tmp).glob("*/*/*/traces/networks/*.json")):
            r = json.loads(path.read_text())
            if r.get("status") != "ok" or r.get("graph_status") != "ok":
                reason = r.get("failure_reason") or r.get("graph_failure_reason") or ""
                print(f"not measured: {r['gpu']} {r['mode']} {r['model_input']}: {reason[:60]}")
                continue
            rows.append({k: r[k] for k in (
                "gpu", "mode", "model_input", "wall_time_s", "host_probe_s", "graph_time_s",
                "graph_energy_j", "gpu_time_s", "host_time_s")})  # fmt: skip
    return pd.DataFrame(rows)


def op_tables(model_inputs: list[str]) -> dict[str, pd.DataFrame]:
    """Each network's op table (``opcost extract``), extracted once, by its name."""
    tables = {}
    for name in model_inputs:
        mi = ModelInput.from_name(name)
        tables[name] = with_gradient_sums(extract_model_input(mi), mi).assign(model_input=name)
    return tables


def predicted(nets: pd.DataFrame, models: dict, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    out = []
    for r in nets.itertuples(index=False):
        p = replay_networks(
            {r.gpu: models[r.gpu]}, tables[r.model_input], [r.mode], host_probe_s=r.host_probe_s
        ).table.iloc[0]
        out.append(
            {**r._asdict(), "batch": int(r.model_input.rsplit("_", 1)[1].split("x")[0]),
             "pred_graph_time_s": p["graph_time_s"], "pred_graph_energy_j": p["graph_energy_j"],
             "pred_time_s": p["time_s"], "n_extrapolated": int(p.get("n_extrapolated", 0))}
        )  # fmt: skip
    t = pd.DataFrame(out)
    t["graph_time"] = t["pred_graph_time_s"] / t["graph_time_s"] - 1
    t["graph_energy"] = t["pred_graph_energy_j"] / t["graph_energy_j"] - 1
    t["eager_time"] = t["pred_time_s"] / t["wall_time_s"] - 1
    return t


def forest_baseline(
    t: pd.DataFrame, forests: Path, tables: dict[str, pd.DataFrame]
) -> pd.DataFrame:
    """``forest_time``: what ``opcost predict`` answers with the forests in ``forests``
    (the shipped ones by default), as a miss of the eager step."""
    predictors = load_predictors(forests)
    ops = pd.concat([tables[mi] for mi in t["model_input"].unique()], ignore_index=True)
    wanted = {g: predictors[g] for g in t["gpu"].unique() if g in predictors}
    table = predict_networks(wanted, ops).table
    table = table[table["setting"] == "default"].rename(
        columns={"network": "model_input", "time_s": "forest_time_s"}
    )[["model_input", "gpu", "mode", "forest_time_s"]]
    t = t.merge(table, on=["model_input", "gpu", "mode"], how="left")
    t["forest_time"] = t["forest_time_s"] / t["wall_time_s"] - 1
    return t


def report(t: pd.DataFrame) -> None:
    cols = tuple(c for c in ("graph_time", "graph_energy", "eager_time", "forest_time")
                 if c in t.columns)  # fmt: skip
    print(
        "MAPE (median signed miss) of the op models' prediction against the measured step"
        + (
            "; forest_time: the forests' eager time (opcost predict's default)"
            if "forest_time" in t.columns
            else ""
        )
    )
    for (gpu, mode, batch), g in t.groupby(["gpu", "mode", "batch"]):
        figures = "  ".join(
            f"{c} {g[c].abs().mean() * 100:5.1f}% ({g[c].median() * 100:+5.1f}%)" for c in cols
        )
        print(f"{gpu:12s} {mode:9s} batch {batch:3d} n={len(g):2d}  {figures}")
    for (gpu, mode), g in t.groupby(["gpu", "mode"]):
        figures = "  ".join(f"{c} {g[c].abs().mean() * 100:5.1f}%" for c in cols)
        print(f"{gpu:12s} {mode:9s} all       n={len(g):2d}  {figures}")
    figures = "  ".join(f"{c} {t[c].abs().mean() * 100:5.1f}%" for c in cols)
    print(f"all                              n={len(t)}  {figures}")
    within = {c: float((t[c].abs() <= 0.10).mean() * 100) for c in cols}
    print("within 10 %: " + ", ".join(f"{c} {v:.0f}% of cases" for c, v in within.items()))
    choice(t)


def choice(t: pd.DataFrame, margin: float = 0.05) -> None:
    """From a graph, the H100 or the H200: right where the measured margin exceeds 5 %?
    (:func:`opcost.validate.predictions.configuration_choice` and its scores.) Among the
    configurations of one TF32 setting (``h100``, ``h200``; ``h100-notf32``,
    ``h200-notf32``), where more than one GPU was traced."""
    graph = t.rename(
        columns={"graph_time_s": "time_s", "pred_graph_time_s": "time_pred_s",
                 "graph_energy_j": "energy_j", "pred_graph_energy_j": "energy_pred_j"}
    ).assign(setting="default")  # fmt: skip
    numerics = graph["gpu"].str.partition("-")[2]
    for variant, part in graph.groupby(numerics):
        if part["gpu"].nunique() < 2:
            continue
        picks = configuration_choice(part)
        for what, s in choice_scores(picks, margin).items():
            print(
                f"choice of GPU{f' ({variant})' if variant else ''}, {what}: {s['clear']} "
                f"clear cases of {len(picks)}, right "
                f"{s['right']}; baseline 'always {s['constant']}' right {s['constant_right']}; "
                f"in the {s['missed']} cases it misses, right {s['right_where_missed']}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--traces",
        type=Path,
        nargs="+",
        default=sorted((REPO / "tests/data/unseen_networks").glob("traces*.tar.gz")),
    )
    parser.add_argument("--op-models", type=Path, default=REPO / "results/op-models")
    parser.add_argument(
        "--forests",
        default=str(REPO / "src/opcost/predictors"),
        help="forest predictors to compare eagerly with ('' for none; default: the shipped)",
    )
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()
    nets = measured(args.traces)
    tables = op_tables(sorted(nets["model_input"].unique()))
    t = predicted(nets, load_op_models(args.op_models), tables)
    if args.forests:
        t = forest_baseline(t, Path(args.forests), tables)
    if args.csv:
        t.to_csv(args.csv, index=False)
    with np.errstate(all="ignore"):
        report(t)


if __name__ == "__main__":
    main()
