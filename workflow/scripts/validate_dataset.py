"""Summed operations against measured whole networks (rule validate_dataset)."""

import pandas as pd

from opcost.io import read_parquet, write_csv_atomic, write_parquet_atomic
from opcost.validate.dataset import dataset_validation, read_network_ops, validation_summary
from opcost.workflow import require_raw_logs

sm = snakemake  # noqa: F821 (injected by Snakemake)
for path in sm.input.datasets:
    require_raw_logs(path)
dataset = pd.concat([read_parquet(p) for p in sm.input.datasets], ignore_index=True)
# Each GPU configuration against the op tables its measurements were made with.
table = pd.concat(
    [
        dataset_validation(dataset[dataset["gpu"] == gpu], read_network_ops(tables))
        for gpu, tables in sm.params.ops_by_gpu.items()
    ],
    ignore_index=True,
)
write_parquet_atomic(table, sm.output.table)
write_csv_atomic(validation_summary(table), sm.output.summary)
with open(sm.log[0], "w") as log:
    all_ops = table[table["ops_included"] == "all"]
    log.write(
        f"{len(all_ops)} network comparisons, {int((~all_ops['complete']).sum())} incomplete\n"
    )
