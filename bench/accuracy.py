"""Issue #9's accuracy figures, recomputed from the committed real datasets.

    python bench/accuracy.py [--skip-lono]

For each committed study (tests/data/<name>: dataset, op tables) it prints:

- dataset validation: per mode, how many model-input sets' summed operations are within
  5 % of the measured network in time and in energy, and the median |difference|; the
  same for GPU-busy time (time x nvidia-smi's utilisation: the GPU's share of the time,
  ``gpu_busy_rel_diff`` of ``opcost.validate.dataset_validation``), within 10 %;
- leave-one-network-out (LONO) mean absolute percentage error of whole-network time and
  energy per mode, from training the study's predictor afresh (``opcost.train``, the
  defaults of ``config/config.yaml`` unless the study has its own config), which takes a
  minute or two per study on 2 cores;
- choice: for studies measured on two GPU configurations, per network and mode, whether
  the LONO predictions name the configuration the measurements show fastest, and the one
  using least energy (``opcost.validate.configuration_choice``), and the share of cases
  where they agree, over all cases and over those where the measured best wins by more
  than 10 %;
- the measured effect of TF32 on whole networks, from the partial TF32-off runs.

The README's accuracy table is what this prints (with GPU and date from each study's
README).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from opcost.train import TrainConfig, TrainOutputs, train_gpu
from opcost.validate import (
    configuration_choice,
    dataset_validation,
    prediction_networks,
    read_network_ops,
)

REPO = Path(__file__).resolve().parents[1]
STUDIES = {
    # name: (directory, GPU configuration, study config for the train section)
    "h100 sample (4x3x64x64)": ("tests/data/h100", "h100", "config/h100-sample.yaml"),
    "h200 sample (4x3x64x64)": ("tests/data/h200", "h200", "config/h200-sample.yaml"),
    "h100 hopper (8 families x 2)": ("tests/data/hopper/h100", "h100", "config/hopper.yaml"),
    "h200 hopper (8 families x 2)": ("tests/data/hopper/h200", "h200", "config/hopper.yaml"),
}
#: Studies of one set of networks on two GPU configurations: the choice between them.
CHOICES = {
    "sample 4x3x64x64, h100 vs h200": ("h100 sample (4x3x64x64)", "h200 sample (4x3x64x64)"),
    "hopper, h100 vs h200": ("h100 hopper (8 families x 2)", "h200 hopper (8 families x 2)"),
}
#: A measured best that beats the runner-up by less than this is within the run-to-run
#: spread of host-bound measurements (docs/validation.md): the choice is printed for
#: all cases and for those beyond it.
CLEAR_MARGIN = 0.10


def _op_tables(directory: Path) -> list[Path]:
    return sorted(p for p in (directory / "ops").glob("*.parquet") if p.name != "unique.parquet")


def validation_summary(directory: Path, gpu: str) -> pd.DataFrame:
    dataset = pd.read_parquet(directory / "dataset" / f"{gpu}.parquet")
    table = dataset_validation(dataset, read_network_ops(_op_tables(directory)))
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
            }
        )
    return pd.DataFrame(rows)


def lono_summary(directory: Path, gpu: str, config: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The LONO table per mode, and the per-network LONO predictions."""
    cfg = TrainConfig.from_config(yaml.safe_load(config.read_text()).get("train") or {})
    with tempfile.TemporaryDirectory() as tmp:
        outputs = TrainOutputs.under(tmp)
        metrics = train_gpu(
            directory / "dataset" / f"{gpu}.parquet",
            _op_tables(directory),
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


def tf32_effect() -> pd.DataFrame:
    """Whole networks measured with TF32 off (tests/data/hopper/notf32_partial) against on."""
    rows = []
    for gpu in ("h100", "h200"):
        on = pd.read_parquet(REPO / f"tests/data/hopper/{gpu}/dataset/{gpu}.parquet")
        off = pd.read_parquet(
            REPO / f"tests/data/hopper/notf32_partial/dataset/{gpu}-notf32.parquet"
        )
        keys = ["mode", "model_input"]
        both = off[off["kind"] == "network"].merge(
            on[on["kind"] == "network"], on=keys, suffixes=("_off", "_on")
        )
        for _, r in both.sort_values(keys).iterrows():
            rows.append(
                {
                    "gpu": gpu,
                    "mode": r["mode"],
                    "model_input": r["model_input"],
                    "time on ms": round(1e3 * r["time_s_on"], 2),
                    "time off/on": round(r["time_s_off"] / r["time_s_on"], 2),
                    "energy off/on": round(r["energy_j_off"] / r["energy_j_on"], 2),
                }
            )
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-lono", action="store_true", help="validation only (fast)")
    args = parser.parse_args(argv)
    lono_networks: dict[str, pd.DataFrame] = {}
    for name, (directory, gpu, config) in STUDIES.items():
        directory = REPO / directory
        table = validation_summary(directory, gpu)
        if not args.skip_lono:
            lono, lono_networks[name] = lono_summary(directory, gpu, REPO / config)
            table = table.merge(lono, on="mode")
        print(f"\n{name}: {directory.relative_to(REPO)}")
        print(table.to_string(index=False))
    if args.skip_lono:
        return
    for name, studies in CHOICES.items():
        choice = choice_summary({STUDIES[s][1]: lono_networks[s] for s in studies})
        print(f"\nchoice, {name}: {len(choice)} network-mode cases")
        print(choice.to_string(index=False))
        for what in ("fastest", "least_energy"):
            agrees = choice[f"{what}_agrees"].dropna()
            clear = choice.loc[choice[f"{what}_margin"] > CLEAR_MARGIN, f"{what}_agrees"]
            print(
                f"{what}: predicted = measured in {int(agrees.sum())} of {len(agrees)}; "
                f"where the measured best wins by more than {CLEAR_MARGIN:.0%}: "
                f"{int(clear.sum())} of {len(clear)}"
            )
    print("\nTF32 off against on, whole networks measured in both (off: a partial run)")
    print(tf32_effect().to_string(index=False))


if __name__ == "__main__":
    main()
