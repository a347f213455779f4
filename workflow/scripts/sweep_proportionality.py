"""Iterations against total runtime of one operation (rule sweep_proportionality)."""

from opcost.sweep import (
    SweepConfig,
    fit_proportionality,
    gpu_config,
    proportionality_table,
    run_proportionality,
)

sm = snakemake  # noqa: F821 (injected by Snakemake)
record = run_proportionality(
    gpu_config(sm.wildcards.gpu, sm.params.gpu),
    sm.params.profile,
    SweepConfig.from_config(sm.params.sweep),
    sm.output.record,
)
table = proportionality_table(record)
fit = fit_proportionality(table["iterations"], table["total_time_s"])
with open(sm.log[0], "w") as log:
    log.write(
        f"{len(table)} measurements of {record['op_type']} on {record['device']}: "
        f"time per iteration {fit.time_per_iteration_s:.6g} s, sigma {fit.sigma_rel:.3g}, "
        f"proportionality breaks below {fit.threshold_s:.3g} s\n"
    )
