# The dedicated sweep runs behind the method figures (thesis 3.2.3, 3.3): measurements on
# one GPU configuration (config `sweep`; opcost.sweep). Their raw files are
# protected like the profile stage's: delete them to measure again. They take no code
# version: raw measurements are ground truth.
import dataclasses

from opcost.sweep_record import SweepConfig

SWEEP = SweepConfig.from_config(config.get("sweep"))


rule sweep_proportionality:
    output:
        record=protected("results/sweep/{gpu}/proportionality.json"),
    log:
        "logs/sweep/{gpu}/proportionality.log",
    conda:
        "../../environment.yml"
    resources:
        gpu=1,
        gpu_model=get_slurm_gpu_model,
    params:
        sweep=dataclasses.asdict(SWEEP),
        gpu=lambda wildcards: wf.gpu_params(STUDY, wildcards.gpu),
        profile=config["profile"],
    script:
        "../scripts/sweep_proportionality.py"


rule sweep_power_trace:
    output:
        csv=protected("results/sweep/{gpu}/power_trace.csv"),
        record=protected("results/sweep/{gpu}/power_trace.json"),
    log:
        "logs/sweep/{gpu}/power_trace.log",
    conda:
        "../../environment.yml"
    resources:
        gpu=1,
        gpu_model=get_slurm_gpu_model,
    params:
        sweep=dataclasses.asdict(SWEEP),
        gpu=lambda wildcards: wf.gpu_params(STUDY, wildcards.gpu),
        profile=config["profile"],
    script:
        "../scripts/sweep_power_trace.py"
