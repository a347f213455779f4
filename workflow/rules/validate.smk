# Validation (thesis chapter 5): summed operations against measured whole networks, and
# predictions against measurements. Tables under results/validation/; the figures that
# show them are in figures.smk. No rule here takes the figure style, so restyling a
# figure reruns only the figure rules.


rule validate_dataset:
    input:
        datasets=expand("results/dataset/{gpu}.parquet", gpu=STUDY.evaluated_gpus),
        ops=ALL_OP_TABLES,
    output:
        table="results/validation/dataset_validation.parquet",
        summary=report(
            "results/validation/dataset_validation.csv",
            caption="../report/dataset_validation.rst",
            category="Dataset validation",
        ),
    log:
        "logs/validate/dataset.log",
    conda:
        "../../environment.yml"
    params:
        ops_by_gpu=OP_TABLES_BY_GPU,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("validate_dataset.py"),
    script:
        "../scripts/validate_dataset.py"


# Networks replayed from their ops on a host thread and a GPU stream (opcost.replay),
# beside the thesis's plain sum: configurations with traces only (CUDA).
rule validate_replay:
    input:
        datasets=expand("results/dataset/{gpu}.parquet", gpu=STUDY.evaluated_gpus),
        breakdowns=expand(
            "results/dataset/{gpu}.breakdown.parquet", gpu=STUDY.evaluated_gpus
        ),
        ops=ALL_OP_TABLES,
    output:
        table="results/validation/replay.parquet",
        summary=report(
            "results/validation/replay.csv",
            caption="../report/replay_table.rst",
            category="Dataset validation",
        ),
    log:
        "logs/validate/replay.log",
    conda:
        "../../environment.yml"
    params:
        ops_by_gpu=OP_TABLES_BY_GPU,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("validate_replay.py"),
    script:
        "../scripts/validate_replay.py"


rule validate_predictions:
    input:
        holdout=expand(
            "results/predictors/{gpu}/holdout_predictions.parquet",
            gpu=STUDY.evaluated_gpus,
        ),
        networks=expand(
            "results/predictors/{gpu}/network_predictions.parquet",
            gpu=STUDY.evaluated_gpus,
        ),
    output:
        ops="results/validation/prediction_ops.parquet",
        networks="results/validation/prediction_networks.parquet",
        metrics="results/validation/prediction_metrics.parquet",
        summary=report(
            "results/validation/prediction_metrics.csv",
            caption="../report/prediction_metrics.rst",
            category="Prediction accuracy",
        ),
    log:
        "logs/validate/predictions.log",
    conda:
        "../../environment.yml"
    params:
        # The network predictions name their GPU configuration by path only.
        gpus=list(STUDY.evaluated_gpus),
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("validate_predictions.py"),
    script:
        "../scripts/validate_predictions.py"
