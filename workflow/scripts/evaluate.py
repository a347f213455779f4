"""Evaluate the raw logs of one GPU configuration into its dataset (rule evaluate)."""

from opcost.evaluate import evaluate_files, write_dataset

sm = snakemake  # noqa: F821 (injected by Snakemake)
dataset, failed = evaluate_files(
    sm.input.json, sm.wildcards.gpu, min_power_updates=sm.params.min_power_updates
)
write_dataset(dataset, failed, sm.output.dataset, sm.output.failed)
with open(sm.log[0], "w") as log:
    log.write(f"{len(dataset)} measurements, {len(failed)} failed\n")
