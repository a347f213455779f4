rule extract:
    output:
        ops="results/ops/{model_input}.parquet",
    log:
        "logs/extract/{model_input}.log",
    conda:
        "../../environment.yml"
    params:
        model=lambda wildcards: MODEL_INPUTS[wildcards.model_input].model,
        shape=lambda wildcards: list(MODEL_INPUTS[wildcards.model_input].shape),
        functional_ops=config["extract"]["functional_ops"],
        # A new version of what a spec records reruns extraction (opcost.spec).
        spec_version=SPEC_VERSION,
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("extract.py"),
    script:
        "../scripts/extract.py"


checkpoint unique_ops:
    input:
        ops=expand("results/ops/{model_input}.parquet", model_input=MODEL_INPUTS),
    output:
        unique=UNIQUE_OPS,
    log:
        "logs/extract/unique.log",
    conda:
        "../../environment.yml"
    params:
        # A change to the opcost modules the script uses reruns this rule.
        opcost_code=code_version("unique_ops.py"),
    script:
        "../scripts/unique_ops.py"
