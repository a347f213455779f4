"""Extract the operations of one model-input set (rule extract)."""

from opcost.extract import extract_model_input
from opcost.io import write_parquet_atomic
from opcost.names import ModelInput

sm = snakemake  # noqa: F821 (injected by Snakemake)
table = extract_model_input(
    ModelInput(sm.params.model, tuple(sm.params.shape)), functional_ops=sm.params.functional_ops
)
write_parquet_atomic(table, sm.output.ops)
with open(sm.log[0], "w") as log:
    log.write(f"{len(table)} distinct operations, {int(table['count'].sum())} calls\n")
