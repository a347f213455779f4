"""Evaluate the raw logs of one GPU configuration into its dataset (rule evaluate): the
study's own, or those of an included configuration (opcost.included)."""

from opcost import included
from opcost.config import load_study
from opcost.evaluate import breakdown_table, evaluate_files, write_dataset
from opcost.io import write_parquet_atomic

sm = snakemake  # noqa: F821 (injected by Snakemake)
gpu = sm.wildcards.gpu
jsons, missing = list(sm.input.json), 0
study = load_study(sm.config, check_models=False)
for source, root in zip(study.included.get(gpu, ()), included.roots(study, gpu), strict=True):
    found, n_missing = included.raw_jsons(source, root)
    jsons += found
    missing += n_missing
dataset, failed = evaluate_files(jsons, gpu, min_power_updates=sm.params.min_power_updates)
write_dataset(dataset, failed, sm.output.dataset, sm.output.failed)
write_parquet_atomic(breakdown_table(jsons), sm.output.breakdown)
with open(sm.log[0], "w") as log:
    log.write(f"{len(dataset)} measurements, {len(failed)} failed\n")
    if missing:
        log.write(f"{missing} measurements its included study lists are not in its data\n")
