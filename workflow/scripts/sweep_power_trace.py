"""Power over alternating idle and benchmark runs (rule sweep_power_trace)."""

from opcost.sweep import SweepConfig, gpu_config, run_power_trace

sm = snakemake  # noqa: F821 (injected by Snakemake)
record = run_power_trace(
    gpu_config(sm.wildcards.gpu, sm.params.gpu),
    sm.params.profile,
    SweepConfig.from_config(sm.params.sweep),
    sm.output.csv,
    sm.output.record,
)
with open(sm.log[0], "w") as log:
    runs = [e for e in record["events"] if e["phase"] == "run"]
    log.write(
        f"{len(runs)} runs of {record['op_type']} on {record['device']}, "
        f"power logged: {record.get('power_available', False)}\n"
    )
