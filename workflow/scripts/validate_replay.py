"""Networks replayed from their ops against their measured time (rule validate_replay)."""

import pandas as pd

from opcost.io import read_parquet, write_csv_atomic, write_parquet_atomic
from opcost.validate.replay import call_sequences, replay_validation

sm = snakemake  # noqa: F821 (injected by Snakemake)
dataset = pd.concat([read_parquet(p) for p in sm.input.datasets], ignore_index=True)
breakdown = pd.concat([read_parquet(p) for p in sm.input.breakdowns], ignore_index=True)
# Each GPU configuration with the call order of the op tables it was measured with.
table = pd.concat(
    [
        replay_validation(dataset[dataset["gpu"] == gpu], call_sequences(tables), breakdown)
        for gpu, tables in sm.params.ops_by_gpu.items()
    ],
    ignore_index=True,
)
write_parquet_atomic(table, sm.output.table)
write_csv_atomic(table, sm.output.summary)
with open(sm.log[0], "w") as log:
    log.write(f"{len(table)} traced networks replayed\n")
