"""Issue #9's accuracy figures, recomputed from the committed real datasets.

    python bench/accuracy.py [--skip-lono]

For each committed study (tests/data/<name>: dataset, op tables) it prints:

- dataset validation: per mode, how many model-input sets' summed operations are within
  5 % of the measured network in time and in energy, and the median |difference|;
- leave-one-network-out (LONO) mean absolute percentage error of whole-network time and
  energy per mode, from training the study's predictor afresh (``opcost.train``, the
  defaults of ``config/config.yaml`` unless the study has its own config), which takes a
  minute or two per study on 2 cores.

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
from opcost.validate import dataset_validation, read_network_ops

REPO = Path(__file__).resolve().parents[1]
STUDIES = {
    # name: (directory, GPU configuration, study config for the train section)
    "h100 sample (4x3x64x64)": ("tests/data/h100", "h100", "config/h100-sample.yaml"),
    "h200 sample (4x3x64x64)": ("tests/data/h200", "h200", "config/h200-sample.yaml"),
    "h100 hopper (8 families x 2)": ("tests/data/hopper/h100", "h100", "config/hopper.yaml"),
}


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
            }
        )
    return pd.DataFrame(rows)


def lono_summary(directory: Path, gpu: str, config: Path) -> pd.DataFrame:
    cfg = TrainConfig.from_config(yaml.safe_load(config.read_text()).get("train") or {})
    with tempfile.TemporaryDirectory() as tmp:
        metrics = train_gpu(
            directory / "dataset" / f"{gpu}.parquet",
            _op_tables(directory),
            TrainOutputs.under(tmp),
            cfg,
            gpu,
        )
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
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-lono", action="store_true", help="validation only (fast)")
    args = parser.parse_args(argv)
    for name, (directory, gpu, config) in STUDIES.items():
        directory = REPO / directory
        table = validation_summary(directory, gpu)
        if not args.skip_lono:
            table = table.merge(lono_summary(directory, gpu, REPO / config), on="mode")
        print(f"\n{name}: {directory.relative_to(REPO)}")
        print(table.to_string(index=False))


if __name__ == "__main__":
    main()
