rule extract:
    output:
        ops="results/ops/{model_input}.parquet",
    params:
        model=lambda wildcards: MODEL_INPUTS[wildcards.model_input].model,
        shape=lambda wildcards: list(MODEL_INPUTS[wildcards.model_input].shape),
        functional_ops=config["extract"]["functional_ops"],
    log:
        "logs/extract/{model_input}.log",
    script:
        "../scripts/extract.py"


checkpoint unique_ops:
    input:
        ops=expand("results/ops/{model_input}.parquet", model_input=MODEL_INPUTS),
    output:
        unique="results/ops/unique.parquet",
    log:
        "logs/extract/unique.log",
    script:
        "../scripts/unique_ops.py"
