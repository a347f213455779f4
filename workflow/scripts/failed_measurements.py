"""The failed measurements of one GPU configuration as a CSV for the report."""

from opcost.io import read_parquet, write_csv_atomic

sm = snakemake  # noqa: F821 (injected by Snakemake)
failed = read_parquet(sm.input.failed)
write_csv_atomic(failed, sm.output.table)
with open(sm.log[0], "w") as log:
    log.write(f"{len(failed)} failed measurements\n")
