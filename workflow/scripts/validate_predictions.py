"""Prediction errors at the operation and network level (rule validate_predictions)."""

from opcost.io import read_parquet, write_csv_atomic, write_parquet_atomic
from opcost.validate.predictions import prediction_metrics, prediction_networks, prediction_ops

sm = snakemake  # noqa: F821 (injected by Snakemake)
ops = prediction_ops(read_parquet(p) for p in sm.input.holdout)
networks = prediction_networks(
    {gpu: read_parquet(p) for gpu, p in zip(sm.params.gpus, sm.input.networks, strict=True)}
)
metrics = prediction_metrics(ops, networks)
write_parquet_atomic(ops, sm.output.ops)
write_parquet_atomic(networks, sm.output.networks)
write_parquet_atomic(metrics, sm.output.metrics)
write_csv_atomic(metrics.round(4), sm.output.summary)
with open(sm.log[0], "w") as log:
    log.write(f"{len(ops)} held-out operations, {len(networks)} network predictions\n")
