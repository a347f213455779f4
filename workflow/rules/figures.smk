# Figures (thesis 3.2.3, 3.3 and chapter 5) as PDF (thesis) and PNG (screens, report), and
# the dedicated sweep runs behind the method figures. Every figure rule runs one script
# with the figure's name; the style (config `figures`) is a parameter of the figure rules
# only, so changing it reruns nothing else.
import dataclasses

from opcost.figures import figure_targets, style_from_config
from opcost.sweep import SweepConfig, sweep_gpu

FIGURE_STYLE = dataclasses.asdict(style_from_config(config))
SWEEP = SweepConfig.from_config(config.get("sweep"))
SWEEP_GPU = sweep_gpu(STUDY, SWEEP)


# What `rule all` builds of this stage (the sweep figures need a GPU run: not there).
FIGURE_TARGETS = figure_targets(STUDY)


# --- sweeps: dedicated measurement runs on one GPU configuration ------------------------
# Their raw files are protected like the profile stage's: delete them to measure again.


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


# --- method figures (thesis 3.2.3, 3.3) -------------------------------------------------


rule figure_proportionality:
    input:
        record=f"results/sweep/{SWEEP_GPU}/proportionality.json",
    output:
        pdf="results/figures/proportionality.pdf",
        png=report(
            "results/figures/proportionality.png",
            caption="../report/proportionality.rst",
            category="Measurement method",
        ),
    log:
        "logs/figures/proportionality.log",
    conda:
        "../../environment.yml"
    params:
        figure="proportionality",
        options={},
        style=FIGURE_STYLE,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("figure.py"),
    script:
        "../scripts/figure.py"


rule figure_power_trace:
    input:
        csv=f"results/sweep/{SWEEP_GPU}/power_trace.csv",
        record=f"results/sweep/{SWEEP_GPU}/power_trace.json",
    output:
        pdf="results/figures/power_trace.pdf",
        png=report(
            "results/figures/power_trace.png",
            caption="../report/power_trace.rst",
            category="Measurement method",
        ),
    log:
        "logs/figures/power_trace.log",
    conda:
        "../../environment.yml"
    params:
        figure="power_trace",
        options={},
        style=FIGURE_STYLE,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("figure.py"),
    script:
        "../scripts/figure.py"


rule figure_startup_effect:
    input:
        csv=f"results/sweep/{SWEEP_GPU}/power_trace.csv",
        record=f"results/sweep/{SWEEP_GPU}/power_trace.json",
    output:
        pdf="results/figures/startup_effect.pdf",
        png=report(
            "results/figures/startup_effect.png",
            caption="../report/startup_effect.rst",
            category="Measurement method",
        ),
    log:
        "logs/figures/startup_effect.log",
    conda:
        "../../environment.yml"
    params:
        figure="startup_effect",
        options={},
        style=FIGURE_STYLE,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("figure.py"),
    script:
        "../scripts/figure.py"


# --- dataset validation (thesis 5.1) ----------------------------------------------------


rule figure_validation:
    input:
        validation="results/validation/dataset_validation.parquet",
    output:
        pdf="results/figures/validation_{size}.pdf",
        png=report(
            "results/figures/validation_{size}.png",
            caption="../report/validation.rst",
            category="Dataset validation",
        ),
    log:
        "logs/figures/validation_{size}.log",
    wildcard_constraints:
        size="small|large",
    conda:
        "../../environment.yml"
    params:
        figure="validation",
        options=lambda wildcards: {"size_class": wildcards.size},
        style=FIGURE_STYLE,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("figure.py"),
    script:
        "../scripts/figure.py"


rule figure_network_energy:
    input:
        validation="results/validation/dataset_validation.parquet",
    output:
        pdf="results/figures/network_energy.pdf",
        png=report(
            "results/figures/network_energy.png",
            caption="../report/network_energy.rst",
            category="Dataset validation",
        ),
    log:
        "logs/figures/network_energy.log",
    conda:
        "../../environment.yml"
    params:
        figure="network_energy",
        options={},
        style=FIGURE_STYLE,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("figure.py"),
    script:
        "../scripts/figure.py"


rule figure_settings:
    input:
        validation="results/validation/dataset_validation.parquet",
    output:
        pdf="results/figures/settings.pdf",
        png=report(
            "results/figures/settings.png",
            caption="../report/settings.rst",
            category="Dataset validation",
        ),
    log:
        "logs/figures/settings.log",
    conda:
        "../../environment.yml"
    params:
        figure="settings",
        options={},
        style=FIGURE_STYLE,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("figure.py"),
    script:
        "../scripts/figure.py"


# --- prediction accuracy (thesis 5.2) ---------------------------------------------------


rule figure_prediction_ops:
    input:
        ops="results/validation/prediction_ops.parquet",
    output:
        pdf="results/figures/prediction_ops.pdf",
        png=report(
            "results/figures/prediction_ops.png",
            caption="../report/prediction_ops.rst",
            category="Prediction accuracy",
        ),
    log:
        "logs/figures/prediction_ops.log",
    conda:
        "../../environment.yml"
    params:
        figure="prediction_ops",
        options={},
        style=FIGURE_STYLE,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("figure.py"),
    script:
        "../scripts/figure.py"


rule figure_prediction_errors:
    input:
        ops="results/validation/prediction_ops.parquet",
    output:
        pdf="results/figures/prediction_errors.pdf",
        png=report(
            "results/figures/prediction_errors.png",
            caption="../report/prediction_errors.rst",
            category="Prediction accuracy",
        ),
    log:
        "logs/figures/prediction_errors.log",
    conda:
        "../../environment.yml"
    params:
        figure="prediction_errors",
        options={},
        style=FIGURE_STYLE,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("figure.py"),
    script:
        "../scripts/figure.py"


rule figure_prediction_op_types:
    input:
        ops="results/validation/prediction_ops.parquet",
    output:
        pdf="results/figures/prediction_op_types.pdf",
        png=report(
            "results/figures/prediction_op_types.png",
            caption="../report/prediction_op_types.rst",
            category="Prediction accuracy",
        ),
    log:
        "logs/figures/prediction_op_types.log",
    conda:
        "../../environment.yml"
    params:
        figure="prediction_op_types",
        options={},
        style=FIGURE_STYLE,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("figure.py"),
    script:
        "../scripts/figure.py"


rule figure_prediction_networks:
    input:
        networks="results/validation/prediction_networks.parquet",
    output:
        pdf="results/figures/prediction_networks.pdf",
        png=report(
            "results/figures/prediction_networks.png",
            caption="../report/prediction_networks.rst",
            category="Prediction accuracy",
        ),
    log:
        "logs/figures/prediction_networks.log",
    conda:
        "../../environment.yml"
    params:
        figure="prediction_networks",
        options={},
        style=FIGURE_STYLE,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("figure.py"),
    script:
        "../scripts/figure.py"
