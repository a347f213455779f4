"""Networks run from CUDA graphs against their replay: issue 22's figures with graphs.

    python bench/graph_replay.py [--traces tests/data/graph_networks/traces.tar.gz]
                                 [--op-models results/op-models] [--csv out.csv]

The traces (``experiments/graph_networks.py``: the Hopper studies' networks, eager and
from a CUDA graph, in one run on one host per GPU configuration) are set beside the
committed studies' isolated ops (``data/hopper``, ``data/hopper-large``: other hosts,
other days) in :func:`opcost.validate.replay.replay_validation`, which replays each
network from a CUDA graph (:func:`opcost.replay.graph_replay`) from the isolated ops' GPU
times and from its own eager breakdown. With ``--op-models``, each network is also
predicted from the op models alone (``opcost predict --op-models``'s ``graph_time_s``
and ``graph_energy_j``; they never saw a network op). Per GPU configuration and mode:
the median and largest |miss| in time and energy against the measured graph step, the
median signed miss, and how much faster the graph ran than the eager step; then the
cases beyond 10 %.
"""

from __future__ import annotations

import argparse
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

from opcost import trace_eval
from opcost.validate.replay import call_sequences, replay_validation

REPO = Path(__file__).resolve().parents[1]
STUDIES = (REPO / "data/hopper", REPO / "data/hopper-large")


def op_tables() -> list[Path]:
    return sorted(p for s in STUDIES for p in (s / "ops").glob("*x*.parquet"))


def validation(traces: Path) -> pd.DataFrame:
    """replay_validation of the traced networks on the committed studies' isolated ops."""
    seqs = call_sequences(op_tables())
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(traces) as tar:
            tar.extractall(tmp, filter="data")
        for gpu_dir in sorted(p for p in Path(tmp).iterdir() if p.is_dir()):
            gpu = gpu_dir.name
            ops = pd.concat(
                [pd.read_parquet(s / gpu / "dataset" / f"{gpu}.parquet") for s in STUDIES],
                ignore_index=True,
            )
            ops = ops[ops["kind"] == "op"].drop_duplicates(["setting", "mode", "op_id"])
            paths = sorted(gpu_dir.glob("*/*/traces/networks/*.json"))
            nets = trace_eval.network_rows(paths)
            spans = [row for path in paths for row in trace_eval.breakdown_rows(path)]
            dataset = pd.concat([ops, pd.DataFrame(nets)], ignore_index=True)
            out.append(replay_validation(dataset, seqs, pd.DataFrame(spans)))
    return pd.concat(out, ignore_index=True)


def op_model_predictions(op_models: Path) -> pd.DataFrame:
    """Each network of the committed studies extracted as ``opcost predict`` extracts it
    (the studies' op tables may predate what extraction records now) and predicted from
    the op models."""
    from opcost.extract import extract_model_input, with_gradient_sums
    from opcost.model.opmodel_format import load_op_models
    from opcost.names import ModelInput
    from opcost.predict_replay import replay_networks

    tables = []
    for path in op_tables():  # each a network's, named model_batchxcxhxw
        mi = ModelInput.from_name(path.stem)
        tables.append(with_gradient_sums(extract_model_input(mi), mi))
    ops = pd.concat(tables, ignore_index=True)
    result = replay_networks(load_op_models(op_models), ops)
    return result.table.rename(columns={"network": "model_input"})[
        ["gpu", "mode", "model_input", "graph_time_s", "graph_energy_j"]
    ].rename(
        columns={"graph_time_s": "opmodel_graph_time_s", "graph_energy_j": "opmodel_graph_energy_j"}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--traces", type=Path, default=REPO / "tests/data/graph_networks/traces.tar.gz"
    )
    parser.add_argument("--op-models", type=Path, help="op models to predict with too")
    parser.add_argument("--csv", type=Path, help="write the per-network table here")
    args = parser.parse_args()
    t = validation(args.traces)
    misses = {
        "own": ("replay_own_graph_time_s", "graph_time_s"),
        "isolated": ("replay_isolated_graph_time_s", "graph_time_s"),
        "isolated energy": ("replay_isolated_graph_energy_j", "graph_energy_j"),
    }
    if args.op_models:
        t = t.merge(op_model_predictions(args.op_models), on=["gpu", "mode", "model_input"])
        misses["op models"] = ("opmodel_graph_time_s", "graph_time_s")
        misses["op models energy"] = ("opmodel_graph_energy_j", "graph_energy_j")
    for name, (pred, ref) in misses.items():
        t[name] = t[pred] / t[ref] - 1
    t["eager / graph"] = t["trace_wall_time_s"] / t["graph_time_s"]
    print(f"{len(t)} network-mode-configuration cases run from CUDA graphs")
    print("per configuration and mode: median |miss| / largest |miss| (median signed miss)")
    for (gpu, mode), g in t.groupby(["gpu", "mode"]):
        parts = [
            f"{name} {g[name].abs().median():5.1%}/{g[name].abs().max():5.1%} "
            f"({g[name].median():+5.1%})"
            for name in misses
        ]
        print(
            f"{gpu:12s} {mode:9s} n={len(g):2d} eager/graph x{g['eager / graph'].median():4.2f}  "
            + "  ".join(parts)
        )
    print(
        f"all                    n={len(t):3d}  "
        + "  ".join(f"{name} {t[name].abs().median():5.1%}" for name in misses)
    )
    for name in misses:
        within = (t[name].abs() <= 0.05).mean()
        print(
            f"{name}: within 5 % in {within:.0%} of cases, within 10 % in "
            f"{(t[name].abs() <= 0.10).mean():.0%}"
        )
    far = t[(t[list(misses)].abs() > 0.10).any(axis=1)]
    if len(far):
        print("\ncases beyond 10 %:")
        cols = ["gpu", "mode", "model_input", *misses]
        print(far[cols].to_string(index=False, float_format=lambda v: f"{v:+.1%}"))
    if args.csv:
        t.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
