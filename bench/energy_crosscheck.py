"""How well the thesis-formula energy agrees with the two independent cross-checks.

    python bench/energy_crosscheck.py [DATASET.parquet]

Default: the committed real H100 sample. Prints, over all measurements with power, the
relative difference of the NVML energy-counter energy and of the integrated power to the
formula energy E = W̄_filtered · t_tot (3.4), per iteration.
"""

import sys
from pathlib import Path

import pandas as pd

path = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/h100/dataset/h100.parquet")
d = pd.read_parquet(path).dropna(subset=["energy_j"])
rel = pd.DataFrame(
    {
        "nvml_vs_formula_pct": 100 * (d["energy_nvml_j"] / d["energy_j"] - 1),
        "integrated_vs_formula_pct": 100 * (d["energy_integrated_j"] / d["energy_j"] - 1),
    }
)
print(f"{path}: {len(d)} measurements with power, GPU {d['gpu_name'].iloc[0]}")
print(rel.describe(percentiles=[0.05, 0.5, 0.95]).round(3).to_string())
print(f"flagged low_power_samples: {int(d['low_power_samples'].sum())} of {len(d)}")
