"""Evaluate the raw logs of one GPU configuration into its dataset (rule evaluate)."""

from opcost.evaluate import breakdown_table, evaluate_files, write_dataset
from opcost.io import write_parquet_atomic

sm = snakemake  # noqa: F821 (injected by Snakemake)
dataset, failed = evaluate_files(
    sm.input.json, sm.wildcards.gpu, min_power_updates=sm.params.min_power_updates
)
write_dataset(dataset, failed, sm.output.dataset, sm.output.failed)
write_parquet_atomic(breakdown_table(sm.input.json), sm.output.breakdown)
with open(sm.log[0], "w") as log:
    log.write(f"{len(dataset)} measurements, {len(failed)} failed\n")
