"""Issue #9's accuracy figures, recomputed from the committed real datasets.

    python bench/accuracy.py [--skip-lono] [--time-target log_time|roofline_ratio]

For each committed study (tests/data/<name>: dataset, op tables) it prints:

- dataset validation: per mode, how many model-input sets' summed operations are within
  5 % of the measured network in time and in energy, and the median |difference|; the
  same for GPU-busy time (time x nvidia-smi's utilisation: the GPU's share of the time,
  ``gpu_busy_rel_diff`` of ``opcost.validate.dataset.dataset_validation``), within 10 %;
  and the overlap estimate of the network's time (``time_overlap_rel_diff``), within 5 %;
- leave-one-network-out (LONO) mean absolute percentage error of whole-network time and
  energy per mode, from training the study's predictor afresh (``opcost.train``, the
  defaults of ``config/config.yaml`` unless the study has its own config; ``--time-target``
  overrides its ``train.time_target``), which takes a minute or two per study on 2 cores;
- choice: for studies measured on several GPU configurations, per network and mode, whether
  the LONO predictions name the configuration the measurements show fastest, and the one
  using least energy (``opcost.validate.predictions.configuration_choice``), and the share
  of cases where they agree, over all cases and over those where the measured best wins
  by more than 10 %;
- how far two measurements of the same op lie apart: the ops TF32 does not touch,
  measured in both the TF32-on and the TF32-off run of a GPU (TF32_PAIRS);
- the measured effect of TF32 on whole networks.

The README's accuracy table is what this prints (with GPU and date from each study's
README).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from opcost.train import TIME_TARGETS, TrainConfig, TrainOutputs, train_gpu
from opcost.validate.dataset import dataset_validation, read_network_ops
from opcost.validate.predictions import configuration_choice, prediction_networks

REPO = Path(__file__).resolve().parents[1]
HOPPER = "data/hopper"
HOPPER_LARGE = "data/hopper-large"
#: The GPU configurations both issue #9 studies were measured on.
HOPPER_GPUS = ("h100", "h200", "h100-notf32", "h200-notf32")
STUDIES = {
    # name: (dataset directory, GPU configuration, study config for the train section,
    #        directory of the op tables)
    "h100 sample (4x3x64x64)": (
        "tests/data/h100",
        "h100",
        "config/h100-sample.yaml",
        "tests/data/h100/ops",
    ),
    "h200 sample (4x3x64x64)": (
        "tests/data/h200",
        "h200",
        "config/h200-sample.yaml",
        "tests/data/h200/ops",
    ),
    **{
        f"{gpu} hopper (8 families x 2)": (
            f"{HOPPER}/{gpu}",
            gpu,
            "config/hopper.yaml",
            f"{HOPPER}/ops",
        )
        for gpu in HOPPER_GPUS
    },
    **{
        f"{gpu} hopper-large (8 families x 64)": (
            f"{HOPPER_LARGE}/{gpu}",
            gpu,
            "config/hopper-large.yaml",
            f"{HOPPER_LARGE}/ops",
        )
        for gpu in HOPPER_GPUS
    },
}
#: Studies of one set of networks on several GPU configurations: the choice among them.
CHOICES = {
    "sample 4x3x64x64, h100 vs h200": ("h100 sample (4x3x64x64)", "h200 sample (4x3x64x64)"),
    "hopper, h100 vs h200 (TF32 on)": (
        "h100 hopper (8 families x 2)",
        "h200 hopper (8 families x 2)",
    ),
    "hopper, four configurations (h100, h200, TF32 on and off)": tuple(
        f"{gpu} hopper (8 families x 2)" for gpu in HOPPER_GPUS
    ),
    "hopper-large, h100 vs h200 (TF32 on)": (
        "h100 hopper-large (8 families x 64)",
        "h200 hopper-large (8 families x 64)",
    ),
    "hopper-large, four configurations (h100, h200, TF32 on and off)": tuple(
        f"{gpu} hopper-large (8 families x 64)" for gpu in HOPPER_GPUS
    ),
}
#: A measured best that beats the runner-up by less than this is within the run-to-run
#: spread of host-bound measurements (docs/validation.md): the choice is printed for
#: all cases and for those beyond it.
CLEAR_MARGIN = 0.10


def _op_tables(ops: Path) -> list[Path]:
    return sorted(p for p in ops.glob("*.parquet") if p.name != "unique.parquet")


def validation_summary(directory: Path, gpu: str, ops: Path) -> pd.DataFrame:
    dataset = pd.read_parquet(directory / "dataset" / f"{gpu}.parquet")
    table = dataset_validation(dataset, read_network_ops(_op_tables(ops)))
    table = table[table["ops_included"] == "all"]
    rows = []
    for mode, part in table.groupby("mode"):
        rows.append(
            {
                "mode": mode,
                "sets": len(part),
                "time within 5 %": int((part["time_rel_diff"].abs() < 0.05).sum()),
                "energy within 5 %": int((part["energy_rel_diff"].abs() < 0.05).sum()),
                "median |time diff| %": round(100 * part["time_rel_diff"].abs().median(), 1),
                "median |energy diff| %": round(100 * part["energy_rel_diff"].abs().median(), 1),
                "GPU-busy within 10 %": int((part["gpu_busy_rel_diff"].abs() < 0.10).sum()),
                "median |GPU-busy diff| %": round(
                    100 * part["gpu_busy_rel_diff"].abs().median(), 1
                ),
                "overlap time within 5 %": int((part["time_overlap_rel_diff"].abs() < 0.05).sum()),
                "median |overlap time diff| %": round(
                    100 * part["time_overlap_rel_diff"].abs().median(), 1
                ),
            }
        )
    return pd.DataFrame(rows)


def lono_summary(
    directory: Path, gpu: str, config: Path, ops: Path, train: dict | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The LONO table per mode, and the per-network LONO predictions.

    ``train``: keys that override the config's ``train`` section.
    """
    section = yaml.safe_load(config.read_text()).get("train") or {}
    cfg = TrainConfig.from_config({**section, **(train or {})})
    with tempfile.TemporaryDirectory() as tmp:
        outputs = TrainOutputs.under(tmp)
        metrics = train_gpu(
            directory / "dataset" / f"{gpu}.parquet",
            _op_tables(ops),
            outputs,
            cfg,
            gpu,
        )
        networks = pd.read_parquet(outputs.networks)
    rows = []
    for mode, scores in metrics["lono"]["network"].items():
        if mode == "all":
            continue
        rows.append(
            {
                "mode": mode,
                "networks": scores["n"],
                "LONO time MAPE %": round(scores["time_mape_pct"], 1),
                "LONO energy MAPE %": round(scores["energy_mape_pct"], 1),
            }
        )
    return pd.DataFrame(rows), networks


