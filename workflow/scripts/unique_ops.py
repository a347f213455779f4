"""Every distinct operation of the study (checkpoint unique_ops)."""

import pandas as pd

from opcost.extract import unique_ops
from opcost.io import write_parquet_atomic

sm = snakemake  # noqa: F821 (injected by Snakemake)
table = unique_ops([pd.read_parquet(path) for path in sm.input.ops])
write_parquet_atomic(table, sm.output.unique)
with open(sm.log[0], "w") as log:
    log.write(f"{len(table)} distinct operations in {len(sm.input.ops)} model-input sets\n")