def choice_summary(networks: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per network and mode, the configurations measured and predicted best."""
    choice = configuration_choice(prediction_networks(networks))
    return choice.drop(columns="candidates")


#: GPU configurations measured with TF32 on and off in one study: (label, study directory,
#: GPU configuration with TF32 on; the one with it off is named ``{gpu}-notf32``).
TF32_PAIRS = (
    ("h100, batch 1 and 8", HOPPER, "h100"),
    ("h200, batch 1 and 8", HOPPER, "h200"),
    ("h100, batch 64", HOPPER_LARGE, "h100"),
    ("h200, batch 64", HOPPER_LARGE, "h200"),
)


def tf32_pairs() -> dict[str, pd.DataFrame]:
    """Per pair of TF32_PAIRS, the TF32-off dataset joined to the TF32-on one: each
    measurement of the off run beside the same measurement (mode, kind, op and network) of
    the on run, columns suffixed ``_off`` and ``_on``."""
    pairs = {}
    for label, study, gpu in TF32_PAIRS:
        on = pd.read_parquet(REPO / f"{study}/{gpu}/dataset/{gpu}.parquet")
        off = pd.read_parquet(REPO / f"{study}/{gpu}-notf32/dataset/{gpu}-notf32.parquet")
        keys = ["mode", "kind", "op_id", "model_input"]
        pairs[label] = off.merge(on, on=keys, suffixes=("_off", "_on"))
    return pairs


def tf32_effect(pairs: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Whole networks measured with TF32 off against on, each pair of TF32_PAIRS: per
    network and mode, and summed up per pair and mode."""
    rows = []
    for pair, both in pairs.items():
        both = both[both["kind"] == "network"]
        for _, r in both.sort_values(["mode", "model_input"]).iterrows():
            rows.append(
                {
                    "pair": pair,
                    "mode": r["mode"],
                    "model_input": r["model_input"],
                    "time on ms": round(1e3 * r["time_s_on"], 2),
                    "time off/on": round(r["time_s_off"] / r["time_s_on"], 2),
                    "energy off/on": round(r["energy_j_off"] / r["energy_j_on"], 2),
                }
            )
    per_network = pd.DataFrame(rows)
    summary = (
        per_network.groupby(["pair", "mode"])
        .agg(
            networks=("model_input", "size"),
            time_median=("time off/on", "median"),
            time_max=("time off/on", "max"),
            energy_median=("energy off/on", "median"),
            energy_max=("energy off/on", "max"),
        )
        .reset_index()
    )
    return per_network, summary


#: Op types whose float32 kernels TF32 changes (cuDNN convolutions, cuBLAS matmuls);
#: every other op of the study runs the same kernels with TF32 on and off.
TF32_OP_TYPES = ("Conv2d", "Linear", "MultiheadAttention")


def remeasurement(pairs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The ops TF32 does not touch, measured twice per pair of TF32_PAIRS (in the TF32-on
    run and in the TF32-off run: at batch 1 and 8 on other hosts and hours apart, at batch
    64 on one host minutes apart): how far the two measurements of one
    thing lie apart, for host-bound ops (GPU utilisation under 50 % in either run) and
    GPU-busy ones. This is the measurements' own reproducibility, the floor under the
    sums, LONO and choice figures."""
    rows = []
    for pair, both in pairs.items():
        both = both[both["kind"] == "op"]
        both = both[~both["op_type_on"].str.contains("|".join(TF32_OP_TYPES))]
        busy = both[["utilization_gpu_pct_off", "utilization_gpu_pct_on"]].min(axis=1) >= 50
        for (mode, is_busy), part in both.groupby(["mode", busy]):
            time_ratio = part["time_s_off"] / part["time_s_on"]
            energy_ratio = part["energy_j_off"] / part["energy_j_on"]
            rows.append(
                {
                    "pair": pair,
                    "mode": mode,
                    "ops": "GPU-busy" if is_busy else "host-bound",
                    "n": len(part),
                    "median |time diff| %": round(100 * (time_ratio - 1).abs().median(), 1),
                    "median |energy diff| %": round(100 * (energy_ratio - 1).abs().median(), 1),
                    "median in-job time spread %": round(
                        100 * (part["sigma_time_s_on"] / part["time_s_on"]).median(), 1
                    ),
                }
            )
    return pd.DataFrame(rows)


def print_choice(name: str, networks: dict[str, pd.DataFrame], lono: list[pd.DataFrame]) -> None:
    """The choice table and its agreement counts: over all cases, where the measured best
    wins by more than CLEAR_MARGIN, and where the predictions' own lead exceeds the
    larger LONO error of the configurations (what ``opcost predict`` calls a choice not
    within the predictors' error)."""
    choice = choice_summary(networks)
    print(f"\nchoice, {name}: {len(choice)} network-mode cases")
    print(choice.to_string(index=False))
    errors = pd.concat(lono).groupby("mode")[["LONO time MAPE %", "LONO energy MAPE %"]].max()
    for what, column in (("fastest", "LONO time MAPE %"), ("least_energy", "LONO energy MAPE %")):
        agrees = choice[f"{what}_agrees"].dropna()
        clear = choice.loc[choice[f"{what}_margin"] > CLEAR_MARGIN, f"{what}_agrees"]
        sure = 100 * choice[f"{what}_predicted_margin"] > choice["mode"].map(errors[column])
        confident = choice.loc[sure, f"{what}_agrees"]
        print(
            f"{what}: predicted = measured in {int(agrees.sum())} of {len(agrees)}; "
            f"where the measured best wins by more than {CLEAR_MARGIN:.0%}: "
            f"{int(clear.sum())} of {len(clear)}; where the predicted best leads by more "
            f"than the LONO error: {int(confident.sum())} of {len(confident)}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-lono", action="store_true", help="no LONO or choice (fast)")
    parser.add_argument(
        "--time-target",
        choices=TIME_TARGETS,
        help="train every study's predictor with this train.time_target (default: its config's)",
    )
    args = parser.parse_args(argv)
    train = {"time_target": args.time_target} if args.time_target else None
    lono_networks: dict[str, pd.DataFrame] = {}
    lono_tables: dict[str, pd.DataFrame] = {}
    for name, (directory, gpu, config, ops) in STUDIES.items():
        directory = REPO / directory
        table = validation_summary(directory, gpu, REPO / ops)
        if not args.skip_lono:
            lono, lono_networks[name] = lono_summary(
                directory, gpu, REPO / config, REPO / ops, train
            )
            lono_tables[name] = lono
            table = table.merge(lono, on="mode")
        print(f"\n{name}: {directory.relative_to(REPO)}")
        print(table.to_string(index=False))
    if not args.skip_lono:
        for name, studies in CHOICES.items():
            print_choice(
                name,
                {STUDIES[s][1]: lono_networks[s] for s in studies},
                [lono_tables[s] for s in studies],
            )
    print("\nthe same op measured twice: ops TF32 does not touch, in the TF32-on and -off runs")
    pairs = tf32_pairs()
    print(remeasurement(pairs).to_string(index=False))
    per_network, summary = tf32_effect(pairs)
    print("\nTF32 off against on, whole networks (measured time and energy, off/on)")
    print(summary.to_string(index=False))
    print("\nwhere TF32 off costs more than 10 % time or energy")
    costly = (per_network["time off/on"] > 1.1) | (per_network["energy off/on"] > 1.1)
    print(per_network[costly].to_string(index=False))


if __name__ == "__main__":
    main()
